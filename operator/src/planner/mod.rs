//! The SLA planner: pure decisions. [`decide`] takes the spec, one [`Observation`], the levers in
//! force, the planner's [`History`] and the time, and returns a [`Decision`]: the levers to run
//! at next, which lever moved and why, in a reason code and one sentence. No IO, no clock reads:
//! the operator, local mode and the simulator all drive this same function.
//!
//! - [`observation`]: what is seen (percentiles with sample counts, rates, freshness).
//! - [`spec`]: targets, ranges and policy in seconds.
//! - [`levers`]: the three levers.
//! - [`profile`]: an engine profile (step times per tier) from `pacer-engine profile`.
//! - [`capacity`]: the queueing model that turns a profile and a load into predicted percentiles.
//! - [`decide`](mod@decide): the rules, guards and lever order.

pub mod capacity;
pub mod decide;
pub mod levers;
pub mod observation;
pub mod profile;
pub mod spec;
#[cfg(test)]
mod tests;

pub use capacity::{CapacityModel, Prediction, Workload};
pub use decide::decide;
pub use levers::{Direction, Lever, Levers};
pub use observation::{Freshness, MIN_SAMPLES, Observation, Quantile, Seconds, ServiceMetrics};
pub use profile::{EngineProfile, StepModel};
pub use spec::PlannerSpec;

use pacer_crds::Tier;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why the planner decided what it did. Stable, machine-readable: it is a metric label, an
/// Event reason and part of status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// Every SLA dimension is within target and nothing needs to move.
    SlaMet,
    /// TTFT is over target: replicas were added.
    TtftViolated,
    /// ITL is over target: the batch was made smaller (no restart).
    ItlViolated,
    /// At max replicas and still violating: a faster, less precise tier was chosen.
    DegradedForLatency,
    /// Headroom: a more precise tier was restored.
    PrecisionRestored,
    /// Headroom: replicas were given back.
    ReplicasShed,
    /// Headroom, but the last scale-in at this load broke the SLA: replicas stay.
    ShedFloor,
    /// Headroom: the batch size was raised back toward its initial value.
    BatchRestored,
    /// Traffic rose so that the capacity model predicts a violation: replicas were added ahead.
    LoadPredicted,
    /// A violation, but it has not lasted the scale-up stabilization window yet.
    Stabilizing,
    /// A violation, but replicas from the last scale-up are still starting.
    ScaleUpInProgress,
    /// A violation at max replicas with no faster tier allowed.
    AtMaxReplicas,
    /// A tier rollout finished recently; the planner waits before the next change.
    Cooldown,
    /// The metrics source did not answer or has no series for this service: holding.
    MetricsMissing,
    /// The newest samples are too old: holding.
    MetricsStale,
    /// Too few requests in the window for a percentile: holding.
    TooFewSamples,
    /// The levers were outside the spec's ranges and were brought back inside.
    OutOfRange,
}

impl Reason {
    /// The reason as written in status, Events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SlaMet => "SLAMet",
            Reason::TtftViolated => "TTFTViolated",
            Reason::ItlViolated => "ITLViolated",
            Reason::DegradedForLatency => "DegradedForLatency",
            Reason::PrecisionRestored => "PrecisionRestored",
            Reason::ReplicasShed => "ReplicasShed",
            Reason::ShedFloor => "ShedFloor",
            Reason::BatchRestored => "BatchRestored",
            Reason::LoadPredicted => "LoadPredicted",
            Reason::Stabilizing => "Stabilizing",
            Reason::ScaleUpInProgress => "ScaleUpInProgress",
            Reason::AtMaxReplicas => "AtMaxReplicas",
            Reason::Cooldown => "Cooldown",
            Reason::MetricsMissing => "MetricsMissing",
            Reason::MetricsStale => "MetricsStale",
            Reason::TooFewSamples => "TooFewSamples",
            Reason::OutOfRange => "OutOfRange",
        }
    }

    /// Whether the planner held because its input was unusable.
    pub fn is_blind(self) -> bool {
        matches!(self, Reason::MetricsMissing | Reason::MetricsStale | Reason::TooFewSamples)
    }
}

/// What the planner concludes about the SLA at this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlaState {
    /// Every observed dimension is within target.
    Met,
    /// At least one dimension is over target.
    Violated,
    /// No usable signal.
    Unknown,
}

impl SlaState {
    /// `Met`, `Violated` or `Unknown`, as in the printer column.
    pub fn as_str(self) -> &'static str {
        match self {
            SlaState::Met => "Met",
            SlaState::Violated => "Violated",
            SlaState::Unknown => "Unknown",
        }
    }
}

/// One lever move: which, which way, from and to (rendered as text, e.g. `2 → 3`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// The lever.
    pub lever: Lever,
    /// Which way.
    pub direction: Direction,
    /// The value before, as text.
    pub from: String,
    /// The value after, as text.
    pub to: String,
}

/// The planner's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The levers to run at (equal to the current levers when holding, and in Advisory mode).
    pub levers: Levers,
    /// What the planner recommends; applied only in Enforce mode.
    pub recommended: Levers,
    /// The lever moved (or recommended), if any.
    pub change: Option<Change>,
    /// Why.
    pub reason: Reason,
    /// One sentence for people.
    pub message: String,
    /// The SLA at this tick.
    pub sla: SlaState,
    /// Running below the preferred tier.
    pub degraded: bool,
    /// At max replicas (and the fastest allowed tier) and still violating.
    pub scaling_limited: bool,
    /// The history to pass to the next call.
    pub history: History,
}

/// What the planner remembers between ticks. Losing it (an operator restart) is safe: every
/// window starts again from now, which only delays the next change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// Smoothed ratio observed/target of TTFT.
    pub ttft_ratio: Option<f64>,
    /// Smoothed ratio observed/target of ITL.
    pub itl_ratio: Option<f64>,
    /// Smoothed ratio observed/target of E2E.
    pub e2e_ratio: Option<f64>,
    /// Since when the SLA has been violated (smoothed), if it is.
    pub violating_since: Option<Seconds>,
    /// Since when every dimension has been well under target, if it has.
    pub headroom_since: Option<Seconds>,
    /// When each lever last moved.
    pub last_change: BTreeMap<String, Seconds>,
    /// The last scale-up: its target replicas and when, until they are all ready.
    pub pending_scale_up: Option<(i32, Seconds)>,
    /// When the last tier rollout started.
    pub tier_changed_at: Option<Seconds>,
    /// Learned ratio of observed to predicted percentile, per `tier/batch` and dimension.
    pub correction: BTreeMap<String, Correction>,
    /// When the levers last changed (any lever), for the change-rate guard.
    pub changes: Vec<Seconds>,
    /// The last scale-in: replicas before it, the request rate then, and when.
    pub last_shed: Option<(i32, f64, Seconds)>,
    /// Learned from a scale-in the SLA undid: fewer than this many replicas broke the SLA at
    /// this request rate (and when it was learned). Scale-ins stop there while the load is as
    /// high; this is what keeps a stationary load from flapping.
    pub shed_floor: Option<(i32, f64, Seconds)>,
    /// The last batch cut for ITL: the smoothed ITL ratio before it, and when. A cut that did
    /// not lower ITL (steps slowed by something a batch does not change, e.g. CPU contention
    /// or long prefills) is not repeated: replicas come next.
    pub batch_cut: Option<(f64, Seconds)>,
}

/// A learned correction of the capacity model: observed percentile / predicted percentile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// For TTFT.
    pub ttft: f64,
    /// For ITL.
    pub itl: f64,
}

impl Default for Correction {
    fn default() -> Self {
        Correction { ttft: 1.0, itl: 1.0 }
    }
}

/// The key of a correction: the tier and batch setting it was learned at.
pub fn correction_key(tier: Tier, max_batch_size: u32) -> String {
    format!("{tier}/{max_batch_size}")
}
