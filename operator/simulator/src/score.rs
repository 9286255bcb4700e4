//! Scoring a run from the truth, not from Prometheus: per window (1 min by default) the exact
//! percentile of TTFT and of every ITL gap of the requests that finished in it; SLA attainment
//! (the share of windows meeting both targets), replica-seconds (every existing pod: starting,
//! ready or draining), lever changes per hour (overall and while the load is stationary),
//! recovery after a load step, and requests failed or left in flight.

use super::SimConfig;
use super::prom::Seen;
use super::replica::Finished;
use super::trace::Trace;
use pacer_planner::Levers;
use serde::Serialize;

/// One scoring window of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct WindowRow {
    /// Window end, seconds.
    pub t: f64,
    /// Requests that arrived in the window, per second.
    pub arrival_rate: f64,
    /// Requests that finished in it.
    pub finished: usize,
    /// True TTFT percentile of those requests, seconds.
    pub ttft: Option<f64>,
    /// True ITL percentile over their gaps, seconds.
    pub itl: Option<f64>,
    /// Both within target (an empty window counts as met: nobody waited).
    pub met: bool,
    /// What Prometheus said at the window's end (the spec's window and percentile).
    pub observed_ttft: Option<f64>,
    /// What Prometheus said of ITL.
    pub observed_itl: Option<f64>,
    /// Replicas the policy asked for.
    pub desired: i32,
    /// Ready replicas at the current tier.
    pub ready: i32,
    /// Pods existing (starting, ready, draining).
    pub pods: usize,
    /// The tier in force.
    pub tier: String,
    /// `max_batch_size` in force.
    pub max_batch_size: u32,
    /// The policy's last reason.
    pub reason: String,
}

/// One lever change.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRow {
    /// When.
    pub t: f64,
    /// Levers before.
    pub from: Levers,
    /// Levers after.
    pub to: Levers,
    /// The policy's reason.
    pub reason: String,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The policy's name.
    pub policy: String,
    /// The trace's name.
    pub trace: String,
    /// Seconds simulated.
    pub duration_s: f64,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests finished.
    pub finished: usize,
    /// Requests the engines failed (too large for their KV cache).
    pub failed: u64,
    /// Requests still in flight at the end (not failures).
    pub in_flight: usize,
    /// Scoring windows.
    pub windows: usize,
    /// Windows meeting both targets.
    pub windows_met: usize,
    /// `windows_met / windows`.
    pub attainment: f64,
    /// Share of finished requests meeting both targets themselves: TTFT within its target and
    /// the mean gap between their tokens (TPOT) within the ITL target — llm-d's measure.
    pub request_attainment: f64,
    /// Pods integrated over time.
    pub replica_seconds: f64,
    /// The offline bound's replica-seconds, when computed.
    pub bound_replica_seconds: Option<f64>,
    /// `replica_seconds / bound_replica_seconds`.
    pub vs_bound: Option<f64>,
    /// Lever changes.
    pub changes: usize,
    /// Lever changes per hour.
    pub changes_per_hour: f64,
    /// Lever changes per hour while the load is stationary, where the trace has such stretches.
    pub stationary_changes_per_hour: Option<f64>,
    /// Seconds from the load step until the windows meet the SLA again (0: never violated).
    pub recovery_s: Option<f64>,
    /// True TTFT percentile over the whole run, seconds.
    pub ttft: Option<f64>,
    /// True ITL percentile over the whole run, seconds.
    pub itl: Option<f64>,
    /// True mean TTFT, seconds.
    pub ttft_mean: Option<f64>,
    /// True mean ITL, seconds.
    pub itl_mean: Option<f64>,
    /// True mean E2E, seconds.
    pub e2e_mean: Option<f64>,
    /// Mean pods.
    pub mean_pods: f64,
}

/// A run's results.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The figures.
    pub summary: Summary,
    /// Per scoring window.
    pub timeline: Vec<WindowRow>,
    /// Every lever change.
    pub decisions: Vec<DecisionRow>,
}

#[derive(Debug, Default, Clone)]
struct Acc {
    arrivals: usize,
    ttfts: Vec<f64>,
    itls: Vec<f64>,
}

/// Accumulates a run's truth.
#[derive(Debug)]
pub struct Scorer {
    policy: String,
    trace: String,
    duration: f64,
    requests: usize,
    step_at: Option<f64>,
    stationary: Vec<(f64, f64)>,
    window: f64,
    q: f64,
    ttft_target: f64,
    itl_target: f64,
    acc: Vec<Acc>,
    all_ttft: Vec<f64>,
    all_itl: LogHistogram,
    itl_sum: f64,
    e2e_sum: f64,
    finished: usize,
    requests_met: usize,
    replica_seconds: f64,
    timeline: Vec<WindowRow>,
    decisions: Vec<DecisionRow>,
}

/// Counts in bins 0.5 % wide (log-spaced from 0.1 ms): a whole run's ITL percentile without
/// keeping millions of gaps.
#[derive(Debug, Clone)]
struct LogHistogram {
    counts: Vec<u64>,
    total: u64,
}

const LOG_STEP: f64 = 0.005;
const LOG_FLOOR: f64 = 1e-4;

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram { counts: vec![0; 3000], total: 0 }
    }
}

impl LogHistogram {
    fn observe(&mut self, v: f64) {
        let k = ((v.max(LOG_FLOOR) / LOG_FLOOR).ln() / LOG_STEP.ln_1p()).floor() as usize;
        let k = k.min(self.counts.len() - 1);
        self.counts[k] += 1;
        self.total += 1;
    }

    fn percentile(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = (q / 100.0 * self.total as f64).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (k, c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return Some(LOG_FLOOR * (1.0 + LOG_STEP).powf(k as f64 + 0.5));
            }
        }
        None
    }
}

fn pct(v: &mut [f64], q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    pacer_bench::metrics::percentile(v, q)
}

impl Scorer {
    /// For a run of `trace` under `config`.
    pub fn new(config: &SimConfig, trace: &Trace, policy: &str) -> Scorer {
        Scorer {
            policy: policy.into(),
            trace: trace.name.clone(),
            duration: trace.duration,
            requests: trace.requests.len(),
            step_at: trace.shape.step_at(trace.duration),
            stationary: trace.shape.stationary(trace.duration),
            window: config.score_window,
            q: config.spec.percentile,
            ttft_target: config.spec.ttft_target,
            itl_target: config.spec.itl_target,
            acc: Vec::new(),
            all_ttft: Vec::new(),
            all_itl: LogHistogram::default(),
            itl_sum: 0.0,
            e2e_sum: 0.0,
            finished: 0,
            requests_met: 0,
            replica_seconds: 0.0,
            timeline: Vec::new(),
            decisions: Vec::new(),
        }
    }

    fn slot(&mut self, t: f64) -> &mut Acc {
        let k = (t / self.window).floor() as usize;
        if self.acc.len() <= k {
            self.acc.resize(k + 1, Acc::default());
        }
        &mut self.acc[k]
    }

    /// `pods` existed from `last` to `now`.
    pub fn pods_until(&mut self, now: f64, pods: usize, last: f64) {
        self.replica_seconds += pods as f64 * (now - last).max(0.0);
    }

    /// A request arrived.
    pub fn arrival(&mut self, t: f64) {
        self.slot(t).arrivals += 1;
    }

    /// A request finished.
    pub fn finished(&mut self, f: &Finished) {
        self.finished += 1;
        let tpot = if f.itls.is_empty() {
            0.0
        } else {
            f.itls.iter().map(|g| f64::from(*g)).sum::<f64>() / f.itls.len() as f64
        };
        if f.ttft <= self.ttft_target && tpot <= self.itl_target {
            self.requests_met += 1;
        }
        self.e2e_sum += f.e2e;
        let ttft = f.ttft;
        let itls: Vec<f64> = f.itls.iter().map(|g| f64::from(*g)).collect();
        self.all_ttft.push(ttft);
        itls.iter().for_each(|g| self.all_itl.observe(*g));
        self.itl_sum += itls.iter().sum::<f64>();
        let slot = self.slot(f.at);
        slot.ttfts.push(ttft);
        slot.itls.extend(itls);
    }

    /// The levers changed.
    pub fn decision(&mut self, t: f64, from: &Levers, to: &Levers, reason: &str) {
        self.decisions.push(DecisionRow { t, from: *from, to: *to, reason: reason.into() });
    }

    /// Closes the window ending at `t`.
    pub fn close_window(
        &mut self,
        t: f64,
        levers: &Levers,
        ready: i32,
        pods: usize,
        seen: &Seen,
        reason: &str,
    ) {
        let (q, w) = (self.q, self.window);
        let (tt, it) = (self.ttft_target, self.itl_target);
        let slot = std::mem::take(self.slot(t - w / 2.0));
        let (mut ttfts, mut itls) = (slot.ttfts, slot.itls);
        let ttft = pct(&mut ttfts, q);
        let itl = pct(&mut itls, q);
        let met = ttft.is_none_or(|v| v <= tt) && itl.is_none_or(|v| v <= it);
        let m = &seen.observation.metrics;
        self.timeline.push(WindowRow {
            t,
            arrival_rate: slot.arrivals as f64 / w,
            finished: ttfts.len(),
            ttft,
            itl,
            met,
            observed_ttft: m.ttft.seconds(),
            observed_itl: m.itl.seconds(),
            desired: levers.replicas,
            ready,
            pods,
            tier: levers.tier.to_string(),
            max_batch_size: levers.max_batch_size,
            reason: reason.into(),
        });
    }

    /// The run's outcome.
    pub fn finish(mut self, failed: u64, in_flight: usize) -> Outcome {
        let windows = self.timeline.len();
        let windows_met = self.timeline.iter().filter(|w| w.met).count();
        let hours = self.duration / 3600.0;
        let changes = self.decisions.len();
        let stationary_hours: f64 = self.stationary.iter().map(|(a, b)| b - a).sum::<f64>() / 3600.0;
        let stationary_changes = self
            .decisions
            .iter()
            .filter(|d| self.stationary.iter().any(|(a, b)| d.t >= *a && d.t < *b))
            .count();
        let recovery_s = self.step_at.map(|s| {
            self.timeline
                .iter()
                .filter(|w| w.t - self.window >= s - 1e-9 && w.t <= s + 900.0 && !w.met)
                .map(|w| w.t - s)
                .fold(0.0, f64::max)
        });
        let q = self.q;
        let summary = Summary {
            policy: self.policy.clone(),
            trace: self.trace.clone(),
            duration_s: self.duration,
            requests: self.requests,
            finished: self.finished,
            failed,
            in_flight,
            windows,
            windows_met,
            attainment: if windows == 0 { 1.0 } else { windows_met as f64 / windows as f64 },
            request_attainment: if self.finished == 0 {
                1.0
            } else {
                self.requests_met as f64 / self.finished as f64
            },
            replica_seconds: self.replica_seconds,
            bound_replica_seconds: None,
            vs_bound: None,
            changes,
            changes_per_hour: changes as f64 / hours.max(1e-9),
            stationary_changes_per_hour: (stationary_hours > 0.0)
                .then(|| stationary_changes as f64 / stationary_hours),
            recovery_s,
            ttft_mean: (!self.all_ttft.is_empty())
                .then(|| self.all_ttft.iter().sum::<f64>() / self.all_ttft.len() as f64),
            e2e_mean: (self.finished > 0).then(|| self.e2e_sum / self.finished as f64),
            itl_mean: (self.all_itl.total > 0).then(|| self.itl_sum / self.all_itl.total as f64),
            ttft: pct(&mut self.all_ttft, q),
            itl: self.all_itl.percentile(q),
            mean_pods: self.replica_seconds / self.duration.max(1e-9),
        };
        Outcome { summary, timeline: self.timeline, decisions: self.decisions }
    }
}
