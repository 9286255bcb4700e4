//! Pacer's own policy in the simulator: `planner::decide` on the same observation the operator
//! would build, with its capacity model seeded from the run's profiles and its `History`
//! carried from tick to tick exactly as the operator keeps it in status.

use super::policy::{Policy, Tick};
use super::prom::Seen;
use crate::planner::{CapacityModel, EngineProfile, History, Levers, PlannerSpec, decide};

/// `planner::decide` with a history carried between ticks.
#[derive(Debug, Clone)]
pub struct Pacer {
    spec: PlannerSpec,
    model: CapacityModel,
    history: History,
}

impl Pacer {
    /// For `spec`, with one profile per tier.
    pub fn new(spec: &PlannerSpec, profiles: Vec<EngineProfile>) -> Pacer {
        Pacer { spec: spec.clone(), model: CapacityModel::new(profiles), history: History::default() }
    }
}

impl Policy for Pacer {
    fn name(&self) -> String {
        "pacer".into()
    }
    fn interval(&self) -> f64 {
        self.spec.evaluation_interval
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Tick {
        let d = decide(&self.spec, &self.model, &seen.observation, current, &self.history, now);
        self.history = d.history;
        Tick { levers: d.levers, reason: d.reason.as_str().into() }
    }
}
