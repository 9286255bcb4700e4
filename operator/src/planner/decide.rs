//! The planner's rules. One call, one tick:
//!
//! 1. **Trust.** Missing or stale metrics, or too few requests for a percentile: hold the last
//!    decision and say why. The planner never scales on garbage.
//! 2. **Signal.** Per SLA dimension the ratio observed / target, smoothed; the SLA is violated
//!    above 1.0 and has headroom only well below it ([`HEADROOM`]): a hysteresis band.
//! 3. **Learn.** While the levers have been still for a whole window, the ratio of observed to
//!    predicted percentile corrects the capacity model for this tier and batch size.
//! 4. **Violation**, once it has lasted the scale-up stabilization: batch first when ITL binds
//!    and the replicas carry the load (live, no restart; one move per half window), the batch
//!    back when TTFT binds with ITL headroom, replicas for TTFT, queueing and a load the model
//!    says needs more (to the model's count, bounded per step), a faster tier only at max
//!    replicas and only when allowed.
//! 5. **Prediction.** Within target but the model says the load needs more replicas: add them
//!    before the percentile crosses.
//! 6. **Headroom**, once it has lasted the scale-down stabilization: restore precision first,
//!    then shed replicas (to the model's count, bounded), then raise the batch back.
//!
//! Guards: no scale-up while the last one is still starting, nor until the window reflects
//! it; a cooldown after a tier rollout; min/max bounds; Advisory mode only recommends.

use super::capacity::{CapacityModel, Prediction, Workload};
use super::levers::{Direction, Lever, Levers};
use super::observation::{Freshness, Observation, Quantile, Seconds};
use super::spec::PlannerSpec;
use super::{Change, Correction, Decision, History, Reason, SlaState, correction_key};

/// Weight of the newest ratio in the smoothed signal.
pub const SMOOTHING: f64 = 0.6;
/// Ratios below this on every dimension count as headroom.
pub const HEADROOM: f64 = 0.6;
/// Above this ratio, with the model predicting more replicas are needed, scale ahead.
pub const PREDICT_FROM: f64 = 0.8;
/// The share of each target the model plans for, leaving room for noise.
pub const PLAN_MARGIN: f64 = 0.8;
/// Weight of the newest observation in a learned correction.
pub const LEARNING_RATE: f64 = 0.3;
/// A scale-up whose pods are not ready after this long no longer blocks the next one.
pub const STARTING_TIMEOUT: Seconds = 600.0;
/// A violation this soon after a scale-in means the scale-in went too far.
pub const FLAP_WINDOW: Seconds = 1800.0;
/// A learned scale-in floor holds while the request rate is at least this share of the rate
/// it was learned at...
pub const FLOOR_LOAD_SHARE: f64 = 0.85;
/// ...and for this long.
pub const FLOOR_LIFETIME: Seconds = 6.0 * 3600.0;

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
    let mut ctx = Tick { spec, model, obs: observation, current: *current, now };
    // A spec edit can leave the levers outside the new ranges; bring them back first.
    let clamped = ctx.clamped();
    if clamped != *current {
        ctx.current = clamped;
        return ctx.finish(
            &mut history,
            clamped,
            Reason::OutOfRange,
            "the levers were outside the spec's ranges and were brought inside".into(),
            SlaState::Unknown,
        );
    }
    // The last scale-up is done once its replicas are ready (or it has taken too long).
    if let Some((target, at)) = history.pending_scale_up
        && (observation.ready_replicas >= target.min(current.replicas) || now - at > STARTING_TIMEOUT)
    {
        history.pending_scale_up = None;
    }

    match &observation.freshness {
        Freshness::Missing { reason } => {
            return ctx.hold(&mut history, Reason::MetricsMissing, format!("holding: no metrics ({reason})"));
        }
        Freshness::Stale { age } => {
            return ctx.hold(
                &mut history,
                Reason::MetricsStale,
                format!("holding: the newest metrics are {age:.0}s old"),
            );
        }
        Freshness::Fresh => {}
    }

    let m = &observation.metrics;
    let ratio = |q: &Quantile, target: Option<f64>| Some(q.seconds()? / target?);
    let raw_ttft = ratio(&m.ttft, Some(spec.ttft_target));
    let raw_itl = ratio(&m.itl, Some(spec.itl_target));
    let raw_e2e = ratio(&m.e2e, spec.e2e_target);
    if raw_ttft.is_none() && raw_itl.is_none() {
        return ctx.idle_or_blind(&mut history);
    }

    let smooth = |prev: Option<f64>, raw: Option<f64>| match (prev, raw) {
        (Some(p), Some(r)) => Some(SMOOTHING * r + (1.0 - SMOOTHING) * p),
        (_, r) => r,
    };
    history.ttft_ratio = smooth(history.ttft_ratio, raw_ttft);
    history.itl_ratio = smooth(history.itl_ratio, raw_itl);
    history.e2e_ratio = smooth(history.e2e_ratio, raw_e2e);
    let raw_max = [raw_ttft, raw_itl, raw_e2e].into_iter().flatten().fold(0.0, f64::max);
    let sla = if raw_max > 1.0 { SlaState::Violated } else { SlaState::Met };
    ctx.learn(&mut history);

    let ttft_side = history.ttft_ratio.unwrap_or(0.0).max(history.e2e_ratio.unwrap_or(0.0));
    let itl_side = history.itl_ratio.unwrap_or(0.0);
    let signal = ttft_side.max(itl_side);

    if signal > 1.0 {
        history.headroom_since = None;
        let since = *history.violating_since.get_or_insert(now);
        return ctx.on_violation(&mut history, since, ttft_side, itl_side, sla);
    }
    history.violating_since = None;
    if signal >= PREDICT_FROM
        && let Some(decision) = ctx.predicted_scale_up(&mut history, sla)
    {
        return decision;
    }
    if signal < HEADROOM {
        let since = *history.headroom_since.get_or_insert(now);
        return ctx.on_headroom(&mut history, since, sla);
    }
    history.headroom_since = None;
    ctx.finish(
        &mut history,
        *current,
        Reason::SlaMet,
        format!("the SLA holds at {:.0}% of its tightest target", signal * 100.0),
        sla,
    )
}

/// The inputs of one tick, and the rules as methods over them.
struct Tick<'a> {
    spec: &'a PlannerSpec,
    model: &'a CapacityModel,
    obs: &'a Observation,
    current: Levers,
    now: Seconds,
}

impl Tick<'_> {
    fn clamped(&self) -> Levers {
        let s = self.spec;
        let tier = if s.tier_rank(self.current.tier).is_some()
            && (s.allow_degrade || self.current.tier == s.preferred_tier)
        {
            self.current.tier
        } else {
            s.preferred_tier
        };
        Levers {
            replicas: self.current.replicas.clamp(s.min_replicas, s.max_replicas.max(s.min_replicas)),
            max_batch_size: self.current.max_batch_size.clamp(s.batch_min, s.batch_max.max(s.batch_min)),
            batch_wait_ms: self.current.batch_wait_ms,
            tier,
        }
    }

    fn workload(&self) -> Option<Workload> {
        Workload::from_metrics(&self.obs.metrics)
    }

    fn correction(&self, history: &History, levers: &Levers) -> Correction {
        history
            .correction
            .get(&correction_key(levers.tier, levers.max_batch_size))
            .copied()
            .unwrap_or_default()
    }

    /// The model's prediction for `levers` under the observed load, with the learned correction
    /// of that tier and batch; `None` when the model cannot say (no profile or no load figures).
    fn predicted(&self, history: &History, levers: &Levers) -> Option<(Prediction, Correction)> {
        let load = self.workload()?;
        let p = self.model.predict(
            levers.tier,
            levers.max_batch_size,
            levers.replicas,
            &load,
            self.spec.quantile(),
        )?;
        Some((p, self.correction(history, levers)))
    }

    /// Whether `levers` are predicted to meet every target scaled by `margin`, with the learned
    /// corrections; `None` when the model cannot say.
    fn meets(&self, history: &History, levers: &Levers, margin: f64) -> Option<bool> {
        let (p, c) = self.predicted(history, levers)?;
        Some(
            p.stable()
                && c.ttft * p.ttft <= margin * self.spec.ttft_target
                && c.itl * p.itl <= margin * self.spec.itl_target,
        )
    }

    /// Whether `levers` keep up with the load with TTFT within its target at the plan margin
    /// (ITL aside); `None` when the model cannot say.
    fn carries(&self, history: &History, levers: &Levers) -> Option<bool> {
        let (p, c) = self.predicted(history, levers)?;
        Some(p.stable() && c.ttft * p.ttft <= PLAN_MARGIN * self.spec.ttft_target)
    }

    /// The fewest replicas in `[min, max]` predicted to meet the targets at `margin`.
    fn replicas_needed(&self, history: &History, margin: f64) -> Option<i32> {
        let (min, max) = (self.spec.min_replicas, self.spec.max_replicas);
        for n in min..=max {
            if self.meets(history, &Levers { replicas: n, ..self.current }, margin)? {
                return Some(n);
            }
        }
        Some(max)
    }

    /// Updates the correction of the current tier and batch from this observation, when the
    /// levers have been still for a whole window (else the window mixes two configurations).
    fn learn(&self, history: &mut History) {
        let still_since = history.last_change.values().copied().fold(f64::NEG_INFINITY, f64::max);
        if self.now - still_since < self.spec.window || self.obs.ready_replicas < self.current.replicas {
            return;
        }
        let Some(load) = self.workload() else { return };
        let Some(p) = self.model.predict(
            self.current.tier,
            self.current.max_batch_size,
            self.current.replicas,
            &load,
            self.spec.quantile(),
        ) else {
            return;
        };
        if !p.stable() {
            return;
        }
        let key = correction_key(self.current.tier, self.current.max_batch_size);
        let entry = history.correction.entry(key).or_default();
        let update = |old: f64, observed: Option<f64>, predicted: f64| match observed {
            Some(o) if predicted > 0.0 => {
                let ratio = (o / predicted).clamp(0.25, 4.0);
                (1.0 - LEARNING_RATE) * old + LEARNING_RATE * ratio
            }
            _ => old,
        };
        entry.ttft = update(entry.ttft, self.obs.metrics.ttft.seconds(), p.ttft);
        entry.itl = update(entry.itl, self.obs.metrics.itl.seconds(), p.itl);
    }

    fn on_violation(
        &self,
        history: &mut History,
        since: Seconds,
        ttft_side: f64,
        itl_side: f64,
        sla: SlaState,
    ) -> Decision {
        let s = self.spec;
        let cur = self.current;
        let pct = |r: f64| format!("{:.0}%", r * 100.0);
        if let Some(at) = history.tier_changed_at
            && self.now - at < self.cooldown()
        {
            return self.hold_with(
                history,
                Reason::Cooldown,
                format!(
                    "violated, but a tier rollout started {:.0}s ago; waiting {:.0}s for it to settle",
                    self.now - at,
                    self.cooldown()
                ),
                sla,
            );
        }
        if let Some((target, _)) = history.pending_scale_up {
            return self.hold_with(
                history,
                Reason::ScaleUpInProgress,
                format!(
                    "violated, but the scale-up to {target} replicas is still starting ({} ready)",
                    self.obs.ready_replicas
                ),
                sla,
            );
        }
        if self.now - since < s.scale_up_stabilization {
            return self.hold_with(
                history,
                Reason::Stabilizing,
                format!(
                    "violated for {:.0}s of the {:.0}s scale-up stabilization window",
                    self.now - since,
                    s.scale_up_stabilization
                ),
                sla,
            );
        }
        // The batch acts within a step, but the window's percentile shows it only as new
        // requests replace old ones: one batch move per half window, so a lagging percentile
        // does not walk the batch to its minimum.
        // A scale-up changes the steps too (fewer rows per replica): it counts as a move.
        let batch_moved = [Lever::Batch.as_str(), "replicas_up"]
            .iter()
            .filter_map(|k| history.last_change.get(*k).copied())
            .reduce(f64::max);
        let batch_settling = batch_moved.is_some_and(|t| self.now - t < s.window / 2.0);
        let batch_may_move = |d: &str| {
            batch_settling.then(|| {
                format!(
                    "{d}, but the batch or the replicas moved {:.0}s ago; waiting {:.0}s for the window to show the effect",
                    self.now - batch_moved.unwrap_or(self.now),
                    s.window / 2.0
                )
            })
        };
        // Batch first when ITL binds: it is live and restarts nothing. But a smaller batch
        // also serves fewer requests per step: when the model says the load needs more
        // replicas than run, cutting it would trade ITL for queueing, so replicas come first.
        let cut = || self.batch_for_itl(history).unwrap_or(cur.max_batch_size * 3 / 4);
        // A cut that has had half a window to show and left ITL within 10 % of where it was
        // did not help: the steps are slow for another reason, and more replicas share it.
        let cut_did_not_help = history.batch_cut.is_some_and(|(before, at)| {
            let age = self.now - at;
            age >= s.window / 2.0 && age <= 2.0 * s.window && itl_side >= 0.9 * before
        });
        let load_needs_replicas = cur.replicas < s.max_replicas
            && cur.max_batch_size > s.batch_min
            && (cut_did_not_help
                || self.carries(history, &Levers { max_batch_size: cut().max(s.batch_min), ..cur })
                    == Some(false));
        if itl_side >= ttft_side && cur.max_batch_size > s.batch_min && !load_needs_replicas {
            if let Some(why) = batch_may_move(&format!("ITL is at {} of target", pct(itl_side))) {
                return self.hold_with(history, Reason::Stabilizing, why, sla);
            }
            let next = cut().clamp(s.batch_min, cur.max_batch_size - 1);
            let levers = Levers { max_batch_size: next, ..cur };
            if s.enforce {
                history.batch_cut = Some((itl_side, self.now));
            }
            return self.finish(
                history,
                levers,
                Reason::ItlViolated,
                format!(
                    "ITL is at {} of target: max batch size {} → {next} to shorten each step",
                    pct(itl_side),
                    cur.max_batch_size
                ),
                sla,
            );
        }
        // TTFT binds while ITL has headroom and the batch sits below its configured size (an
        // earlier cut for ITL): give the batch back first. It is live, and a batch too small for
        // the load queues requests however many replicas run.
        if ttft_side > itl_side
            && itl_side < HEADROOM
            && cur.max_batch_size < s.batch_initial
            && !batch_settling
        {
            let next = cur.max_batch_size.saturating_mul(2).min(s.batch_initial);
            let levers = Levers { max_batch_size: next, ..cur };
            return self.finish(
                history,
                levers,
                Reason::TtftViolated,
                format!(
                    "TTFT is at {} of target while ITL is at {}: max batch size {} → {next} to serve more per step",
                    pct(ttft_side),
                    pct(itl_side),
                    cur.max_batch_size
                ),
                sla,
            );
        }
        // The last scale-up is ready, but the window still holds latencies from before it: add
        // more only if the model agrees that more are needed.
        let recent_up = history.last_change.get("replicas_up").is_some_and(|t| self.now - t < s.window);
        let needed = self.replicas_needed(history, PLAN_MARGIN);
        if recent_up && needed.is_some_and(|n| n <= cur.replicas) {
            return self.hold_with(history, Reason::ScaleUpInProgress, format!(
                "violated, but the window still holds latencies from before the last scale-up and the model says {} replicas suffice",
                cur.replicas
            ), sla);
        }
        if cur.replicas < s.max_replicas {
            let step_bound = (cur.replicas * 2).max(cur.replicas + 4);
            let next =
                needed.unwrap_or(cur.replicas + 1).max(cur.replicas + 1).min(step_bound).min(s.max_replicas);
            let (reason, what) = if itl_side > ttft_side && cut_did_not_help {
                (
                    Reason::ItlViolated,
                    format!("ITL is at {} of target, and the last batch cut did not lower it", pct(itl_side)),
                )
            } else if itl_side > ttft_side && load_needs_replicas {
                (
                    Reason::ItlViolated,
                    format!(
                        "ITL is at {} of target, and a smaller batch would not carry the load",
                        pct(itl_side)
                    ),
                )
            } else if itl_side > ttft_side {
                (
                    Reason::ItlViolated,
                    format!("ITL is at {} of target with the batch at its minimum", pct(itl_side)),
                )
            } else {
                (Reason::TtftViolated, format!("TTFT is at {} of target", pct(ttft_side)))
            };
            history.pending_scale_up = Some((next, self.now));
            history.batch_cut = None;
            self.learn_floor(history, next);
            let levers = Levers { replicas: next, ..cur };
            return self.finish(
                history,
                levers,
                reason,
                format!("{what}: replicas {} → {next}", cur.replicas),
                sla,
            );
        }
        // At max replicas: a faster tier, one step, when the spec allows.
        if s.allow_degrade
            && let Some(rank) = s.tier_rank(cur.tier)
            && let Some(faster) = s.tiers.get(rank + 1)
        {
            history.tier_changed_at = Some(self.now);
            let levers = Levers { tier: *faster, ..cur };
            return self.finish(history, levers, Reason::DegradedForLatency, format!(
                "violated at {} of target with all {} replicas: tier {} → {faster} (faster, less precise)",
                pct(ttft_side.max(itl_side)),
                cur.replicas,
                cur.tier
            ), sla);
        }
        let mut d = self.hold_with(
            history,
            Reason::AtMaxReplicas,
            format!(
                "violated at {} of target with all {} replicas and no faster tier allowed",
                pct(ttft_side.max(itl_side)),
                cur.replicas
            ),
            sla,
        );
        d.scaling_limited = true;
        d
    }

    /// Within target, but the load now needs more replicas than run: add them ahead.
    fn predicted_scale_up(&self, history: &mut History, sla: SlaState) -> Option<Decision> {
        let cur = self.current;
        if history.pending_scale_up.is_some()
            || history.tier_changed_at.is_some_and(|t| self.now - t < self.cooldown())
        {
            return None;
        }
        let needed = self.replicas_needed(history, 1.0)?;
        if needed <= cur.replicas {
            return None;
        }
        let next = needed.min((cur.replicas * 2).max(cur.replicas + 4)).min(self.spec.max_replicas);
        if next <= cur.replicas {
            return None;
        }
        history.pending_scale_up = Some((next, self.now));
        self.learn_floor(history, next);
        let load = self.workload().map_or(0.0, |w| w.request_rate);
        Some(self.finish(history, Levers { replicas: next, ..cur }, Reason::LoadPredicted, format!(
            "{load:.2} requests/s needs {needed} replicas by the capacity model: replicas {} → {next} before the SLA breaks",
            cur.replicas
        ), sla))
    }

    fn on_headroom(&self, history: &mut History, since: Seconds, sla: SlaState) -> Decision {
        let s = self.spec;
        let cur = self.current;
        if self.now - since < s.scale_down_stabilization {
            return self.finish(
                history,
                cur,
                Reason::SlaMet,
                format!(
                    "the SLA holds with headroom for {:.0}s of the {:.0}s scale-down stabilization window",
                    self.now - since,
                    s.scale_down_stabilization
                ),
                sla,
            );
        }
        // Precision first. A restore the model says would break the SLA waits (and so does
        // shedding: capacity given away now would be needed for the restore).
        if let (Some(rank), Some(preferred)) = (s.tier_rank(cur.tier), s.tier_rank(s.preferred_tier))
            && rank > preferred
        {
            let precise = s.tiers[rank - 1];
            let candidate = Levers { tier: precise, ..cur };
            if self.meets(history, &candidate, PLAN_MARGIN) == Some(false) {
                return self.finish(history, cur, Reason::SlaMet, format!(
                    "headroom, but the model says tier {precise} would break the SLA at {} replicas; staying at {}",
                    cur.replicas, cur.tier
                ), sla);
            }
            history.tier_changed_at = Some(self.now);
            history.headroom_since = Some(self.now);
            return self.finish(
                history,
                candidate,
                Reason::PrecisionRestored,
                format!(
                    "headroom for {:.0}s: tier {} → {precise} (more precise)",
                    self.now - since,
                    cur.tier
                ),
                sla,
            );
        }
        if cur.replicas > s.min_replicas {
            // Shed to the model's count, at most a quarter (at least one) per stabilization window.
            let bound = cur.replicas - (cur.replicas / 4).max(1);
            let mut next = self
                .replicas_needed(history, PLAN_MARGIN)
                .unwrap_or(cur.replicas - 1)
                .max(bound)
                .max(s.min_replicas);
            if let Some(floor) = self.floor(history)
                && next < floor
            {
                next = floor;
                if next >= cur.replicas {
                    return self.finish(history, cur, Reason::ShedFloor, format!(
                        "headroom, but at this load fewer than {floor} replicas broke the SLA after the last scale-in; staying at {}",
                        cur.replicas
                    ), sla);
                }
            }
            if next < cur.replicas {
                let rate = self.obs.metrics.request_rate.unwrap_or(0.0);
                history.last_shed = Some((cur.replicas, rate, self.now));
                history.headroom_since = Some(self.now);
                return self.finish(
                    history,
                    Levers { replicas: next, ..cur },
                    Reason::ReplicasShed,
                    format!("headroom for {:.0}s: replicas {} → {next}", self.now - since, cur.replicas),
                    sla,
                );
            }
        }
        if cur.max_batch_size < s.batch_initial {
            let doubled = cur.max_batch_size.saturating_mul(2).min(s.batch_initial);
            let candidate = Levers { max_batch_size: doubled, ..cur };
            if self.meets(history, &candidate, PLAN_MARGIN) != Some(false) {
                history.headroom_since = Some(self.now);
                return self.finish(
                    history,
                    candidate,
                    Reason::BatchRestored,
                    format!(
                        "headroom for {:.0}s: max batch size {} → {doubled}",
                        self.now - since,
                        cur.max_batch_size
                    ),
                    sla,
                );
            }
        }
        self.finish(
            history,
            cur,
            Reason::SlaMet,
            "the SLA holds with headroom at the lowest cost allowed".into(),
            sla,
        )
    }

    /// A scale-up soon after a scale-in that it undoes: remember that fewer replicas than
    /// before the scale-in do not hold this load.
    fn learn_floor(&self, history: &mut History, next: i32) {
        if let Some((before, rate, at)) = history.last_shed
            && self.now - at < FLAP_WINDOW
            && next >= before.min(self.current.replicas + 1)
        {
            history.shed_floor = Some((before.min(next), rate, self.now));
            history.last_shed = None;
        }
    }

    /// The learned scale-in floor, while the load is as high as when it was learned.
    fn floor(&self, history: &History) -> Option<i32> {
        let (replicas, rate, at) = history.shed_floor?;
        let now_rate = self.obs.metrics.request_rate?;
        (self.now - at < FLOOR_LIFETIME && now_rate >= FLOOR_LOAD_SHARE * rate).then_some(replicas)
    }

    /// No percentile to judge by. With the request rate known to be near zero the service is
    /// idle: the headroom rules may give back capacity and precision. Otherwise hold.
    fn idle_or_blind(&self, history: &mut History) -> Decision {
        let m = &self.obs.metrics;
        let samples = m.ttft.samples().or(m.itl.samples()).unwrap_or(0.0);
        let idle = m.request_rate.is_some_and(|r| r * self.spec.window < super::MIN_SAMPLES);
        if idle {
            history.violating_since = None;
            let since = *history.headroom_since.get_or_insert(self.now);
            let mut d = self.on_headroom(history, since, SlaState::Unknown);
            if d.change.is_none() {
                d.reason = Reason::TooFewSamples;
                d.message = format!("idle: {samples:.0} requests in the window, too few for a percentile");
            }
            return d;
        }
        let reason = match (&m.ttft, &m.itl) {
            (Quantile::Missing, Quantile::Missing) => Reason::MetricsMissing,
            _ => Reason::TooFewSamples,
        };
        let message = if reason == Reason::MetricsMissing {
            "holding: the latency histograms have no series for this service".to_string()
        } else {
            format!("holding: {samples:.0} requests in the window, too few for a percentile")
        };
        self.hold(history, reason, message)
    }

    /// A tier rollout replaces every pod; judge the new tier only after the window has turned
    /// over at least halfway, and never sooner than two evaluations.
    fn cooldown(&self) -> Seconds {
        (self.spec.window / 2.0).max(2.0 * self.spec.evaluation_interval)
    }

    /// The largest batch in range predicted to meet ITL at the plan margin.
    fn batch_for_itl(&self, history: &History) -> Option<u32> {
        let s = self.spec;
        let load = self.workload()?;
        let mut best = None;
        for b in s.batch_min..=self.current.max_batch_size {
            let levers = Levers { max_batch_size: b, ..self.current };
            let p = self.model.predict(levers.tier, b, levers.replicas, &load, s.quantile())?;
            let c = self.correction(history, &self.current);
            if p.stable() && c.itl * p.itl <= PLAN_MARGIN * s.itl_target {
                best = Some(b);
            }
        }
        best
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
        let change = lever_change(&cur, &next);
        let enforce = self.spec.enforce || reason == Reason::OutOfRange;
        if let Some(c) = &change {
            if enforce {
                let key = match (c.lever, c.direction) {
                    (Lever::Replicas, Direction::Up) => "replicas_up".to_string(),
                    (Lever::Replicas, Direction::Down) => "replicas_down".to_string(),
                    (lever, _) => lever.as_str().to_string(),
                };
                history.last_change.insert(key, self.now);
                history.changes.retain(|t| self.now - t < 3600.0);
                history.changes.push(self.now);
            } else {
                // Advisory: nothing moves, so nothing is starting or cooling down.
                history.pending_scale_up = None;
                history.tier_changed_at = None;
            }
        }
        let levers = if enforce { next } else { cur };
        let message =
            if enforce || change.is_none() { message } else { format!("advisory: would act: {message}") };
        Decision {
            levers,
            recommended: next,
            change,
            reason,
            message,
            sla,
            degraded: levers.tier != self.spec.preferred_tier,
            scaling_limited: false,
            history: history.clone(),
        }
    }
}

/// The one lever that differs between `from` and `to` (the planner moves one per decision),
/// with its direction.
fn lever_change(from: &Levers, to: &Levers) -> Option<Change> {
    let direction = |up: bool| if up { Direction::Up } else { Direction::Down };
    if from.replicas != to.replicas {
        return Some(Change {
            lever: Lever::Replicas,
            direction: direction(to.replicas > from.replicas),
            from: from.replicas.to_string(),
            to: to.replicas.to_string(),
        });
    }
    if from.tier != to.tier {
        // Tiers are ranked by the spec; the caller knows the rank, here "up" means towards f32.
        let up = tier_precision(to.tier) > tier_precision(from.tier);
        return Some(Change {
            lever: Lever::Tier,
            direction: direction(up),
            from: from.tier.to_string(),
            to: to.tier.to_string(),
        });
    }
    if from.max_batch_size != to.max_batch_size || from.batch_wait_ms != to.batch_wait_ms {
        return Some(Change {
            lever: Lever::Batch,
            direction: direction(to.max_batch_size > from.max_batch_size),
            from: from.max_batch_size.to_string(),
            to: to.max_batch_size.to_string(),
        });
    }
    None
}

/// Bits of weight precision, for the direction of a tier change.
fn tier_precision(tier: pacer_crds::Tier) -> u32 {
    match tier {
        pacer_crds::Tier::F32 => 32,
        pacer_crds::Tier::Q8_0 => 8,
        pacer_crds::Tier::Native => 5,
        pacer_crds::Tier::Q4_0 => 4,
    }
}
