//! The policies a run can be driven by, behind one trait: Pacer's planner and the published
//! baselines, each implemented from its own law (sources in `docs/planner-baselines.md`). A
//! policy sees only what Prometheus answers ([`Seen`]) and the levers in force.

use super::prom::Seen;
use pacer_planner::{Levers, PlannerSpec};
use std::collections::VecDeque;

/// What a policy decided at one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The levers to run at next.
    pub levers: Levers,
    /// Why, in the policy's words (a reason code for Pacer).
    pub reason: String,
}

/// A scaling policy on the virtual clock.
pub trait Policy {
    /// The name in tables (`pacer`, `llmd-slo`, `static:3`, ...).
    fn name(&self) -> String;
    /// Seconds between evaluations.
    fn interval(&self) -> f64;
    /// One evaluation at `now`.
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move;
}

fn hold(current: &Levers, reason: &str) -> Move {
    Move { levers: *current, reason: reason.into() }
}

pub(super) fn with_replicas(current: &Levers, n: i32, reason: &str) -> Move {
    Move { levers: Levers { replicas: n, ..*current }, reason: reason.into() }
}

/// `static:N`: N replicas, always.
#[derive(Debug, Clone)]
pub struct Static {
    /// The replicas.
    pub replicas: i32,
}

impl Policy for Static {
    fn name(&self) -> String {
        format!("static:{}", self.replicas)
    }
    fn interval(&self) -> f64 {
        60.0
    }
    fn evaluate(&mut self, _now: f64, _seen: &Seen, current: &Levers) -> Move {
        with_replicas(current, self.replicas, "static")
    }
}

/// llm-d's SLO-driven saturation scaling behind a Kubernetes HPA: the saturation signal
/// `s = avg₄₅ₛ(min(max(P95 TTFT/target, P95 ITL/target), 2))`; up when `s > 0.55` to
/// `n + ⌈n(s·c/0.55 − 1)⌉` with in-flight credit `c = ready/n`; down when `s < 0.40` to
/// `n − ⌊n(1 − s/0.40)⌋`; the HPA's behaviour (scale-up: 30 s stabilization, at most
/// max(100 %, 4 pods) per 60 s; scale-down: 180 s stabilization, 1 pod per 120 s), evaluated
/// every 15 s (the HPA sync period).
#[derive(Debug, Clone)]
pub struct LlmdSlo {
    spec: PlannerSpec,
    signal: VecDeque<(f64, f64)>,
    recommendations: VecDeque<(f64, i32)>,
    changes: VecDeque<(f64, i32)>,
}

impl LlmdSlo {
    /// For `spec`'s targets and ranges.
    pub fn new(spec: &PlannerSpec) -> LlmdSlo {
        LlmdSlo {
            spec: spec.clone(),
            signal: VecDeque::new(),
            recommendations: VecDeque::new(),
            changes: VecDeque::new(),
        }
    }
}

impl Policy for LlmdSlo {
    fn name(&self) -> String {
        "llmd-slo".into()
    }
    fn interval(&self) -> f64 {
        15.0
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let m = &seen.observation.metrics;
        // An idle pool (no percentile) reads 0 and drifts toward the minimum.
        let ratio = |q: Option<f64>, target: f64| q.map_or(0.0, |v| v / target);
        let raw = ratio(m.ttft.seconds(), self.spec.ttft_target)
            .max(ratio(m.itl.seconds(), self.spec.itl_target))
            .min(2.0);
        self.signal.push_back((now, raw));
        while self.signal.front().is_some_and(|(t, _)| *t <= now - 45.0) {
            self.signal.pop_front();
        }
        let s = self.signal.iter().map(|(_, v)| v).sum::<f64>() / self.signal.len() as f64;
        let n = current.replicas.max(1);
        let nf = f64::from(n);
        let credit = f64::from(seen.observation.ready_replicas) / nf;
        let desired = if s > 0.55 {
            n + (nf * (s * credit / 0.55 - 1.0)).ceil().max(0.0) as i32
        } else if s < 0.40 {
            n - (nf * (1.0 - s / 0.40)).floor() as i32
        } else {
            n
        };
        let desired = desired.clamp(self.spec.min_replicas, self.spec.max_replicas);
        // HPA behaviour: stabilization picks the most conservative recommendation in the window
        // (the lowest for scale-up, the highest for scale-down)...
        self.recommendations.push_back((now, desired));
        while self.recommendations.front().is_some_and(|(t, _)| *t <= now - 180.0) {
            self.recommendations.pop_front();
        }
        let up_floor = self.recommendations.iter().filter(|(t, _)| *t > now - 30.0).map(|r| r.1).min();
        let down_ceiling = self.recommendations.iter().map(|r| r.1).max();
        let mut target = n;
        if desired > n {
            target = up_floor.unwrap_or(n).max(n);
        } else if desired < n {
            target = down_ceiling.unwrap_or(n).min(n);
        }
        // ...and the rate policies bound the step against the replicas a period ago.
        self.changes.retain(|(t, _)| *t > now - 120.0);
        if target > n {
            let added: i32 =
                self.changes.iter().filter(|(t, d)| *t > now - 60.0 && *d > 0).map(|c| c.1).sum();
            let start = n - added;
            let limit = start + start.max(4);
            target = target.min(limit);
        } else if target < n {
            let removed: i32 = self.changes.iter().filter(|(_, d)| *d < 0).map(|c| -c.1).sum();
            let start = n + removed;
            target = target.max(start - 1);
        }
        let target = target.clamp(self.spec.min_replicas, self.spec.max_replicas);
        if target != n {
            self.changes.push_back((now, target - n));
        }
        let reason = format!("s={s:.2}");
        with_replicas(current, target, &reason)
    }
}

/// Knative's KPA on `num_requests_running`: target concurrency per pod 70 % of
/// `max_batch_size`; desired = ⌈average concurrency / target⌉ over the 60 s stable window, or
/// over the 6 s panic window while panicking (entered when the panic estimate reaches 200 % of
/// the ready pods, never scaling down while in it, left after a stable window without cause);
/// scale-down bounded by the default max-scale-down-rate 2; evaluated every 2 s.
#[derive(Debug, Clone)]
pub struct Kpa {
    spec: PlannerSpec,
    samples: VecDeque<(f64, f64)>,
    panic_since: Option<f64>,
    last_panic_cause: f64,
}

impl Kpa {
    /// For `spec`'s ranges.
    pub fn new(spec: &PlannerSpec) -> Kpa {
        Kpa { spec: spec.clone(), samples: VecDeque::new(), panic_since: None, last_panic_cause: f64::MIN }
    }
}

impl Policy for Kpa {
    fn name(&self) -> String {
        "kpa".into()
    }
    fn interval(&self) -> f64 {
        2.0
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let Some(running) = seen.observation.metrics.running else { return hold(current, "no metrics") };
        self.samples.push_back((now, running));
        while self.samples.front().is_some_and(|(t, _)| *t <= now - 60.0) {
            self.samples.pop_front();
        }
        let avg = |w: f64| {
            let v: Vec<f64> = self.samples.iter().filter(|(t, _)| *t > now - w).map(|s| s.1).collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let target = 0.7 * f64::from(current.max_batch_size);
        let stable = (avg(60.0) / target).ceil() as i32;
        let panic = (avg(6.0) / target).ceil() as i32;
        let ready = seen.observation.ready_replicas.max(1);
        if f64::from(panic) >= 2.0 * f64::from(ready) {
            self.panic_since.get_or_insert(now);
            self.last_panic_cause = now;
        } else if self.panic_since.is_some() && now - self.last_panic_cause >= 60.0 {
            self.panic_since = None;
        }
        let mut desired = if self.panic_since.is_some() { panic.max(current.replicas) } else { stable };
        // max-scale-down-rate 2: never below half the ready pods in one step.
        desired = desired.max((f64::from(ready) / 2.0).ceil() as i32);
        let desired = desired.clamp(self.spec.min_replicas, self.spec.max_replicas);
        let mode = if self.panic_since.is_some() { "panic" } else { "stable" };
        with_replicas(current, desired, &format!("{mode} concurrency {:.1}", avg(60.0)))
    }
}
