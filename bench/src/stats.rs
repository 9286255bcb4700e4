//! Bootstrap confidence intervals for tail percentiles, and the A/B comparison of two runs.

use crate::load::Rng;
use crate::metrics::{RequestRecord, percentile};
use serde::Serialize;

/// Percentile `q` of `values` without sorting them all (selection), linear interpolation.
fn select_percentile(values: &mut [f64], q: f64) -> f64 {
    let n = values.len();
    let rank = q / 100.0 * (n - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (_, &mut a, rest) = values.select_nth_unstable_by(lo, f64::total_cmp);
    let b = if hi > lo { rest.iter().copied().fold(f64::INFINITY, f64::min) } else { a };
    a + (b - a) * (rank - lo as f64)
}

/// 95 % bootstrap interval of percentile `q` of `samples` (`iterations` resamples).
pub fn percentile_ci(samples: &[f64], q: f64, iterations: usize, rng: &mut Rng) -> Option<(f64, f64)> {
    if samples.len() < 2 {
        return None;
    }
    let n = samples.len();
    let mut draws = Vec::with_capacity(iterations);
    let mut buf = vec![0.0; n];
    for _ in 0..iterations {
        for b in buf.iter_mut() {
            *b = samples[(rng.uniform() * n as f64) as usize % n];
        }
        draws.push(select_percentile(&mut buf, q));
    }
    draws.sort_by(f64::total_cmp);
    Some((percentile(&draws, 2.5)?, percentile(&draws, 97.5)?))
}

/// One metric of an A/B comparison (milliseconds).
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    /// `ttft`, `tpot`, `itl` or `e2el`.
    pub metric: &'static str,
    /// Percentile compared.
    pub percentile: f64,
    /// A's value.
    pub a: f64,
    /// B's value.
    pub b: f64,
    /// 95 % bootstrap interval of B − A.
    pub ci: (f64, f64),
    /// Whether the interval excludes zero.
    pub significant: bool,
    /// Samples in A and B.
    pub n: (usize, usize),
}

fn samples(records: &[RequestRecord], metric: &str) -> Vec<f64> {
    let ok = records.iter().filter(|r| r.ok());
    let ms: Vec<f64> = match metric {
        "ttft" => ok.filter_map(RequestRecord::ttft).collect(),
        "tpot" => ok.filter_map(RequestRecord::tpot).collect(),
        "itl" => ok.flat_map(|r| r.itls().collect::<Vec<_>>()).collect(),
        _ => ok.filter_map(RequestRecord::e2e).collect(),
    };
    ms.into_iter().map(|s| s * 1e3).collect()
}

/// Compares runs A and B at P50 and P95 of each latency; B − A with a bootstrap interval of
/// the difference (each run resampled independently).
pub fn compare(a: &[RequestRecord], b: &[RequestRecord], iterations: usize, seed: u64) -> Vec<Difference> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        let (mut sa, mut sb) = (samples(a, metric), samples(b, metric));
        if sa.len() < 2 || sb.len() < 2 {
            continue;
        }
        for q in [50.0, 95.0] {
            let (va, vb) = (select_percentile(&mut sa.clone(), q), select_percentile(&mut sb.clone(), q));
            let mut diffs = Vec::with_capacity(iterations);
            let (mut ra, mut rb) = (vec![0.0; sa.len()], vec![0.0; sb.len()]);
            for _ in 0..iterations {
                for x in ra.iter_mut() {
                    *x = sa[(rng.uniform() * sa.len() as f64) as usize % sa.len()];
                }
                for x in rb.iter_mut() {
                    *x = sb[(rng.uniform() * sb.len() as f64) as usize % sb.len()];
                }
                diffs.push(select_percentile(&mut rb, q) - select_percentile(&mut ra, q));
            }
            diffs.sort_by(f64::total_cmp);
            let ci =
                (percentile(&diffs, 2.5).unwrap_or(f64::NAN), percentile(&diffs, 97.5).unwrap_or(f64::NAN));
            out.push(Difference {
                metric,
                percentile: q,
                a: va,
                b: vb,
                ci,
                significant: ci.0 > 0.0 || ci.1 < 0.0,
                n: (sa.len(), sb.len()),
            });
        }
        sa.clear();
        sb.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ttft: f64) -> RequestRecord {
        RequestRecord {
            sent: 0.0,
            content_events: vec![ttft, ttft + 0.01, ttft + 0.02],
            output_tokens: 3,
            ..Default::default()
        }
    }

    #[test]
    fn selection_matches_the_sorted_percentile() {
        let mut rng = Rng::new(9);
        let v: Vec<f64> = (0..101).map(|_| rng.uniform()).collect();
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        for q in [0.0, 37.5, 50.0, 95.0, 99.0, 100.0] {
            assert!((select_percentile(&mut v.clone(), q) - percentile(&sorted, q).unwrap()).abs() < 1e-12);
        }
    }

    #[test]
    fn the_interval_covers_the_true_percentile() {
        let mut rng = Rng::new(4);
        let v: Vec<f64> = (0..2000).map(|_| rng.uniform()).collect();
        let (lo, hi) = percentile_ci(&v, 95.0, 400, &mut rng).unwrap();
        assert!(lo < 0.95 && 0.95 < hi && hi - lo < 0.03, "({lo}, {hi})");
    }

    #[test]
    fn a_real_shift_is_significant_and_noise_is_not() {
        let mut rng = Rng::new(2);
        let a: Vec<RequestRecord> = (0..300).map(|_| rec(0.1 + 0.02 * rng.uniform())).collect();
        let same: Vec<RequestRecord> = (0..300).map(|_| rec(0.1 + 0.02 * rng.uniform())).collect();
        let slower: Vec<RequestRecord> = (0..300).map(|_| rec(0.115 + 0.02 * rng.uniform())).collect();
        let ttft50 =
            |d: Vec<Difference>| d.into_iter().find(|x| x.metric == "ttft" && x.percentile == 50.0).unwrap();
        assert!(!ttft50(compare(&a, &same, 500, 1)).significant);
        let d = ttft50(compare(&a, &slower, 500, 1));
        assert!(d.significant && (d.b - d.a - 15.0).abs() < 3.0, "{d:?}");
    }
}
