//! One tick of the planner: predict, then act.
//!
//! 1. **Trust.** Missing or stale metrics, or too few requests for a percentile while traffic
//!    flows: hold the last decision and say why. The planner never scales on garbage.
//! 2. **Verdict.** The windowed percentiles against the targets: the SLA is `Met` or
//!    `Violated`. The verdict is what status reports; it does not size anything.
//! 3. **Learn.** While the levers have been still for a whole window and every replica is
//!    ready, observed / predicted corrects the capacity model for this configuration.
//! 4. **Forecast** the load over the horizon a decision needs to work ([`Forecast`]).
//! 5. **Choose** the cheapest configuration predicted to carry the forecast within
//!    [`MARGIN`] of the targets ([`choose::cheapest`](super::choose::cheapest)), and move
//!    toward it:
//!    - more replicas than run: add them in one step, to the count the model says; when the
//!      replicas ready now are predicted to fall behind before the new ones start, tighten the
//!      batch settings at once (the fast lever) and give them back when the replicas are
//!      ready;
//!    - the same replicas with other batch settings or a faster tier: move those;
//!    - fewer replicas or a more precise tier, at the forecast's scale-down load within
//!      [`SHED_MARGIN`] (a hysteresis band), for the scale-down stabilization: restore
//!      precision first, then shed.
//! 6. **React** when the verdict says violated and the model says the configuration holds:
//!    the model is wrong here, so after the scale-up stabilization its correction is raised to
//!    what was observed and one replica more is added at least.
//!
//! Where the engines read their batch settings only at start (vLLM), a batch move is a rollout
//! like a tier's: charged its cost in the search, never a warm-up cover, never made with a
//! scale-up, and followed by the same cooldown.
//!
//! Guards: a rollout's cooldown; bounds; Advisory mode only recommends; a scale-up's
//! starting replicas count as capacity (the levers hold the desired count).

mod act;
mod changes;
mod fallback;
mod learn;
mod signals;

pub use changes::lever_changes;
pub use signals::{SHAPE_SMOOTHING, SHAPE_SMOOTHING_UP, due, note};

use super::capacity::{CapacityModel, Workload};
use super::choose::{self, Choice, engine_config};
use super::forecast::Forecast;
use super::levers::{Direction, Lever, Levers};
use super::observation::{Freshness, Observation, Quantile, Seconds, ServiceMetrics};
use super::spec::PlannerSpec;
use super::{Decision, History, Reason, SlaState, correction_for};

/// Weight of the newest ratio in the smoothed signal (reported, and the headroom test of an
/// unprofiled service).
pub const SMOOTHING: f64 = 0.6;
/// The share of each target a configuration must be predicted within to be chosen (room for
/// one window's percentile to sit above the mean of many).
pub const MARGIN: f64 = 0.95;
/// The load a configuration must carry, as a multiple of the forecast: capacity headroom.
/// Headroom is planned in load, not in latency: a latency curve is flat until the queue
/// builds and then steep, so a latency margin buys nothing on its flat part, and where a
/// latency floor (a long prompt's prefill) sits near the target it asks for replicas that do
/// not help.
pub const LOAD_HEADROOM: f64 = 1.1;
/// The share of each target a smaller configuration must be predicted within before capacity
/// is given back...
pub const SHED_MARGIN: f64 = 0.9;
/// ...carrying this multiple of the scale-down load (the peak rate of the scale-down
/// stabilization window): with the peak and the tighter margin, a hysteresis band, so a load
/// at the edge does not flap.
pub const SHED_HEADROOM: f64 = 1.1;
/// Weight of the newest observation in a learned correction...
pub const LEARNING_RATE: f64 = 0.3;
/// ...and when the observation says the model was optimistic (err toward the SLA).
pub const LEARNING_RATE_UP: f64 = 0.5;
/// A scale-up whose pods are not ready after this long no longer counts as starting.
pub const STARTING_TIMEOUT: Seconds = 600.0;
/// The replica start assumed before one has been seen.
pub const DEFAULT_POD_START: Seconds = 60.0;
/// An unprofiled service sheds a replica when every ratio is below this.
pub const HEADROOM: f64 = 0.6;

/// Decides the levers for the next interval. Pure: same inputs, same decision.
pub fn decide(
    spec: &PlannerSpec,
    model: &CapacityModel,
    observation: &Observation,
    current: &Levers,
    history: &History,
    now: Seconds,
) -> Decision {
    let mut history = history.clone();
    history.evaluated_at = Some(now);
    let mut tick = Round { spec, model, obs: observation, current: *current, now };
    // A spec edit can leave the levers outside the new ranges; bring them back first.
    let clamped = tick.clamped();
    if clamped != *current {
        tick.current = clamped;
        return tick.finish(
            &mut history,
            clamped,
            Reason::OutOfRange,
            "the levers were outside the spec's ranges and were brought inside".into(),
            SlaState::Unknown,
        );
    }
    settle_scale_up(&mut history, observation.ready_replicas, current.replicas, spec, now);

    match &observation.freshness {
        Freshness::Missing { reason } => {
            return tick.hold(
                &mut history,
                Reason::MetricsMissing,
                format!("holding: no metrics ({reason})"),
            );
        }
        Freshness::Stale { age } => {
            return tick.hold(
                &mut history,
                Reason::MetricsStale,
                format!("holding: the newest metrics are {age:.0}s old"),
            );
        }
        Freshness::Fresh => {}
    }
    let growth = signals::in_flight_growth(observation, &history);
    note(observation, &mut history);
    // A tier no profile covers: learn its steps from this window, and predict with the fit
    // once it is ready and has explained a still window (below).
    let learnt = tick.learn_steps(&mut history).then(|| model.with_online(&history.online, false));
    let tick = match &learnt {
        Some(m) => Round { model: m, spec, obs: observation, current: tick.current, now },
        None => tick,
    };

    let Some((verdict, sla)) = judge(&mut history, &observation.metrics, spec, now) else {
        return tick.idle_or_blind(&mut history);
    };
    tick.learn(&mut history);
    let checked = learnt.as_ref().map(|_| model.with_online(&history.online, true));
    let tick = match &checked {
        Some(m) => Round { model: m, ..tick },
        None => tick,
    };
    signals::remember(observation, &mut history, spec.scale_down_stabilization, now);
    if sla == SlaState::Met {
        signals::carried(observation, tick.current, &mut history);
    }

    match tick.plan(&history, growth) {
        Some(plan) => tick.act(&mut history, &plan, verdict, sla),
        None => tick.reactive(&mut history, verdict, sla),
    }
}

/// Ends the last scale-up once its replicas are ready (or it has taken too long); how long it
/// took is the horizon of the next forecasts.
fn settle_scale_up(history: &mut History, ready: i32, replicas: i32, spec: &PlannerSpec, now: Seconds) {
    if let Some((target, at)) = history.pending_scale_up {
        if ready >= target.min(replicas) {
            let took = (now - at).max(spec.evaluation_interval);
            history.pod_start = Some(match history.pod_start {
                Some(p) => 0.5 * p + 0.5 * took,
                None => took,
            });
            history.pending_scale_up = None;
        } else if now - at > STARTING_TIMEOUT {
            history.pending_scale_up = None;
        }
    }
}

/// The verdict of the windowed percentiles against the targets, with the smoothed ratios and
/// the violation's start kept in `history`; `None` (and `history` untouched) when neither TTFT
/// nor ITL has a percentile.
fn judge(
    history: &mut History,
    m: &ServiceMetrics,
    spec: &PlannerSpec,
    now: Seconds,
) -> Option<(Verdict, SlaState)> {
    let ratio = |q: &Quantile, target: Option<f64>| Some(q.seconds()? / target?);
    let raw_ttft = ratio(&m.ttft, Some(spec.ttft_target));
    let raw_itl = ratio(&m.itl, Some(spec.itl_target));
    let raw_e2e = ratio(&m.e2e, spec.e2e_target);
    if raw_ttft.is_none() && raw_itl.is_none() {
        return None;
    }
    let smooth = |prev: Option<f64>, raw: Option<f64>| match (prev, raw) {
        (Some(p), Some(r)) => Some(SMOOTHING * r + (1.0 - SMOOTHING) * p),
        (_, r) => r,
    };
    history.ttft_ratio = smooth(history.ttft_ratio, raw_ttft);
    history.itl_ratio = smooth(history.itl_ratio, raw_itl);
    history.e2e_ratio = smooth(history.e2e_ratio, raw_e2e);
    let verdict =
        Verdict { ttft: raw_ttft.unwrap_or(0.0).max(raw_e2e.unwrap_or(0.0)), itl: raw_itl.unwrap_or(0.0) };
    let sla = if verdict.worst() > 1.0 { SlaState::Violated } else { SlaState::Met };
    if sla == SlaState::Violated {
        history.violating_since.get_or_insert(now);
    } else {
        history.violating_since = None;
    }
    Some((verdict, sla))
}

/// The windowed percentiles over their targets (E2E counts with TTFT).
#[derive(Debug, Clone, Copy)]
struct Verdict {
    ttft: f64,
    itl: f64,
}

impl Verdict {
    fn worst(&self) -> f64 {
        self.ttft.max(self.itl)
    }
}

/// What the model says at this tick.
struct Plan {
    forecast: Forecast,
    shape: Workload,
    /// The cheapest configuration carrying the forecast within [`MARGIN`].
    up: Choice,
    /// The cheapest carrying the scale-down load within [`SHED_MARGIN`].
    down: Option<Choice>,
    /// Per-replica capacity of the current configuration within [`MARGIN`].
    current_capacity: f64,
    /// The load to carry: the forecast with [`LOAD_HEADROOM`].
    need_up: f64,
    /// The load a smaller configuration must carry: the scale-down load with
    /// [`SHED_HEADROOM`].
    need_down: f64,
}

/// The inputs of one tick, and the steps as methods over them.
struct Round<'a> {
    spec: &'a PlannerSpec,
    model: &'a CapacityModel,
    obs: &'a Observation,
    current: Levers,
    now: Seconds,
}

impl Round<'_> {
    fn clamped(&self) -> Levers {
        let s = self.spec;
        let tier = if s.tier_rank(self.current.tier).is_some()
            && (s.allow_degrade || self.current.tier == s.preferred_tier)
        {
            self.current.tier
        } else {
            s.preferred_tier
        };
        let batch = self.current.max_batch_size.clamp(s.batch_min, s.batch_max.max(s.batch_min));
        Levers {
            replicas: self.current.replicas.clamp(s.min_replicas, s.max_replicas.max(s.min_replicas)),
            max_batch_size: batch,
            batch_wait_ms: self.current.batch_wait_ms,
            max_num_batched_tokens: self
                .current
                .max_num_batched_tokens
                .clamp(s.budget_min, s.budget_max.max(s.budget_min))
                .max(batch),
            tier,
        }
    }

    fn rate_window(&self) -> Seconds {
        self.spec.rate_window()
    }

    fn horizon(&self, history: &History) -> Seconds {
        history.pod_start.unwrap_or(DEFAULT_POD_START) + 2.0 * self.spec.evaluation_interval
    }

    /// The forecast and the configurations it calls for; `None` when the model cannot say (no
    /// profile for the tiers, or no load figures).
    fn plan(&self, history: &History, growth: Option<f64>) -> Option<Plan> {
        let seen = Workload::from_metrics(&self.obs.metrics)?;
        let shape = match history.shape {
            Some(s) => Workload {
                prompt_tokens: s.prompt,
                prompt_tail: s.prompt_tail,
                output_tokens: s.output,
                ..seen
            },
            None => seen,
        };
        let mut forecast =
            Forecast::from_metrics(&self.obs.metrics, self.rate_window(), self.horizon(history), growth)?;
        // Capacity goes back only below the peak of the rates seen over the scale-down
        // stabilization window, as a bursty load's quiet minute is no promise.
        forecast.down = history.recent_rates.iter().map(|(_, r)| *r).fold(forecast.down, f64::max);
        let tiers = choose::tiers(self.spec);
        let (need_up, need_down) = (forecast.up * LOAD_HEADROOM, forecast.down * SHED_HEADROOM);
        let search = choose::Search {
            spec: self.spec,
            model: self.model,
            history,
            current: &self.current,
            shape: &shape,
        };
        let ask = |rate: f64, margin: f64| choose::Ask { rate, margin, replicas: None, tiers: &tiers };
        let up = choose::cheapest(&search, &ask(need_up, MARGIN))?;
        let down = choose::cheapest(&search, &ask(need_down, SHED_MARGIN));
        let current_capacity =
            choose::per_replica(self.spec, self.model, history, &self.current, &shape, MARGIN).unwrap_or(0.0);
        Some(Plan { forecast, shape, up, down, current_capacity, need_up, need_down })
    }

    /// Seconds since any lever last moved.
    fn still_for(&self, history: &History) -> Seconds {
        self.now - history.last_change.values().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    fn in_cooldown(&self, history: &History) -> bool {
        history.tier_changed_at.is_some_and(|at| self.now - at < self.cooldown(history))
    }

    /// A tier rollout replaces every pod; judge the new tier only after the window has turned
    /// over at least halfway, and never sooner than two evaluations. Where batch settings roll
    /// the pods too, never before a pod start and two evaluations have passed: another rollout
    /// sooner would replace the surge pods before they are ready.
    fn cooldown(&self, history: &History) -> Seconds {
        let base = (self.spec.window / 2.0).max(2.0 * self.spec.evaluation_interval);
        if self.spec.batch_rolls { base.max(self.horizon(history)) } else { base }
    }

    /// One sentence on the prediction a move rests on.
    fn predicted(&self, plan: &Plan, history: &History, levers: &Levers) -> String {
        let load = plan.shape.at_rate(plan.forecast.up);
        let config = engine_config(levers, self.spec);
        let c = correction_for(history, &config);
        let Some(p) = self.model.predict(&config, levers.replicas, &load, self.spec.quantile()) else {
            return format!("forecast {:.2} req/s", plan.forecast.up);
        };
        let ms = |s: f64| if s.is_finite() { format!("{:.0} ms", s * 1000.0) } else { "∞".into() };
        format!(
            "forecast {:.2} req/s (now {:.2}, {:.0} waiting); {} replica{} predict P{} TTFT {} of {:.0}, ITL {} of {:.0}",
            plan.forecast.up,
            plan.forecast.short,
            plan.forecast.waiting,
            levers.replicas,
            if levers.replicas == 1 { "" } else { "s" },
            self.spec.percentile,
            ms(c.ttft * p.ttft),
            self.spec.ttft_target * 1000.0,
            ms(c.itl * p.itl),
            self.spec.itl_target * 1000.0
        )
    }

    /// Why capacity goes up: ahead of a violation while the SLA holds (`LoadPredicted`), else
    /// the dimension the verdict (or, without one, the prediction) says is worse.
    fn up_reason(&self, plan: &Plan, history: &History, verdict: Verdict, sla: SlaState) -> Reason {
        let (ttft, itl) = if sla == SlaState::Violated {
            (verdict.ttft, verdict.itl)
        } else {
            let config = engine_config(&self.current, self.spec);
            let c = correction_for(history, &config);
            let load = plan.shape.at_rate(plan.forecast.up);
            match self.model.predict(&config, self.current.replicas, &load, self.spec.quantile()) {
                Some(p) if p.stable() => {
                    (c.ttft * p.ttft / self.spec.ttft_target, c.itl * p.itl / self.spec.itl_target)
                }
                _ => (f64::INFINITY, 0.0),
            }
        };
        if sla == SlaState::Met {
            Reason::LoadPredicted
        } else if itl > ttft {
            Reason::ItlViolated
        } else {
            Reason::TtftViolated
        }
    }

    /// The words a batch move adds where it rolls the pods.
    fn rolled(&self) -> &'static str {
        if self.spec.batch_rolls { ", a rolling update (the engines read them at start)" } else { "" }
    }

    fn hold(&self, history: &mut History, reason: Reason, message: String) -> Decision {
        self.hold_with(history, reason, message, SlaState::Unknown)
    }

    fn hold_with(&self, history: &mut History, reason: Reason, message: String, sla: SlaState) -> Decision {
        self.finish(history, self.current, reason, message, sla)
    }

    /// The decision for `next`: applied in Enforce mode, only recommended in Advisory mode.
    fn finish(
        &self,
        history: &mut History,
        next: Levers,
        reason: Reason,
        message: String,
        sla: SlaState,
    ) -> Decision {
        let cur = self.current;
        let changes = lever_changes(&cur, &next);
        let enforce = self.spec.enforce || reason == Reason::OutOfRange;
        if !changes.is_empty() {
            if enforce {
                for c in &changes {
                    let key = match (c.lever, c.direction) {
                        (Lever::Replicas, Direction::Up) => "replicas_up".to_string(),
                        (Lever::Replicas, Direction::Down) => "replicas_down".to_string(),
                        (lever, _) => lever.as_str().to_string(),
                    };
                    history.last_change.insert(key, self.now);
                }
                history.changes.retain(|t| self.now - t < 3600.0);
                history.changes.push(self.now);
                if self.spec.batch_rolls && changes.iter().any(|c| c.lever == Lever::Batch) {
                    history.tier_changed_at = Some(self.now);
                }
            } else {
                // Advisory: nothing moves, so nothing is starting, covering or cooling down.
                history.pending_scale_up = None;
                history.tier_changed_at = None;
                history.cover = None;
            }
        }
        let levers = if enforce { next } else { cur };
        let message =
            if enforce || changes.is_empty() { message } else { format!("advisory: would act: {message}") };
        Decision {
            levers,
            recommended: next,
            change: changes.first().cloned(),
            changes,
            reason,
            message,
            sla,
            degraded: levers.tier != self.spec.preferred_tier,
            scaling_limited: false,
            history: history.clone(),
        }
    }
}
