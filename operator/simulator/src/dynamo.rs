//! NVIDIA Dynamo's planner as two baselines, adapted to one aggregated engine pool (sources and
//! the choices where they leave a parameter open: `docs/planner-baselines.md`):
//!
//! - [`Dynamo`] (`dynamo`), its current SLA mode: a performance model fitted online to the
//!   workers' per-step records (Dynamo's "forward pass metrics"), driving a load-based loop every
//!   5 s over a throughput-based floor every 180 s;
//! - [`DynamoV1`] (`dynamo-v1`), its earlier design: one correction factor per latency
//!   (observed mean / the pre-deployment profile's) under the throughput floor, and a load loop
//!   on mean latencies.

use super::calibrate::Profiled;
use super::policy::{Move, Policy, with_replicas};
use super::prom::{EngineReport, Seen};
use super::replica::{KV_CACHE_TOKENS, StepRecord};
use pacer_planner::{Levers, PlannerSpec};
use std::collections::HashMap;

/// Seconds between the throughput loop's evaluations (`throughput_adjustment_interval`).
const THROUGHPUT_INTERVAL: f64 = 180.0;
/// Seconds between the load loop's evaluations (`load_adjustment_interval`).
const LOAD_INTERVAL: f64 = 5.0;

/// Dynamo's earlier planner, both loops:
/// - throughput-based, every 180 s: the interval's mean TTFT and ITL against the profile's
///   interpolation at the observed per-replica load give correction factors
///   (observed / expected); the per-replica throughput at the SLA is the highest profiled rate
///   whose corrected means meet the targets; replicas = ⌈predicted rate / that throughput⌉
///   with a constant load predictor (the last interval's rate);
/// - load-based, every 5 s: +1 replica when a mean latency is over its target, −1 when both
///   are under 80 % of it, never below the throughput floor, holding while pods start.
#[derive(Debug, Clone)]
pub struct DynamoV1 {
    spec: PlannerSpec,
    profile: Profiled,
    floor: i32,
    last_throughput: f64,
}

impl DynamoV1 {
    /// For `spec`, with the pre-deployment profile of one replica.
    pub fn new(spec: &PlannerSpec, profile: Profiled) -> DynamoV1 {
        DynamoV1 { spec: spec.clone(), profile, floor: spec.min_replicas, last_throughput: 0.0 }
    }
}

impl Policy for DynamoV1 {
    fn name(&self) -> String {
        "dynamo-v1".into()
    }
    fn interval(&self) -> f64 {
        LOAD_INTERVAL
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let obs = &seen.observation;
        let (min, max) = (self.spec.min_replicas, self.spec.max_replicas);
        let mut reason = String::from("load");
        if now - self.last_throughput >= THROUGHPUT_INTERVAL {
            self.last_throughput = now;
            if let Some(rate) = obs.metrics.request_rate.filter(|r| *r > 0.0) {
                let per_replica = rate / f64::from(obs.ready_replicas.max(1));
                let (exp_ttft, exp_itl) = self.profile.means_at(per_replica);
                let c_ttft = seen.ttft_mean.map_or(1.0, |m| m / exp_ttft.max(1e-9));
                let c_itl = seen.itl_mean.map_or(1.0, |m| m / exp_itl.max(1e-9));
                let capacity = self
                    .profile
                    .rate_meeting(self.spec.ttft_target / c_ttft, self.spec.itl_target / c_itl)
                    .max(1e-6);
                self.floor = ((rate / capacity).ceil() as i32).clamp(min, max);
                reason = format!("throughput floor {} (corrections {c_ttft:.2}/{c_itl:.2})", self.floor);
            }
        }
        let starting = obs.desired_replicas > obs.ready_replicas;
        let mut n = current.replicas.max(self.floor);
        if !starting && let (Some(ttft), Some(itl)) = (seen.ttft_mean, seen.itl_mean) {
            if ttft > self.spec.ttft_target || itl > self.spec.itl_target {
                n = current.replicas + 1;
                reason = "load: mean latency over target".into();
            } else if ttft < 0.8 * self.spec.ttft_target && itl < 0.8 * self.spec.itl_target {
                n = (current.replicas - 1).max(self.floor);
            }
        }
        with_replicas(current, n.clamp(min, max), &reason)
    }
}

/// Samples the step model keeps (`max_num_fpm_samples`).
const MAX_SAMPLES: usize = 64;
/// Buckets per feature for the sample buffer's eviction (16 buckets over two features).
const BUCKETS: usize = 4;
/// Samples before the model is used (`load_min_observations`).
const MIN_SAMPLES: usize = 5;
/// `load_scaling_down_sensitivity` / 100.
const DOWN_SENSITIVITY: f64 = 0.8;

/// Dynamo's per-step time model for an aggregated worker: ordinary least squares of a step's
/// wall time on its prompt tokens and its decode rows' context tokens, over a bounded buffer
/// of samples spread across the load space (when full, the oldest sample of the fullest bucket
/// goes).
#[derive(Debug, Clone, Default)]
pub struct StepFit {
    /// (prompt tokens, decode context tokens, wall time), oldest first.
    samples: Vec<(f64, f64, f64)>,
    /// (intercept, per prompt token, per context token), once fitted.
    coefficients: Option<[f64; 3]>,
}

impl StepFit {
    fn bucket(prefill: f64, kv: f64, budget: f64) -> (usize, usize) {
        let at = |v: f64, top: f64| ((v / top.max(1.0) * BUCKETS as f64) as usize).min(BUCKETS - 1);
        (at(prefill, budget), at(kv, f64::from(KV_CACHE_TOKENS)))
    }

    /// Adds a step's record (idle records carry no time and are skipped) and refits.
    pub fn add(&mut self, step: &StepRecord, budget: u32) {
        if step.wall_time <= 0.0 {
            return;
        }
        let budget = f64::from(budget);
        let sample = (f64::from(step.prefill_tokens), step.decode_kv_tokens as f64, step.wall_time);
        if self.samples.len() >= MAX_SAMPLES {
            let mut counts: HashMap<(usize, usize), usize> = HashMap::new();
            for s in &self.samples {
                *counts.entry(Self::bucket(s.0, s.1, budget)).or_default() += 1;
            }
            let fullest = counts.into_iter().max_by_key(|(b, n)| (*n, std::cmp::Reverse(*b))).map(|(b, _)| b);
            if let Some(i) = self.samples.iter().position(|s| Some(Self::bucket(s.0, s.1, budget)) == fullest)
            {
                self.samples.remove(i);
            }
        }
        self.samples.push(sample);
        self.coefficients = self.fit();
    }

    /// The least-squares fit, or `None` with too few samples, a singular system, or a negative
    /// coefficient (Dynamo rejects such a fit and skips scaling).
    fn fit(&self) -> Option<[f64; 3]> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        // Normal equations XᵀX β = Xᵀy with X = [1, prefill, kv], solved by elimination.
        let mut a = [[0.0_f64; 4]; 3];
        for &(p, k, y) in &self.samples {
            let x = [1.0, p, k];
            for i in 0..3 {
                for j in 0..3 {
                    a[i][j] += x[i] * x[j];
                }
                a[i][3] += x[i] * y;
            }
        }
        // A feature that never varied (no prompt in any sample) is left out: its coefficient
        // is 0 rather than the system singular.
        let scale = a[0][0];
        for (i, row) in a.iter_mut().enumerate().skip(1) {
            row[i] += 1e-9 * scale * (1.0 + row[i]);
        }
        for col in 0..3 {
            let pivot = (col..3).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
            if a[pivot][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, pivot);
            let pivot_row = a[col];
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (v, p) in row.iter_mut().zip(pivot_row).skip(col) {
                        *v -= f * p;
                    }
                }
            }
        }
        let beta = [a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]];
        (beta.iter().all(|b| b.is_finite()) && beta[1] >= 0.0 && beta[2] >= 0.0 && beta[0] >= 0.0)
            .then_some(beta)
    }

    /// Predicted seconds of a step with `prefill` prompt tokens and `kv` decode context tokens.
    pub fn predict(&self, prefill: f64, kv: f64) -> Option<f64> {
        self.coefficients.map(|[c, p, k]| c + p * prefill + k * kv)
    }

    /// Predicted seconds to prefill `tokens` in chunks of `budget`, beside `kv` context tokens.
    fn prefill_time(&self, tokens: f64, budget: f64, kv: f64) -> Option<f64> {
        let budget = budget.max(1.0);
        let full = (tokens / budget).floor();
        let rest = tokens - full * budget;
        let mut t = full * self.predict(budget, kv)?;
        if rest > 0.0 {
            t += self.predict(rest, kv)?;
        }
        Some(t)
    }
}

/// A moving average over the last [`MAX_SAMPLES`] values.
#[derive(Debug, Clone, Default)]
struct Moving(std::collections::VecDeque<f64>);

impl Moving {
    fn push(&mut self, v: f64) {
        self.0.push_back(v);
        if self.0.len() > MAX_SAMPLES {
            self.0.pop_front();
        }
    }
    fn mean(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().sum::<f64>() / self.0.len() as f64)
    }
}

/// A local-linear-trend Kalman filter on the per-interval request rate (Dynamo's `kalman`
/// load predictor: level noise 1.0, trend noise 0.1, observation noise 10, five points before
/// it predicts; the constant predictor until then).
#[derive(Debug, Clone)]
struct Kalman {
    /// (level, trend).
    x: [f64; 2],
    p: [[f64; 2]; 2],
    points: usize,
}

impl Kalman {
    fn new() -> Kalman {
        Kalman { x: [0.0, 0.0], p: [[1e3, 0.0], [0.0, 1e3]], points: 0 }
    }

    /// Takes one interval's rate and returns the next interval's forecast.
    fn observe(&mut self, rate: f64) -> f64 {
        const Q_LEVEL: f64 = 1.0;
        const Q_TREND: f64 = 0.1;
        const R: f64 = 10.0;
        if self.points == 0 {
            self.x = [rate, 0.0];
        } else {
            // Predict: level += trend; P = F P Fᵀ + Q.
            let [l, b] = self.x;
            self.x = [l + b, b];
            let p = self.p;
            self.p = [
                [p[0][0] + p[0][1] + p[1][0] + p[1][1] + Q_LEVEL, p[0][1] + p[1][1]],
                [p[1][0] + p[1][1], p[1][1] + Q_TREND],
            ];
            // Update on the level.
            let s = self.p[0][0] + R;
            let k = [self.p[0][0] / s, self.p[1][0] / s];
            let y = rate - self.x[0];
            self.x = [self.x[0] + k[0] * y, self.x[1] + k[1] * y];
            let p = self.p;
            self.p = [
                [(1.0 - k[0]) * p[0][0], (1.0 - k[0]) * p[0][1]],
                [p[1][0] - k[1] * p[0][0], p[1][1] - k[1] * p[0][1]],
            ];
        }
        self.points += 1;
        if self.points < 5 { rate } else { (self.x[0] + self.x[1]).max(0.0) }
    }
}

/// Dynamo's current planner in its SLA mode (both loops on), adapted to one aggregated pool:
/// - the model: [`StepFit`] on the records the workers report (the latest of each, each
///   record once), used from its fifth sample;
/// - load-based, every 5 s, per worker: TTFT = the predicted time to prefill its queued prompt
///   tokens plus an average prompt in chunks of the token budget; ITL = one step at its
///   running context plus its waiting requests' plus an average request's. +1 replica when
///   every worker's TTFT, or every worker's ITL, is over its target; −1 when, with the load
///   of one fewer worker spread on the rest, every worker's queueing TTFT stays within 80 %
///   of its slack and its ITL within 80 % of the target; no action while pods start or drain;
/// - throughput-based, every 180 s: the Kalman forecast of the request rate over the
///   per-worker rate the model says meets both targets at the observed prompt and output
///   lengths gives a floor the load loop never goes below.
#[derive(Debug, Clone)]
pub struct Dynamo {
    spec: PlannerSpec,
    fit: StepFit,
    seen_steps: HashMap<usize, u64>,
    prompt_per_request: Moving,
    context_per_row: Moving,
    predictor: Kalman,
    floor: i32,
    last_throughput: f64,
}

impl Dynamo {
    /// For `spec`'s targets and ranges.
    pub fn new(spec: &PlannerSpec) -> Dynamo {
        Dynamo {
            spec: spec.clone(),
            fit: StepFit::default(),
            seen_steps: HashMap::new(),
            prompt_per_request: Moving::default(),
            context_per_row: Moving::default(),
            predictor: Kalman::new(),
            floor: spec.min_replicas,
            last_throughput: 0.0,
        }
    }

    fn learn(&mut self, engines: &[EngineReport], budget: u32) {
        for e in engines {
            if self.seen_steps.get(&e.pod) == Some(&e.steps) || e.steps == 0 {
                continue;
            }
            self.seen_steps.insert(e.pod, e.steps);
            let s = &e.last_step;
            self.fit.add(s, budget);
            if s.prefill_requests > 0 {
                self.prompt_per_request.push(f64::from(s.prefill_tokens) / f64::from(s.prefill_requests));
            }
            if s.decode_requests > 0 {
                self.context_per_row.push(s.decode_kv_tokens as f64 / f64::from(s.decode_requests));
            }
        }
    }

    /// (TTFT, ITL) a new request would see on worker `e` with its queue scaled by `load`.
    fn estimate(&self, e: &EngineReport, load: f64, budget: f64) -> Option<(f64, f64)> {
        let isl = self.prompt_per_request.mean().unwrap_or(0.0);
        let row = self.context_per_row.mean().unwrap_or(0.0);
        let kv = e.scheduled_kv_tokens as f64 * load;
        let ttft = self.fit.prefill_time(e.queued_prefill_tokens as f64 * load + isl, budget, kv)?;
        let itl = self.fit.predict(0.0, (e.scheduled_kv_tokens + e.queued_kv_tokens) as f64 * load + row)?;
        Some((ttft, itl))
    }

    /// The load loop's move: +1, −1 or 0, and why.
    fn load_move(&self, engines: &[EngineReport], n: i32, budget: f64) -> Option<(i32, String)> {
        let (ttft_t, itl_t) = (self.spec.ttft_target, self.spec.itl_target);
        let now: Vec<(f64, f64)> =
            engines.iter().map(|e| self.estimate(e, 1.0, budget)).collect::<Option<_>>()?;
        if now.is_empty() {
            return None;
        }
        let least_ttft = now.iter().map(|e| e.0).fold(f64::INFINITY, f64::min);
        let least_itl = now.iter().map(|e| e.1).fold(f64::INFINITY, f64::min);
        if least_ttft > ttft_t || least_itl > itl_t {
            return Some((
                1,
                format!("load: every worker predicts TTFT ≥ {least_ttft:.2} s or ITL ≥ {least_itl:.3} s"),
            ));
        }
        if n <= 1 {
            return Some((0, "load: within targets".into()));
        }
        let spread = f64::from(n) / f64::from(n - 1);
        let fits = engines.iter().all(|e| {
            let (Some((own, _)), Some((post, itl))) = (
                self.estimate(&EngineReport { queued_prefill_tokens: 0, ..*e }, 1.0, budget),
                self.estimate(e, spread, budget),
            ) else {
                return false;
            };
            let kv = (e.scheduled_kv_tokens + e.queued_kv_tokens) as f64 * spread;
            post - own < (ttft_t - own) * DOWN_SENSITIVITY
                && kv <= f64::from(KV_CACHE_TOKENS)
                && itl < itl_t * DOWN_SENSITIVITY
        });
        Some(if fits {
            (-1, "load: one fewer worker predicts within 80 %".into())
        } else {
            (0, "load: hold".into())
        })
    }

    /// Requests per second one worker serves within both targets, by the model, at prompts of
    /// `isl` and outputs of `osl` tokens: the prefill time plus the output's share of the
    /// largest decode batch whose step stays within the ITL target.
    fn worker_rate(&self, isl: f64, osl: f64, budget: f64, max_batch: u32) -> Option<f64> {
        let prefill = self.fit.prefill_time(isl, budget, 0.0)?;
        let context = isl + osl / 2.0;
        let kv_cap = (f64::from(KV_CACHE_TOKENS) / (isl + osl).max(1.0)).floor() as u32;
        let best = (1..=max_batch.min(kv_cap).max(1)).rev().find_map(|b| {
            let itl = self.fit.predict(0.0, f64::from(b) * context)?;
            (itl <= self.spec.itl_target).then_some((b, itl))
        });
        let (b, itl) = best?;
        Some(1.0 / (prefill + osl * itl / f64::from(b)))
    }
}

impl Policy for Dynamo {
    fn name(&self) -> String {
        "dynamo".into()
    }
    fn interval(&self) -> f64 {
        LOAD_INTERVAL
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let obs = &seen.observation;
        let (min, max) = (self.spec.min_replicas, self.spec.max_replicas);
        let budget = current.max_num_batched_tokens;
        self.learn(&seen.engines, budget);
        let mut reason = String::new();
        if now - self.last_throughput >= THROUGHPUT_INTERVAL {
            self.last_throughput = now;
            let m = &obs.metrics;
            if let Some(rate) = m.request_rate.filter(|r| *r > 0.0) {
                let forecast = self.predictor.observe(rate);
                let isl = m.prompt_token_rate.map_or(0.0, |p| p / rate);
                let osl = m.output_token_rate.map_or(1.0, |o| o / rate).max(1.0);
                if let Some(per_worker) =
                    self.worker_rate(isl, osl, f64::from(budget), current.max_batch_size)
                {
                    self.floor = ((forecast / per_worker.max(1e-6)).ceil() as i32).clamp(min, max);
                    reason = format!(
                        "throughput floor {} (forecast {forecast:.2} req/s, {per_worker:.2} per worker); ",
                        self.floor
                    );
                }
            }
        }
        // No action while the deployment is changing or the workers reporting differ from it
        // (a worker draining after a scale-down still reports until it stops).
        let serving: Vec<EngineReport> = seen.engines.iter().filter(|e| e.serving).copied().collect();
        if obs.desired_replicas != obs.ready_replicas
            || seen.engines.len() != obs.ready_replicas.max(0) as usize
        {
            return with_replicas(current, current.replicas, &format!("{reason}scaling in progress"));
        }
        let Some((step, why)) = self.load_move(&serving, current.replicas, f64::from(budget)) else {
            let n = current.replicas.max(self.floor).clamp(min, max);
            return with_replicas(current, n, &format!("{reason}model not ready"));
        };
        let n = (current.replicas + step).max(self.floor).clamp(min, max);
        with_replicas(current, n, &format!("{reason}{why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(prefill: u32, kv: u64, rows: u32) -> StepRecord {
        // 12 ms a step, 0.35 ms a prompt token, 0.01 ms a context token.
        StepRecord {
            wall_time: 0.012 + 0.00035 * f64::from(prefill) + 0.00001 * kv as f64,
            prefill_tokens: prefill,
            prefill_requests: u32::from(prefill > 0),
            decode_requests: rows,
            decode_kv_tokens: kv,
        }
    }

    #[test]
    fn the_step_fit_recovers_a_linear_step_time_and_bounds_its_buffer() {
        let mut fit = StepFit::default();
        assert_eq!(fit.predict(0.0, 0.0), None);
        for i in 0..200u32 {
            fit.add(&record((i * 37) % 512, u64::from((i * 911) % 20000), 4), 512);
        }
        assert!(fit.samples.len() <= MAX_SAMPLES);
        let t = fit.predict(256.0, 8000.0).expect("fitted");
        assert!((t - (0.012 + 0.00035 * 256.0 + 0.08)).abs() < 1e-6, "{t}");
        // Pure decode records (no prompt ever) still fit, with no prompt term.
        let mut decode = StepFit::default();
        for i in 1..10u64 {
            decode.add(&record(0, i * 1000, 4), 512);
        }
        assert!((decode.predict(0.0, 5000.0).expect("fitted") - 0.062).abs() < 1e-6);
    }

    #[test]
    fn the_kalman_predictor_follows_a_trend_after_five_points() {
        let mut k = Kalman::new();
        let mut last = 0.0;
        for i in 0..20 {
            last = k.observe(1.0 + 0.5 * f64::from(i));
        }
        // The next interval is above the last observation (10.5) on a rising trend.
        assert!(last > 10.5 && last < 11.5, "{last}");
        let mut flat = Kalman::new();
        assert_eq!(flat.observe(3.0), 3.0);
    }
}
