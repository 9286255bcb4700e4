//! SLA search: the highest request rate whose SLO attainment stays at a target, by bracketing
//! (doubling up from the lowest rate until a probe fails) then bisecting in log space. Pure:
//! the caller runs each probe and feeds back its attainment.

/// Bounds and stopping rule of a search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchSpace {
    /// Lowest rate to try, requests per second.
    pub min_rate: f64,
    /// Highest rate to try.
    pub max_rate: f64,
    /// Attainment a rate must reach to pass (0..1).
    pub target_attainment: f64,
    /// Stop when failing rate / passing rate ≤ this.
    pub precision: f64,
    /// Most probes.
    pub max_probes: usize,
}

/// One measured rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// Requests per second.
    pub rate: f64,
    /// Share of requests that met every SLO.
    pub attainment: f64,
}

/// The next rate to probe, or `None` when the search is done.
pub fn next_probe(space: &SearchSpace, probes: &[Probe]) -> Option<f64> {
    if probes.len() >= space.max_probes {
        return None;
    }
    let pass = |p: &&Probe| p.attainment >= space.target_attainment;
    let best_pass = probes
        .iter()
        .filter(pass)
        .map(|p| p.rate)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let lowest_fail = probes
        .iter()
        .filter(|p| !pass(p) && best_pass.is_none_or(|b| p.rate > b))
        .map(|p| p.rate)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.min(r))));
    match (best_pass, lowest_fail) {
        (None, None) => Some(space.min_rate),
        // The lowest rate already fails: nothing below to find.
        (None, Some(_)) => None,
        (Some(p), None) if p >= space.max_rate => None,
        (Some(p), None) => Some((p * 2.0).min(space.max_rate)),
        (Some(p), Some(f)) if f / p <= space.precision => None,
        (Some(p), Some(f)) => Some((p * f).sqrt()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(capacity: f64) -> (Option<f64>, usize) {
        let space = SearchSpace {
            min_rate: 0.5,
            max_rate: 100.0,
            target_attainment: 0.9,
            precision: 1.05,
            max_probes: 30,
        };
        let mut probes = Vec::new();
        while let Some(rate) = next_probe(&space, &probes) {
            let attainment = if rate <= capacity { 0.99 } else { 0.2 };
            probes.push(Probe { rate, attainment });
        }
        let best = probes
            .iter()
            .filter(|p| p.attainment >= 0.9)
            .map(|p| p.rate)
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        (best, probes.len())
    }

    #[test]
    fn finds_the_capacity_within_the_precision() {
        let (best, probes) = search(7.3);
        let best = best.unwrap();
        assert!((7.3 / 1.05..=7.3).contains(&best), "{best}");
        assert!(probes <= 12, "{probes} probes");
    }

    #[test]
    fn stops_at_the_bounds() {
        assert_eq!(search(0.1).0, None, "even the lowest rate fails");
        assert_eq!(search(1000.0).0, Some(100.0), "the highest rate passes");
    }
}
