//! TTFT's percentile as the percentile of a sum. A request waits for a slot, then behind other
//! prompts for the step's token budget, then prefills its own prompt; the three are close to
//! independent. The percentile of their sum is well below the sum of their percentiles when
//! both a wait and the prompt lengths spread: a long prompt rarely meets the longest wait.
//! Adding percentiles made the model's TTFT rise with load far faster than the engines' did
//! where long prompts set the floor (the `chat-sessions` trace: predicted 1.11 s at 3 replicas,
//! 0.73 s observed), which asked for replicas that changed little.
//!
//! - Each wait has an exponential tail with an atom at zero, `P(W > t) = p·e^(−θt)` (Erlang C
//!   for the slots, M/M/1 for the prefill work); the tail of their sum is exact.
//! - Prompt lengths are log-normal, fitted to the mean and the length at the SLA percentile,
//!   and integrated on a fixed grid of quantiles, finer towards the top.
//! - The percentile of the sum is found by bisection on its tail.

use std::sync::OnceLock;

/// A waiting time's tail: `P(W > t) = p·e^(−rate·t)` (`p` = the chance of waiting at all).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wait {
    /// The chance of waiting at all, 0..1.
    pub p: f64,
    /// The tail's decay, per second.
    pub rate: f64,
}

impl Wait {
    /// No wait.
    pub const NONE: Wait = Wait { p: 0.0, rate: 1.0 };

    fn tail(&self, t: f64) -> f64 {
        if self.p <= 0.0 { 0.0 } else { self.p * (-self.rate * t).exp() }
    }
}

/// `P(A + B > t)` for two independent waits, `t` ≥ 0.
pub fn tail_of_sum(a: Wait, b: Wait, t: f64) -> f64 {
    if a.p <= 0.0 {
        return b.tail(t);
    }
    if b.p <= 0.0 {
        return a.tail(t);
    }
    // Both wait with chance a.p·b.p: the sum of two exponentials (hypoexponential).
    let both = {
        let (x, y) = (a.rate, b.rate);
        if (x - y).abs() <= 1e-9 * x.max(y) {
            (1.0 + x * t) * (-x * t).exp()
        } else {
            (y * (-x * t).exp() - x * (-y * t).exp()) / (y - x)
        }
    };
    a.p * (1.0 - b.p) * (-a.rate * t).exp() + b.p * (1.0 - a.p) * (-b.rate * t).exp() + a.p * b.p * both
}

/// Prompt lengths: a log-normal distribution with a given mean and a given length at a
/// quantile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lengths {
    mu: f64,
    sigma: f64,
}

impl Lengths {
    /// The log-normal whose mean is `mean` and whose `quantile` is `at` (clamped: lengths at the
    /// quantile below the mean give every prompt the mean; a spread wider than a log-normal
    /// can reach at that mean keeps the widest).
    pub fn fit(mean: f64, at: f64, quantile: f64) -> Lengths {
        let mean = mean.max(1.0);
        let z = normal_quantile(quantile.clamp(0.5, 0.999_999));
        let r = (at.max(mean) / mean).ln();
        // ln(at / mean) = z·σ − σ²/2; the smaller root is the spread, z the largest.
        let sigma = if z * z >= 2.0 * r { z - (z * z - 2.0 * r).sqrt() } else { z };
        Lengths { mu: mean.ln() - sigma * sigma / 2.0, sigma }
    }

    /// The length at quantile `u`.
    pub fn at(&self, u: f64) -> f64 {
        (self.mu + self.sigma * normal_quantile(u)).exp()
    }

    fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        grid().iter().map(|&(z, w)| ((self.mu + self.sigma * z).exp(), w))
    }
}

/// The `quantile` of `wait_a + wait_b + prefill(L)` with `L` drawn from `lengths`; `prefill`
/// must not decrease with the length.
pub fn quantile_of_sum(
    a: Wait,
    b: Wait,
    lengths: &Lengths,
    prefill: impl Fn(f64) -> f64,
    quantile: f64,
) -> f64 {
    let tail = (1.0 - quantile).clamp(1e-9, 1.0);
    let points: Vec<(f64, f64)> = lengths.points().map(|(x, w)| (prefill(x), w)).collect();
    let exceeds = |t: f64| -> f64 {
        points.iter().map(|&(own, w)| w * if own > t { 1.0 } else { tail_of_sum(a, b, t - own) }).sum()
    };
    let mut lo = 0.0;
    let mut hi = points.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3);
    while exceeds(hi) > tail && hi < 1e7 {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if exceeds(mid) > tail {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-5 * hi {
            break;
        }
    }
    hi
}

/// The points the prompt lengths are integrated on: (standard normal quantile, probability),
/// bins of 5 % up to the median, narrowing to 0.01 % in the top 0.1 %, where the percentiles
/// the SLA names live.
fn grid() -> &'static [(f64, f64)] {
    static GRID: OnceLock<Vec<(f64, f64)>> = OnceLock::new();
    GRID.get_or_init(|| {
        let mut edges = Vec::new();
        let mut push = |from: f64, to: f64, width: f64| {
            let n = ((to - from) / width).round() as usize;
            for i in 0..n {
                edges.push(from + width * i as f64);
            }
        };
        push(0.0, 0.5, 0.05);
        push(0.5, 0.9, 0.02);
        push(0.9, 0.99, 0.002);
        push(0.99, 0.999, 0.0005);
        push(0.999, 1.0, 0.0001);
        edges.push(1.0);
        edges.windows(2).map(|e| (normal_quantile(0.5 * (e[0] + e[1])), e[1] - e[0])).collect()
    })
}

/// The standard normal distribution's quantile (Acklam's rational approximation, relative
/// error below 1.2e-9), `p` in (0, 1).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] =
        [7.784_695_709_041_462e-3, 3.224_671_290_700_398e-1, 2.445_134_137_142_996, 3.754_408_661_907_416];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let low = 0.024_25;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < low {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - low {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_quantile_matches_known_values() {
        for (p, z) in [
            (0.5, 0.0),
            (0.95, 1.644_853_626_951_472_2),
            (0.99, 2.326_347_874_040_841),
            (0.01, -2.326_347_874_040_841),
        ] {
            assert!((normal_quantile(p) - z).abs() < 1e-8, "{p}: {}", normal_quantile(p));
        }
    }

    #[test]
    fn the_fitted_lengths_have_the_mean_and_the_quantile_asked_for() {
        let l = Lengths::fit(800.0, 2000.0, 0.95);
        assert!((l.at(0.95) - 2000.0).abs() < 1e-6, "{l:?}");
        let mean: f64 = l.points().map(|(x, w)| x * w).sum();
        assert!((mean / 800.0 - 1.0).abs() < 0.02, "{mean}");
        let weights: f64 = grid().iter().map(|g| g.1).sum();
        assert!((weights - 1.0).abs() < 1e-12);
        // A quantile at the mean: every prompt is the mean.
        let fixed = Lengths::fit(300.0, 300.0, 0.95);
        assert!((fixed.at(0.01) - 300.0).abs() < 1e-9 && (fixed.at(0.99) - 300.0).abs() < 1e-9);
    }

    #[test]
    fn the_tail_of_a_sum_of_waits_is_exact() {
        let a = Wait { p: 1.0, rate: 2.0 };
        let b = Wait { p: 1.0, rate: 3.0 };
        // Two exponentials, rates 2 and 3: P(sum > t) = 3e^(−2t) − 2e^(−3t).
        for t in [0.0, 0.1, 0.5, 2.0] {
            let want = 3.0 * (-2.0f64 * t).exp() - 2.0 * (-3.0f64 * t).exp();
            assert!((tail_of_sum(a, b, t) - want).abs() < 1e-12, "{t}");
        }
        let same = tail_of_sum(a, Wait { p: 1.0, rate: 2.0 }, 1.0);
        assert!((same - 3.0 * (-2.0f64).exp()).abs() < 1e-12);
        assert_eq!(tail_of_sum(Wait::NONE, Wait::NONE, 0.5), 0.0);
        assert!((tail_of_sum(Wait { p: 0.3, rate: 2.0 }, Wait::NONE, 0.0) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn the_percentile_of_the_sum_lies_between_the_largest_part_and_the_sum_of_parts() {
        let lengths = Lengths::fit(800.0, 2000.0, 0.95);
        let prefill = |x: f64| x * 0.00035;
        // Without a wait: the prompt's own percentile.
        let alone = quantile_of_sum(Wait::NONE, Wait::NONE, &lengths, prefill, 0.95);
        assert!((alone / prefill(2000.0) - 1.0).abs() < 0.01, "{alone}");
        // A wait that happens a third of the time, P95 of it alone 0.5 s.
        let wait = Wait { p: 1.0 / 3.0, rate: (1.0f64 / 3.0 / 0.05).ln() / 0.5 };
        let both = quantile_of_sum(wait, Wait::NONE, &lengths, prefill, 0.95);
        assert!(both > alone && both > 0.5 && both < alone + 0.5, "{both} vs {alone} + 0.5");
        // Checked against a direct draw of a million requests.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            ((rng >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut draws: Vec<f64> = (0..1_000_000)
            .map(|_| {
                let own = prefill(lengths.at(uniform()));
                let w = if uniform() < wait.p { -(uniform()).ln() / wait.rate } else { 0.0 };
                own + w
            })
            .collect();
        draws.sort_by(f64::total_cmp);
        let drawn = draws[950_000];
        assert!((both / drawn - 1.0).abs() < 0.01, "{both} vs drawn {drawn}");
    }
}
