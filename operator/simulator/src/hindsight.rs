//! The hindsight references: what holding every window costs a policy that knows the trace.
//!
//! The offline bound ([`super::calibrate::bound`]) sizes each window for its mean arrival rate
//! at the replicas' Poisson capacity, with pods that start instantly. No policy can reach it
//! where arrivals come in bursts shorter than a window, or where a pod takes longer to start
//! than the load takes to rise. These references measure that gap with runs, not a model:
//!
//! - per window, the fewest static replicas whose run on the same trace meets that window
//!   (the window's *need*; the maximum where none does);
//! - `hindsight` asks, at every tick, for the need of the current window and of the window one
//!   pod start ahead: it knows the future, so its pods are ready when a rise begins. A window
//!   the schedule still misses (a backlog left by the window before, a scale-down at its
//!   start) gets one more replica, or the window before it does where it is at the maximum,
//!   and the run is repeated until every window is met or nothing is left to add
//!   ([`REPAIRS`] rounds at most): the cheapest schedule this greedy search finds that holds;
//! - `hindsight-no-lead` asks only for the current window's need, from the window's first
//!   tick: a detector that is perfect and instant, held back only by the pod start. A window it
//!   misses is one that no policy holds without replicas bought before the load is seen.
//!
//! They are references for the comparison table, not policies to deploy.

use super::compare::{Calibration, PolicyName, run_one};
use super::policy::{Move, Policy, with_replicas};
use super::prom::Seen;
use super::trace::Trace;
use super::{SimConfig, SimError};
use pacer_planner::Levers;

/// Seconds between the references' evaluations (finer than any policy's, so a boundary is met
/// within a tick).
pub const INTERVAL: f64 = 5.0;

/// Rounds of repair at most.
pub const REPAIRS: usize = 12;

/// Per scoring window of `trace`, the fewest static replicas meeting it (each static run
/// starts at its size, as in the comparison).
pub fn needs(config: &SimConfig, trace: &Trace, cal: &Calibration) -> Result<Vec<i32>, SimError> {
    let (min, max) = (config.spec.min_replicas, config.spec.max_replicas);
    let mut need: Vec<Option<i32>> = Vec::new();
    for n in min..=max {
        let o = run_one(config, trace, &PolicyName::Static(n), cal)?;
        if need.len() < o.timeline.len() {
            need.resize(o.timeline.len(), None);
        }
        for (k, w) in o.timeline.iter().enumerate() {
            if w.met && need[k].is_none() {
                need[k] = Some(n);
            }
        }
        if need.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(need.into_iter().map(|n| n.unwrap_or(max)).collect())
}

/// [`needs`], raised window by window until the `hindsight` run on them meets every window
/// (or nothing is left to raise; [`REPAIRS`] rounds at most).
pub fn repaired(
    config: &SimConfig,
    trace: &Trace,
    cal: &Calibration,
    run: impl Fn(&[i32]) -> Result<Vec<bool>, SimError>,
) -> Result<Vec<i32>, SimError> {
    let max = config.spec.max_replicas;
    let mut need = needs(config, trace, cal)?;
    for _ in 0..REPAIRS {
        let met = run(&need)?;
        let mut raised = false;
        let missed: Vec<usize> =
            met.iter().enumerate().filter(|(k, m)| !**m && *k < need.len()).map(|(k, _)| k).collect();
        for k in missed {
            if need[k] < max {
                need[k] += 1;
                raised = true;
            } else if k > 0 && need[k - 1] < max {
                need[k - 1] += 1;
                raised = true;
            }
        }
        if !raised {
            break;
        }
    }
    Ok(need)
}

/// A replica schedule from per-window needs.
#[derive(Debug, Clone)]
pub struct Hindsight {
    need: Vec<i32>,
    window: f64,
    lead: f64,
}

impl Hindsight {
    /// Asks for the need of the window `lead` seconds ahead as well as the current one.
    pub fn new(need: Vec<i32>, window: f64, lead: f64) -> Hindsight {
        Hindsight { need, window, lead }
    }

    /// The replicas asked for at `now`.
    pub fn desired(&self, now: f64) -> i32 {
        let at = |t: f64| {
            let k = (t / self.window).floor().max(0.0) as usize;
            self.need.get(k.min(self.need.len().saturating_sub(1))).copied().unwrap_or(1)
        };
        // A tick on a boundary belongs to the window it opens.
        let now = now + 1e-9;
        at(now).max(at(now + self.lead))
    }
}

impl Policy for Hindsight {
    fn name(&self) -> String {
        if self.lead > 0.0 { "hindsight".into() } else { "hindsight-no-lead".into() }
    }
    fn interval(&self) -> f64 {
        INTERVAL
    }
    fn evaluate(&mut self, now: f64, _seen: &Seen, current: &Levers) -> Move {
        with_replicas(current, self.desired(now), "the window's need, known in advance")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_a_lead_the_replicas_are_asked_for_before_the_window_that_needs_them() {
        let h = Hindsight::new(vec![1, 1, 3, 2], 60.0, 25.0);
        assert_eq!(h.desired(30.0), 1);
        assert_eq!(h.desired(95.0), 3, "25 s ahead of the third window");
        assert_eq!(h.desired(120.0), 3);
        assert_eq!(h.desired(180.0), 2, "down at the boundary, not before");
        assert_eq!(h.desired(600.0), 2, "past the end: the last window's need");
        let late = Hindsight::new(vec![1, 1, 3, 2], 60.0, 0.0);
        assert_eq!(late.desired(115.0), 1, "no lead: nothing before the window opens");
        assert_eq!(late.desired(120.0), 3, "a tick on the boundary belongs to the new window");
        assert_eq!(late.name(), "hindsight-no-lead");
    }
}
