//! The planner's paths when the model cannot lead: a violation the model did not predict (or
//! no model at all), the scale-down rule of a service without a profile, and an idle or blind
//! service (no percentile to judge by).

use super::super::capacity::Workload;
use super::super::choose::engine_config;
use super::super::levers::Levers;
use super::super::observation::Quantile;
use super::super::{Decision, History, Reason, SlaState, correction_for, correction_key};
use super::{HEADROOM, Round, Verdict};

impl Round<'_> {
    /// The percentiles say violated and the model cannot say (no profile, no load figures) or
    /// says the configuration holds: after the scale-up stabilization, and once the last move
    /// has had half a window to show, raise the correction to what was observed and add a
    /// replica (or, at max replicas, the next faster tier when allowed).
    pub(super) fn reactive(&self, history: &mut History, verdict: Verdict, sla: SlaState) -> Decision {
        if sla != SlaState::Violated {
            // No model, and the SLA holds: shed by the smoothed ratios alone.
            return self.unprofiled_headroom(history, sla);
        }
        history.headroom_since = None;
        if let Some(hold) = self.not_yet(history, verdict, sla) {
            return hold;
        }
        // The model was optimistic here: learn it now, not after a whole window.
        self.correct_to_observed(history);
        self.add_capacity(history, verdict, sla)
    }

    /// Why a violation does not act yet: it has not lasted the scale-up stabilization, the last
    /// scale-up is still starting, a rollout cools down, or the last move has not had a window
    /// to show.
    fn not_yet(&self, history: &mut History, verdict: Verdict, sla: SlaState) -> Option<Decision> {
        let s = self.spec;
        let since = history.violating_since.unwrap_or(self.now);
        let pct = |r: f64| format!("{:.0}%", r * 100.0);
        if self.now - since < s.scale_up_stabilization {
            return Some(self.hold_with(
                history,
                Reason::Stabilizing,
                format!(
                    "violated ({} of target) for {:.0}s of the {:.0}s scale-up stabilization window",
                    pct(verdict.worst()),
                    self.now - since,
                    s.scale_up_stabilization
                ),
                sla,
            ));
        }
        if let Some((target, _)) = history.pending_scale_up {
            return Some(self.hold_with(
                history,
                Reason::ScaleUpInProgress,
                format!(
                    "violated, but the scale-up to {target} replicas is still starting ({} ready)",
                    self.obs.ready_replicas
                ),
                sla,
            ));
        }
        if self.in_cooldown(history) {
            return Some(self.cooling(history, sla));
        }
        if self.still_for(history) < s.window {
            return Some(self.hold_with(
                history,
                Reason::Stabilizing,
                format!(
                    "violated ({} of target), but the levers moved {:.0}s ago; the window shows their effect after {:.0}s",
                    pct(verdict.worst()),
                    self.still_for(history),
                    s.window
                ),
                sla,
            ));
        }
        None
    }

    /// Raises the current configuration's correction to what was observed, where the model
    /// predicted a stable queue.
    fn correct_to_observed(&self, history: &mut History) {
        let s = self.spec;
        let cur = self.current;
        let Some(load) = Workload::from_metrics(&self.obs.metrics) else { return };
        let config = engine_config(&cur, s);
        if let Some(p) = self.model.predict(&config, cur.replicas, &load, s.quantile())
            && p.stable()
        {
            let start = correction_for(history, &config);
            let entry = history.correction.entry(correction_key(&config)).or_insert(start);
            if let Some(o) = self.obs.metrics.ttft.seconds() {
                entry.ttft = entry.ttft.max((o / p.ttft.max(1e-9)).clamp(0.25, 4.0));
            }
            if let Some(o) = self.obs.metrics.itl.seconds() {
                entry.itl = entry.itl.max((o / p.itl.max(1e-9)).clamp(0.25, 4.0));
            }
        }
    }

    /// One replica more, else (at max replicas) the next faster tier when allowed, else a hold
    /// that says the planner is out of levers.
    fn add_capacity(&self, history: &mut History, verdict: Verdict, sla: SlaState) -> Decision {
        let s = self.spec;
        let cur = self.current;
        let pct = |r: f64| format!("{:.0}%", r * 100.0);
        let reason = if verdict.itl > verdict.ttft { Reason::ItlViolated } else { Reason::TtftViolated };
        if cur.replicas < s.max_replicas {
            let next = cur.replicas + 1;
            if s.enforce {
                history.pending_scale_up = Some((next, self.now));
            }
            let basis = if self.model.step(cur.tier).is_some() {
                "where the model predicted it would hold"
            } else {
                "with no step model to size by (no profile, or an online fit that does not explain the window)"
            };
            return self.finish(
                history,
                Levers { replicas: next, ..cur },
                reason,
                format!(
                    "violated at {} of target {basis}: replicas {} → {next}",
                    pct(verdict.worst()),
                    cur.replicas
                ),
                sla,
            );
        }
        if s.allow_degrade
            && let Some(rank) = s.tier_rank(cur.tier)
            && let Some(faster) = s.tiers.get(rank + 1)
        {
            if s.enforce {
                history.tier_changed_at = Some(self.now);
            }
            return self.finish(history, Levers { tier: *faster, ..cur }, Reason::DegradedForLatency, format!(
                "violated at {} of target with all {} replicas: tier {} → {faster} (faster, less precise)",
                pct(verdict.worst()),
                cur.replicas,
                cur.tier
            ), sla);
        }
        let mut d = self.hold_with(
            history,
            Reason::AtMaxReplicas,
            format!(
                "violated at {} of target with all {} replicas and no faster tier allowed",
                pct(verdict.worst()),
                cur.replicas
            ),
            sla,
        );
        d.scaling_limited = true;
        d
    }

    /// Without a model: one replica fewer when every smoothed ratio has been below
    /// [`HEADROOM`] for the scale-down stabilization; precision first.
    fn unprofiled_headroom(&self, history: &mut History, sla: SlaState) -> Decision {
        let s = self.spec;
        let cur = self.current;
        let signal = [history.ttft_ratio, history.itl_ratio, history.e2e_ratio]
            .into_iter()
            .flatten()
            .fold(0.0, f64::max);
        if signal >= HEADROOM {
            history.headroom_since = None;
            return self.finish(
                history,
                cur,
                Reason::SlaMet,
                format!("the SLA holds at {:.0}% of its tightest target", signal * 100.0),
                sla,
            );
        }
        let since = *history.headroom_since.get_or_insert(self.now);
        if self.now - since < s.scale_down_stabilization || self.in_cooldown(history) {
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
        if let (Some(rank), Some(preferred)) = (s.tier_rank(cur.tier), s.tier_rank(s.preferred_tier))
            && rank > preferred
        {
            let precise = s.tiers[rank - 1];
            if s.enforce {
                history.tier_changed_at = Some(self.now);
            }
            history.headroom_since = Some(self.now);
            return self.finish(
                history,
                Levers { tier: precise, ..cur },
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
            return self.shed_unprofiled(history, since, sla);
        }
        self.finish(
            history,
            cur,
            Reason::SlaMet,
            "the SLA holds with headroom at the lowest cost allowed".into(),
            sla,
        )
    }

    /// Without a model, with headroom since `since`: one replica fewer, unless the rest would
    /// each carry more than a replica has been seen carrying.
    fn shed_unprofiled(&self, history: &mut History, since: f64, sla: SlaState) -> Decision {
        let cur = self.current;
        // A latency far under its target says little of the load a replica fewer would
        // see (on a GPU the curve is flat until the queue builds): shed only while the
        // rest would each carry no more than a replica has been seen carrying.
        let peak = history
            .recent_rates
            .iter()
            .map(|(_, r)| *r)
            .chain(self.obs.metrics.request_rate)
            .fold(0.0, f64::max);
        let each = peak / f64::from(cur.replicas - 1);
        let seen = history.carried.get(cur.tier.as_str()).copied().unwrap_or(0.0);
        if each > seen * (1.0 + 1e-9) {
            return self.finish(
                history,
                cur,
                Reason::SlaMet,
                format!(
                    "the SLA holds with headroom, but {} replicas would each carry {each:.2} req/s, more than one has been seen carrying ({seen:.2})",
                    cur.replicas - 1
                ),
                sla,
            );
        }
        history.headroom_since = Some(self.now);
        let next = cur.replicas - 1;
        self.finish(
            history,
            Levers { replicas: next, ..cur },
            Reason::ReplicasShed,
            format!("headroom for {:.0}s: replicas {} → {next}", self.now - since, cur.replicas),
            sla,
        )
    }

    /// No percentile to judge by. With the request rate known to be near zero the service is
    /// idle: the headroom rules may give back capacity and precision. Otherwise hold.
    pub(super) fn idle_or_blind(&self, history: &mut History) -> Decision {
        let m = &self.obs.metrics;
        let samples = m.ttft.samples().or(m.itl.samples()).unwrap_or(0.0);
        let idle = m.request_rate.is_some_and(|r| r * self.spec.window < super::super::MIN_SAMPLES);
        if idle {
            history.violating_since = None;
            history.ttft_ratio = None;
            history.itl_ratio = None;
            history.e2e_ratio = None;
            let mut d = self.idle_headroom(history);
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

    /// An idle service: with a model, the headroom rule at the (tiny) observed load; without
    /// one, the unprofiled rule.
    fn idle_headroom(&self, history: &mut History) -> Decision {
        match self.plan(history, None) {
            Some(plan) => self.headroom(history, &plan, SlaState::Unknown),
            None => {
                // No load figures at all: nothing in flight, so everything is headroom.
                history.ttft_ratio = Some(0.0);
                self.unprofiled_headroom(history, SlaState::Unknown)
            }
        }
    }
}
