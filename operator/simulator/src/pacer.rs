//! Pacer's own policy in the simulator: the planner's one driver ([`Planner`]) on the same
//! observation the operator would build, with its capacity model seeded from the run's
//! profiles. It looks at every scrape and decides when the driver says one is due: at its
//! evaluation interval, or early when a leading signal crosses.

use super::policy::{Move, Policy};
use super::prom::Seen;
use pacer_planner::{CapacityModel, EngineProfile, History, Levers, Planner, PlannerSpec};

/// How often the policy looks at Prometheus' answers (the simulator's scrape interval).
pub const OBSERVE_EVERY: f64 = 15.0;

/// The planner's driver and its capacity model.
#[derive(Debug, Clone)]
pub struct Pacer {
    name: &'static str,
    planner: Planner,
    model: CapacityModel,
    last_reason: String,
}

impl Pacer {
    /// For `spec`, with one profile per tier.
    pub fn new(spec: &PlannerSpec, profiles: Vec<EngineProfile>) -> Pacer {
        Pacer {
            name: "pacer",
            planner: Planner::new(spec.clone()),
            model: CapacityModel::new(profiles),
            last_reason: "SLAMet".into(),
        }
    }

    /// For `spec`, with no profile: the planner learns each tier's steps from the metrics.
    pub fn online(spec: &PlannerSpec) -> Pacer {
        Pacer { name: "pacer-online", ..Pacer::new(spec, Vec::new()) }
    }
}

impl Policy for Pacer {
    fn name(&self) -> String {
        self.name.into()
    }
    fn interval(&self) -> f64 {
        self.planner.spec().evaluation_interval.min(OBSERVE_EVERY)
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        let Some(d) = self.planner.tick(&self.model, &seen.observation, current, now) else {
            return Move { levers: *current, reason: self.last_reason.clone() };
        };
        let m = &seen.observation.metrics;
        tracing::debug!(
            t = now,
            replicas = current.replicas,
            ready = seen.observation.ready_replicas,
            ttft = ?m.ttft.seconds(),
            itl = ?m.itl.seconds(),
            rate = ?m.request_rate,
            rate_short = ?m.request_rate_short,
            waiting = ?m.waiting,
            reason = d.reason.as_str(),
            message = %d.message,
            "simulated planner tick"
        );
        self.last_reason = d.reason.as_str().into();
        Move { levers: d.levers, reason: self.last_reason.clone() }
    }
}

/// What a new leader starts from in a [`Failover`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The memory the old leader left in the status ([`pacer_planner::memory`]).
    FromStatus,
    /// Nothing: an empty history (what a new leader had before the memory existed).
    Empty,
}

/// Pacer with a leader failover at `at`: from the first tick at or after it, a new leader
/// carries on from `takeover`. As in the controller, it decides when [`due`] says so: a leader
/// with the last one's memory keeps its evaluation schedule, an empty history is due at once.
#[derive(Debug, Clone)]
pub struct Failover {
    /// The planner, old leader then new.
    pub pacer: Pacer,
    /// When the old leader stops.
    pub at: f64,
    /// What the new one starts from.
    pub takeover: Takeover,
    done: bool,
}

impl Failover {
    /// `pacer`, failing over at `at` to a leader starting from `takeover`.
    pub fn new(pacer: Pacer, at: f64, takeover: Takeover) -> Failover {
        Failover { pacer, at, takeover, done: false }
    }
}

impl Policy for Failover {
    fn name(&self) -> String {
        "pacer-failover".into()
    }
    fn interval(&self) -> f64 {
        self.pacer.interval()
    }
    fn evaluate(&mut self, now: f64, seen: &Seen, current: &Levers) -> Move {
        if !self.done && now >= self.at {
            self.done = true;
            let p = &mut self.pacer;
            let history = match self.takeover {
                Takeover::FromStatus => pacer_planner::memory::encode(p.planner.history())
                    .and_then(|text| pacer_planner::memory::decode(&text, now))
                    .unwrap_or_default(),
                Takeover::Empty => History::default(),
            };
            // A new leader: the memory it starts from, and no observation noted yet.
            p.planner = Planner::resume(p.planner.spec().clone(), history);
        }
        self.pacer.evaluate(now, seen, current)
    }
}
