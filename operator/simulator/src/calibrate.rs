//! What the profile says a service can do, found by simulating it at stationary load: the
//! highest rate `n` replicas hold at the SLA percentile targets (for the offline bound), and
//! one replica's mean TTFT and ITL across rates (the pre-deployment profile Dynamo's planner
//! interpolates).

use super::policy::Static;
use super::trace::{self, Shape, Trace, TraceSpec};
use super::{SimConfig, SimError, simulate};
use pacer_bench::load::Length;
use serde::Serialize;
use std::sync::Arc;

/// Seconds of each stationary calibration run.
const RUN_SECONDS: f64 = 600.0;
/// The calibration runs' seed (fixed: calibration is a property of the profile, not the run).
const SEED: u64 = 0xca1;

/// The request mix a calibration runs: lengths drawn from two distributions, or (prompt,
/// output) pairs resampled from a trace's own requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Mix {
    /// Prompt and output lengths drawn independently.
    Drawn(Length, Length),
    /// Pairs drawn at random from these.
    Resampled(Arc<Vec<(u32, u32)>>),
}

impl From<(Length, Length)> for Mix {
    fn from((prompt, output): (Length, Length)) -> Mix {
        Mix::Drawn(prompt, output)
    }
}

impl Mix {
    /// The mix of `trace`'s own requests.
    pub fn of(trace: &Trace) -> Mix {
        Mix::Resampled(Arc::new(trace.requests.iter().map(|r| (r.prompt_tokens, r.output_tokens)).collect()))
    }
}

fn steady(rate: f64, mix: &Mix) -> Result<Trace, SimError> {
    let (prompt, output, resample) = match mix {
        Mix::Drawn(p, o) => (*p, *o, None),
        Mix::Resampled(pool) => (trace::PROMPT_TOKENS, trace::OUTPUT_TOKENS, Some(pool.clone())),
    };
    trace::generate(&TraceSpec {
        shape: Shape::Steady,
        base_rate: rate,
        duration: RUN_SECONDS,
        seed: SEED,
        prompt,
        output,
        resample,
    })
}

/// The whole-run true percentiles of `n` static replicas at `rate`.
fn stationary(config: &SimConfig, n: i32, rate: f64, mix: &Mix) -> Result<(f64, f64, f64, f64), SimError> {
    let mut c = config.clone();
    c.initial.replicas = n;
    c.spec.min_replicas = n;
    c.spec.max_replicas = c.spec.max_replicas.max(n);
    let t = steady(rate, mix)?;
    let o = simulate(&c, &t, &mut Static { replicas: n })?;
    let s = &o.summary;
    let inf = f64::INFINITY;
    Ok((s.ttft.unwrap_or(inf), s.itl.unwrap_or(inf), s.ttft_mean.unwrap_or(inf), s.itl_mean.unwrap_or(inf)))
}

/// The highest request rate `n` replicas hold with the whole-run percentiles within target.
pub fn capacity(config: &SimConfig, n: i32, mix: &Mix) -> Result<f64, SimError> {
    let (tt, it) = (config.spec.ttft_target, config.spec.itl_target);
    let meets = |rate: f64| -> Result<bool, SimError> {
        let (ttft, itl, _, _) = stationary(config, n, rate, mix)?;
        Ok(ttft <= tt && itl <= it)
    };
    let mut lo = 0.0;
    let mut hi = 0.5 * f64::from(n);
    while meets(hi)? {
        lo = hi;
        hi *= 2.0;
        if hi > 1e4 {
            return Ok(hi);
        }
    }
    for _ in 0..9 {
        let mid = (lo + hi) / 2.0;
        if meets(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// [`capacity`] for 1 to `max_replicas` replicas.
pub fn capacities(config: &SimConfig, mix: &Mix) -> Result<Vec<f64>, SimError> {
    (1..=config.spec.max_replicas).map(|n| capacity(config, n, mix)).collect()
}

/// The offline lower bound of a trace: per scoring window, the fewest replicas whose
/// stationary capacity covers the window's true arrival rate (at least the minimum, at most the
/// maximum).
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    /// Replicas per window.
    pub replicas: Vec<i32>,
    /// Replicas × window length, summed.
    pub replica_seconds: f64,
}

/// The bound of `trace` given `capacities[n-1]` for n replicas.
pub fn bound(config: &SimConfig, trace: &Trace, capacities: &[f64]) -> Bound {
    let w = config.score_window;
    let windows = (trace.duration / w).ceil() as usize;
    let mut counts = vec![0usize; windows];
    for r in &trace.requests {
        let k = ((r.timestamp / w) as usize).min(windows.saturating_sub(1));
        counts[k] += 1;
    }
    let (min, max) = (config.spec.min_replicas, config.spec.max_replicas);
    let replicas: Vec<i32> = counts
        .iter()
        .map(|c| {
            let rate = *c as f64 / w;
            let n = capacities.iter().position(|cap| *cap >= rate).map_or(max, |i| i as i32 + 1);
            n.clamp(min, max)
        })
        .collect();
    let replica_seconds =
        replicas.iter().enumerate().map(|(k, n)| f64::from(*n) * w.min(trace.duration - k as f64 * w)).sum();
    Bound { replicas, replica_seconds }
}

/// One replica's profile: mean TTFT and ITL at stationary request rates, as Dynamo's
/// pre-deployment profiler would record it.
#[derive(Debug, Clone, Serialize)]
pub struct Profiled {
    /// (requests/s, mean TTFT s, mean ITL s), by rate.
    pub points: Vec<(f64, f64, f64)>,
}

impl Profiled {
    /// Profiles one replica at `steps` rates up to `top` requests/s.
    pub fn measure(config: &SimConfig, top: f64, steps: usize, mix: &Mix) -> Result<Profiled, SimError> {
        let points = (1..=steps)
            .map(|k| {
                let rate = top * k as f64 / steps as f64;
                stationary(config, 1, rate, mix).map(|(_, _, ttft, itl)| (rate, ttft, itl))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Profiled { points })
    }

    /// Interpolated (mean TTFT, mean ITL) at `rate` per replica (the ends extend flat).
    pub fn means_at(&self, rate: f64) -> (f64, f64) {
        let p = &self.points;
        let Some(first) = p.first() else { return (0.0, 0.0) };
        if rate <= first.0 {
            return (first.1, first.2);
        }
        for w in p.windows(2) {
            if rate <= w[1].0 {
                let f = (rate - w[0].0) / (w[1].0 - w[0].0);
                return (w[0].1 + f * (w[1].1 - w[0].1), w[0].2 + f * (w[1].2 - w[0].2));
            }
        }
        let last = p[p.len() - 1];
        (last.1, last.2)
    }

    /// The highest rate per replica whose interpolated means stay within both targets.
    pub fn rate_meeting(&self, ttft: f64, itl: f64) -> f64 {
        let ok = |r: f64| {
            let (a, b) = self.means_at(r);
            a <= ttft && b <= itl
        };
        let top = self.points.last().map_or(0.0, |p| p.0);
        let mut best = 0.0;
        let n = 400;
        for k in 1..=n {
            let r = top * f64::from(k) / f64::from(n);
            if ok(r) {
                best = r;
            } else {
                break;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_SPEC, read_spec, test_profile};
    use pacer_crds::Tier;
    use pacer_planner::capacity::{CapacityModel, EngineConfig, Limits, Workload};

    /// The capacity model against the simulator it plans for: one replica of the built-in
    /// `q8_0` profile on the built-in traces' request mix, the highest rate whose whole-run
    /// P95s meet the built-in SLA, at the batch settings the planner moves between. The
    /// figures are in `docs/planner.md`; run with `--nocapture` to see them.
    #[test]
    fn the_capacity_model_stays_near_the_simulated_capacity() {
        let isvc = read_spec(DEFAULT_SPEC).expect("the built-in spec parses");
        let base = SimConfig::new(&isvc, vec![test_profile(Tier::Q8_0)]).expect("a config");
        let model = CapacityModel::from_steps([(Tier::Q8_0, test_profile(Tier::Q8_0).step)]);
        let mix = Mix::Drawn(trace::PROMPT_TOKENS, trace::OUTPUT_TOKENS);
        // Uniform 64–512 prompt tokens and 32–256 output tokens.
        let shape = Workload {
            request_rate: 1.0,
            prompt_tokens: 288.0,
            output_tokens: 144.0,
            prompt_tail: Some(489.6),
        };
        let limits = Limits {
            ttft: base.spec.ttft_target,
            itl: base.spec.itl_target,
            ttft_scale: 1.0,
            itl_scale: 1.0,
            floor_credit: 0.0,
            utilization: 1.0,
        };
        for (batch, budget) in [(8, 512), (16, 512), (8, 256), (8, 64), (16, 128)] {
            let mut c = base.clone();
            c.initial.max_batch_size = batch;
            c.initial.max_num_batched_tokens = budget;
            let simulated = capacity(&c, 1, &mix).expect("simulates");
            let config = EngineConfig {
                tier: Tier::Q8_0,
                max_batch_size: batch,
                token_budget: budget,
                max_step_ms: 0,
            };
            let predicted = model.capacity(&config, &shape, base.spec.quantile(), limits).expect("profiled");
            println!("batch {batch} / budget {budget}: model {predicted:.2} req/s, simulator {simulated:.2}");
            let ratio = predicted / simulated;
            assert!(
                (0.75..=1.5).contains(&ratio),
                "{batch}/{budget}: model {predicted} vs simulated {simulated}"
            );
        }
    }
}
