//! Turning the chosen configuration into lever moves: more replicas in one step (with a
//! warm-up cover), other batch settings or a tier for the same replicas, what to do when nothing
//! holds, and the headroom rules (precision first, then replicas).

use super::super::choose::{self, Choice};

use super::*;

impl Round<'_> {
    pub(super) fn act(
        &self,
        history: &mut History,
        plan: &Plan,
        verdict: Verdict,
        sla: SlaState,
    ) -> Decision {
        let cur = self.current;
        let want = *plan.up.candidate();
        let holds = matches!(plan.up, Choice::Holds(_));

        // 1. More replicas than run (starting ones count): one step to the model's count.
        if want.levers.replicas > cur.replicas {
            return self.scale_up(history, plan, &want.levers, verdict, sla);
        }
        // 2. The warm-up cover is given back once the new replicas are ready.
        if let Some(d) = self.end_cover(history, sla) {
            return d;
        }
        let current_holds = f64::from(cur.replicas) * plan.current_capacity >= plan.need_up;
        // 3. The replicas suffice but the current settings do not hold: the same replicas with
        //    other batch settings, or (never as a fast lever) a faster tier.
        if !current_holds
            && holds
            && want.levers.replicas <= cur.replicas
            && let Some(d) = self.resettle(history, plan, &want.levers, verdict, sla)
        {
            return d;
        }
        // 4. Nothing within the ranges holds: at max replicas, the fastest tier the spec
        //    allows, else say so.
        if !holds {
            return self.nothing_holds(history, plan, &want.levers, current_holds, verdict, sla);
        }
        // 5. The model says the configuration holds, the percentiles say it does not.
        if sla == SlaState::Violated {
            return self.reactive(history, verdict, sla);
        }
        // 6. Headroom: precision first, then replicas; batch settings the rule chose stay (a
        //    move back to the initial ones is a change that buys nothing the rule asked for).
        self.headroom(history, plan, sla)
    }

    /// The batch settings a warm-up cover tightened, back once the new replicas are ready.
    pub(super) fn end_cover(&self, history: &mut History, sla: SlaState) -> Option<Decision> {
        let cur = self.current;
        let (batch, budget) = history.cover?;
        if history.pending_scale_up.is_some() {
            return None;
        }
        history.cover = None;
        let back = Levers { max_batch_size: batch, max_num_batched_tokens: budget, ..cur };
        (back != cur).then(|| {
            self.finish(
                history,
                back,
                Reason::BatchRestored,
                format!("the replicas are ready: batch settings back to {batch} sequences, {budget} tokens per step"),
                sla,
            )
        })
    }

    /// The same replicas at the chosen configuration's batch settings or tier, when that moves
    /// anything.
    pub(super) fn resettle(
        &self,
        history: &mut History,
        plan: &Plan,
        want: &Levers,
        verdict: Verdict,
        sla: SlaState,
    ) -> Option<Decision> {
        let cur = self.current;
        let target = Levers { replicas: cur.replicas, ..*want };
        if target.tier != cur.tier {
            if self.in_cooldown(history) {
                return Some(self.cooling(history, sla));
            }
            let degrading = self.spec.tier_rank(target.tier) > self.spec.tier_rank(cur.tier);
            if degrading && !self.sustained_overload(history, plan) {
                return Some(self.waiting_to_degrade(history, plan, sla));
            }
            let reason = if degrading { Reason::DegradedForLatency } else { Reason::PrecisionRestored };
            return Some(self.tier_move(history, plan, target, reason, sla));
        }
        if target == cur {
            return None;
        }
        if self.spec.batch_rolls && self.in_cooldown(history) {
            return Some(self.cooling(history, sla));
        }
        let reason = self.up_reason(plan, history, verdict, sla);
        let what = self.predicted(plan, history, &target);
        Some(self.finish(
            history,
            target,
            reason,
            format!(
                "{what}: batch settings {}/{} → {}/{} (sequences/tokens per step){}",
                cur.max_batch_size,
                cur.max_num_batched_tokens,
                target.max_batch_size,
                target.max_num_batched_tokens,
                self.rolled()
            ),
            sla,
        ))
    }

    /// No configuration within the ranges is predicted to hold: the fastest tier the spec
    /// allows, else the batch settings predicted to come closest, else a hold that says so.
    pub(super) fn nothing_holds(
        &self,
        history: &mut History,
        plan: &Plan,
        want: &Levers,
        current_holds: bool,
        verdict: Verdict,
        sla: SlaState,
    ) -> Decision {
        let cur = self.current;
        if want.tier != cur.tier
            && self.spec.tier_rank(want.tier) > self.spec.tier_rank(cur.tier)
            && !self.in_cooldown(history)
            && self.sustained_overload(history, plan)
        {
            let target = Levers { tier: want.tier, ..cur };
            return self.tier_move(history, plan, target, Reason::DegradedForLatency, sla);
        }
        let fast = Levers { replicas: cur.replicas, tier: cur.tier, ..*want };
        // Where batch settings roll the pods this is no fast lever: a rollout that cannot
        // make the configuration hold only takes replicas out of service while it runs.
        if fast != cur && !current_holds && !self.spec.batch_rolls {
            let what = self.predicted(plan, history, &fast);
            return self.finish(history, fast, self.up_reason(plan, history, verdict, sla), format!(
                "{what}: no configuration within the spec's ranges is predicted to hold; the batch settings predicted to come closest{}",
                self.rolled()
            ), sla);
        }
        if sla != SlaState::Violated {
            // Short of the margin everywhere, but holding: more replicas would not help
            // (the model says so), so they may also be given back.
            return self.headroom(history, plan, sla);
        }
        let mut d = self.hold_with(
            history,
            Reason::AtMaxReplicas,
            format!(
                "no configuration the spec allows is predicted to hold forecast {:.2} req/s; running the one predicted to come closest ({} replicas)",
                plan.forecast.up, cur.replicas
            ),
            sla,
        );
        d.scaling_limited = cur.replicas >= self.spec.max_replicas;
        d
    }

    /// More replicas, with the batch settings the chosen configuration runs at (the tier moves
    /// on its own, never with a scale-up).
    pub(super) fn scale_up(
        &self,
        history: &mut History,
        plan: &Plan,
        want: &Levers,
        verdict: Verdict,
        sla: SlaState,
    ) -> Decision {
        let cur = self.current;
        let next = want.replicas;
        let reason = self.up_reason(plan, history, verdict, sla);
        // Where batch settings roll the pods, replicas come first: a rollout waits until the
        // model still asks for it once they are up.
        let target = if self.spec.batch_rolls {
            Levers { replicas: want.replicas, ..cur }
        } else {
            Levers { tier: cur.tier, ..*want }
        };
        let what = self.predicted(plan, history, &target);
        let mut levers = target;
        let mut note = if (target.max_batch_size, target.max_num_batched_tokens)
            != (cur.max_batch_size, cur.max_num_batched_tokens)
        {
            format!(
                ", batch settings {}/{} → {}/{}",
                cur.max_batch_size,
                cur.max_num_batched_tokens,
                target.max_batch_size,
                target.max_num_batched_tokens
            )
        } else {
            String::new()
        };
        // Cover the start: the replicas ready now must carry the forecast until the new ones
        // are; if they are predicted not to, the batch settings that hold them best meanwhile,
        // given back once the replicas are ready.
        let ready = self.obs.ready_replicas.clamp(1, cur.replicas);
        let tier = [cur.tier];
        let ready_capacity =
            choose::per_replica(self.spec, self.model, history, &target, &plan.shape, MARGIN).unwrap_or(0.0);
        if !self.spec.batch_rolls
            && f64::from(ready) * ready_capacity < plan.forecast.up
            && let Some(Choice::Holds(fast)) = choose::cheapest(
                &choose::Search {
                    spec: self.spec,
                    model: self.model,
                    history,
                    current: &target,
                    shape: &plan.shape,
                },
                &choose::Ask { rate: plan.forecast.up, margin: 1.0, replicas: Some(ready), tiers: &tier },
            )
            && (fast.levers.max_batch_size, fast.levers.max_num_batched_tokens)
                != (target.max_batch_size, target.max_num_batched_tokens)
        {
            if self.spec.enforce {
                history.cover = Some((target.max_batch_size, target.max_num_batched_tokens));
            }
            levers.max_batch_size = fast.levers.max_batch_size;
            levers.max_num_batched_tokens = fast.levers.max_num_batched_tokens;
            note = format!(
                "; until they are ready, batch settings {}/{} → {}/{}",
                cur.max_batch_size,
                cur.max_num_batched_tokens,
                levers.max_batch_size,
                levers.max_num_batched_tokens
            );
        }
        if self.spec.enforce {
            history.pending_scale_up = Some((next, self.now));
        }
        history.headroom_since = None;
        self.finish(history, levers, reason, format!("{what}: replicas {} → {next}{note}", cur.replicas), sla)
    }

    /// Whether the long window's load alone, with headroom, is more than the current tier
    /// carries with every replica allowed: a tier rollout is slow and costs precision, so a
    /// short burst does not start one.
    pub(super) fn sustained_overload(&self, history: &History, plan: &Plan) -> bool {
        let tier = [self.current.tier];
        let rate = plan.forecast.long * LOAD_HEADROOM;
        !matches!(
            choose::cheapest(
                &choose::Search {
                    spec: self.spec,
                    model: self.model,
                    history,
                    current: &self.current,
                    shape: &plan.shape
                },
                &choose::Ask { rate, margin: MARGIN, replicas: None, tiers: &tier },
            ),
            Some(Choice::Holds(_))
        )
    }

    pub(super) fn waiting_to_degrade(&self, history: &mut History, plan: &Plan, sla: SlaState) -> Decision {
        self.hold_with(
            history,
            Reason::Stabilizing,
            format!(
                "forecast {:.2} req/s needs a faster tier, but the long window's {:.2} req/s does not yet: no rollout for a burst",
                plan.forecast.up, plan.forecast.long
            ),
            sla,
        )
    }

    pub(super) fn tier_move(
        &self,
        history: &mut History,
        plan: &Plan,
        target: Levers,
        reason: Reason,
        sla: SlaState,
    ) -> Decision {
        let cur = self.current;
        if self.spec.enforce {
            history.tier_changed_at = Some(self.now);
        }
        history.headroom_since = None;
        let what = self.predicted(plan, history, &target);
        let how = if reason == Reason::DegradedForLatency { "faster, less precise" } else { "more precise" };
        self.finish(
            history,
            target,
            reason,
            format!("{what}: tier {} → {} ({how})", cur.tier, target.tier),
            sla,
        )
    }

    pub(super) fn cooling(&self, history: &mut History, sla: SlaState) -> Decision {
        let since = history.tier_changed_at.map_or(0.0, |at| self.now - at);
        self.hold_with(
            history,
            Reason::Cooldown,
            format!(
                "a rollout started {since:.0}s ago; waiting {:.0}s for it to settle",
                self.cooldown(history)
            ),
            sla,
        )
    }

    /// Capacity or precision back, once a cheaper configuration has been predicted to hold the
    /// scale-down load within [`SHED_MARGIN`] for the scale-down stabilization.
    pub(super) fn headroom(&self, history: &mut History, plan: &Plan, sla: SlaState) -> Decision {
        let s = self.spec;
        let cur = self.current;
        // A smaller configuration predicted to hold the scale-down load within the shed margin;
        // or, where none holds at any size, predicted to come as close as the current one
        // while the percentiles say the SLA holds.
        let cheaper = match plan.down {
            Some(Choice::Holds(c)) => Some(c),
            Some(Choice::Short(c)) if sla == SlaState::Met => Some(c),
            _ => None,
        }
        .filter(|c| {
            let more_precise = s.tier_rank(c.levers.tier) < s.tier_rank(cur.tier);
            c.levers.replicas < cur.replicas || more_precise
        });
        if cheaper.is_none() {
            history.headroom_since = None;
            return self.finish(history, cur, Reason::SlaMet, self.predicted(plan, history, &cur), sla);
        }
        let since = *history.headroom_since.get_or_insert(self.now);
        if self.now - since < s.scale_down_stabilization || history.pending_scale_up.is_some() {
            return self.finish(
                history,
                cur,
                Reason::SlaMet,
                format!(
                    "the SLA holds; a cheaper configuration has been predicted to hold for {:.0}s of the {:.0}s scale-down stabilization window",
                    self.now - since,
                    s.scale_down_stabilization
                ),
                sla,
            );
        }
        if self.in_cooldown(history) {
            return self.cooling(history, sla);
        }
        if let Some(c) = cheaper {
            // Precision first: a more precise tier at the replicas running now, when the model
            // says it holds there; shedding waits for it.
            if s.tier_rank(c.levers.tier) < s.tier_rank(cur.tier) {
                let target = Levers { tier: c.levers.tier, ..cur };
                let fits = choose::per_replica(s, self.model, history, &target, &plan.shape, SHED_MARGIN)
                    .is_some_and(|cap| f64::from(cur.replicas) * cap >= plan.need_down);
                if fits {
                    history.headroom_since = Some(self.now);
                    return self.tier_move(history, plan, target, Reason::PrecisionRestored, sla);
                }
            }
            if c.levers.replicas < cur.replicas && c.levers.tier == cur.tier {
                // To the model's count in one step, as a scale-up: the stabilization window and
                // the peak it sizes for are the caution. (Shedding at most half per window cost
                // a change more per step down and replica-seconds on `llmd-bench` and
                // `flash-crowd`, and held no window more on any trace.)
                let next = c.levers.replicas.max(s.min_replicas);
                let target = Levers { replicas: next, ..c.levers };
                history.headroom_since = Some(self.now);
                let what = self.predicted(plan, history, &target);
                return self.finish(
                    history,
                    target,
                    Reason::ReplicasShed,
                    format!("{what}: replicas {} → {next}", cur.replicas),
                    sla,
                );
            }
        }
        self.finish(history, cur, Reason::SlaMet, "the SLA holds at the lowest cost allowed".into(), sla)
    }
}
