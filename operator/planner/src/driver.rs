//! The one driver of the planner. Every caller (the controller, local mode, the simulator) sees
//! observations more often than the planner evaluates; each hands every observation to
//! [`Planner::tick`], which decides when [`due`] says so (the evaluation interval passed, or a
//! leading signal crossed) and otherwise [`note`]s a fresh observation's leading signals. The
//! driver owns what that takes: the spec, the [`History`] carried from decision to decision,
//! and when the last observation was noted (a caller that sees the same observation twice, as
//! the controller's reconciles do, notes it once).

use crate::decide::{decide, due, note};
use crate::{CapacityModel, Decision, History, Levers, Observation, PlannerSpec, Seconds};

/// The planner with its memory: one per InferenceService.
#[derive(Debug, Clone, PartialEq)]
pub struct Planner {
    spec: PlannerSpec,
    history: History,
    noted_at: Option<Seconds>,
}

impl Planner {
    /// A planner for `spec` with no memory: its first observation is due at once.
    pub fn new(spec: PlannerSpec) -> Planner {
        Planner::resume(spec, History::default())
    }

    /// A planner for `spec` that carries on from `history` (a predecessor's memory).
    pub fn resume(spec: PlannerSpec, history: History) -> Planner {
        Planner { spec, history, noted_at: None }
    }

    /// The spec it plans for.
    pub fn spec(&self) -> &PlannerSpec {
        &self.spec
    }

    /// Plans for `spec` from now on (the user changed it), keeping the memory.
    pub fn set_spec(&mut self, spec: PlannerSpec) {
        self.spec = spec;
    }

    /// What it remembers.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Replaces what it remembers (a new leader's takeover).
    pub fn replace_history(&mut self, history: History) {
        self.history = history;
    }

    /// The window request and token rates are to be observed over.
    pub fn rate_window(&self) -> Seconds {
        self.spec.rate_window()
    }

    /// One observation at `now` with `levers` in force: the decision when one is due, else
    /// `None` (a fresh observation's leading signals are noted for the next).
    pub fn tick(
        &mut self,
        model: &CapacityModel,
        observation: &Observation,
        levers: &Levers,
        now: Seconds,
    ) -> Option<Decision> {
        let fresh = self.noted_at.is_none_or(|n| observation.at > n);
        if fresh && due(&self.spec, observation, &self.history, now) {
            return Some(self.decide_now(model, observation, levers, now));
        }
        if fresh {
            note(observation, &mut self.history);
            self.noted_at = Some(observation.at);
        }
        None
    }

    /// Decides at `now` whether or not a decision is due (the spec changed, or the caller keeps
    /// an interval of its own), and remembers the decision's history.
    pub fn decide_now(
        &mut self,
        model: &CapacityModel,
        observation: &Observation,
        levers: &Levers,
        now: Seconds,
    ) -> Decision {
        let decision = decide(&self.spec, model, observation, levers, &self.history, now);
        self.history = decision.history.clone();
        self.noted_at = Some(observation.at);
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Freshness, Quantile, ServiceMetrics};

    fn spec() -> PlannerSpec {
        PlannerSpec {
            percentile: 95.0,
            ttft_target: 0.4,
            itl_target: 0.06,
            e2e_target: None,
            window: 120.0,
            min_replicas: 1,
            max_replicas: 4,
            batch_min: 1,
            batch_max: 32,
            batch_initial: 8,
            budget_min: 64,
            budget_max: 2048,
            budget_initial: 512,
            tiers: vec![crate::Tier::Native],
            preferred_tier: crate::Tier::Native,
            allow_degrade: false,
            enforce: true,
            evaluation_interval: 30.0,
            scale_up_stabilization: 30.0,
            scale_down_stabilization: 300.0,
            max_step_ms: 0,
            batch_rolls: false,
        }
    }

    fn seen(at: f64, waiting: f64) -> Observation {
        let metrics = ServiceMetrics {
            ttft: Quantile::Value { seconds: 0.1, samples: 500.0 },
            itl: Quantile::Value { seconds: 0.02, samples: 5000.0 },
            waiting: Some(waiting),
            running: Some(1.0),
            ..ServiceMetrics::missing()
        };
        Observation { at, freshness: Freshness::Fresh, metrics, ready_replicas: 1, desired_replicas: 1 }
    }

    fn levers() -> Levers {
        Levers {
            replicas: 1,
            max_batch_size: 8,
            batch_wait_ms: 0,
            max_num_batched_tokens: 512,
            tier: crate::Tier::Native,
        }
    }

    #[test]
    fn it_decides_at_its_interval_and_notes_in_between() {
        let model = CapacityModel::new(Vec::new());
        let mut planner = Planner::new(spec());
        assert!(planner.tick(&model, &seen(0.0, 0.0), &levers(), 0.0).is_some(), "no memory: due at once");
        assert!(planner.tick(&model, &seen(10.0, 0.0), &levers(), 10.0).is_none());
        assert_eq!(planner.history().in_flight_seen, Some((10.0, 1.0)), "the observation was noted");
        assert!(planner.tick(&model, &seen(30.0, 0.0), &levers(), 30.0).is_some(), "the interval passed");
    }

    #[test]
    fn a_growing_queue_decides_early_and_one_observation_counts_once() {
        let model = CapacityModel::new(Vec::new());
        let mut planner = Planner::new(spec());
        assert!(planner.tick(&model, &seen(0.0, 0.0), &levers(), 0.0).is_some());
        assert_eq!(planner.history().waiting_seen, vec![0.0], "a decision notes what it saw");
        assert!(planner.tick(&model, &seen(5.0, 1.0), &levers(), 5.0).is_none());
        // The same observation again (a second reconcile on it) is not noted twice.
        assert!(planner.tick(&model, &seen(5.0, 1.0), &levers(), 6.0).is_none());
        assert_eq!(planner.history().waiting_seen, vec![0.0, 1.0]);
        let early = planner.tick(&model, &seen(10.0, 2.0), &levers(), 10.0);
        assert!(early.is_some(), "the queue grew over two observations");
    }
}
