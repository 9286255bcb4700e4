//! The SLA planner: pure decisions. [`decide`] takes the spec, one [`Observation`], the levers in
//! force, the planner's [`History`] and the time, and returns a [`Decision`]: the levers to run
//! at next, which lever moved and why, in a reason code and one sentence. No IO, no clock reads:
//! the operator, local mode and the simulator all drive it through one [`Planner`]. The crate depends on
//! nothing that does IO (serde and thiserror only), and its lints refuse the standard library's
//! file, network, process and clock calls, so "pure" is checked, not promised.
//!
//! - [`observation`]: what is seen (percentiles with sample counts, rates, freshness).
//! - [`spec`]: targets, ranges and policy in seconds.
//! - [`levers`]: the three levers.
//! - [`profile`], [`tier`], [`lsq`], [`buckets`]: the engine's contract (`pacer-engine-api`),
//!   re-exported: profiles, tiers, the shared least squares and the histograms' bucket bounds.
//! - [`capacity`]: the queueing model that turns a profile and a load into predicted percentiles
//!   and per-replica capacity.
//! - [`online`]: step models learnt from the metrics for tiers no profile covers (vLLM).
//! - [`tail`]: TTFT's percentile as the percentile of a sum of waits and a prompt's prefill.
//! - [`forecast`]: the load to plan for, from the leading signals.
//! - [`choose`]: the one rule — the cheapest configuration predicted to hold the SLA.
//! - [`decide`](mod@decide): trust, learning, and turning the choice into lever moves.
//! - [`driver`]: [`Planner`], the one driver every caller uses: each observation in, a
//!   decision out when one is due, the history kept between.
//! - [`histogram`]: Prometheus text exposition and `histogram_quantile`'s arithmetic, shared by
//!   local mode's scraper and the simulator's Prometheus.
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]
// Output goes through a returned value; a print in a library is a leftover.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod capacity;
// The engine's contract, re-exported: the planner's inputs include its tiers and profiles.
pub use pacer_engine_api::{buckets, lsq, profile, tier};
pub mod choose;
pub mod decide;
pub mod driver;
pub mod forecast;
pub mod histogram;
pub mod levers;
pub mod memory;
pub mod observation;
pub mod online;
pub mod spec;
pub mod tail;
#[cfg(test)]
mod tests;

pub use capacity::{CapacityModel, EngineConfig, Prediction, Workload};
pub use decide::{decide, due};
pub use driver::Planner;
pub use forecast::Forecast;
pub use levers::{Direction, Lever, Levers};
pub use observation::{
    AppliedSettings, Freshness, MIN_SAMPLES, Observation, Quantile, Seconds, ServiceMetrics, Span,
};
pub use profile::{EngineProfile, StepModel};
pub use spec::PlannerSpec;
pub use tier::Tier;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why the planner decided what it did. Stable, machine-readable: it is a metric label, an
/// Event reason and part of status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// Every SLA dimension is within target and nothing needs to move.
    SlaMet,
    /// TTFT is over target (or predicted to be at the forecast load): capacity was added.
    TtftViolated,
    /// ITL is over target (or predicted to be): the batch settings were tightened, or
    /// replicas added.
    ItlViolated,
    /// At max replicas and still violating: a faster, less precise tier was chosen.
    DegradedForLatency,
    /// Headroom: a more precise tier was restored.
    PrecisionRestored,
    /// Headroom: replicas were given back.
    ReplicasShed,
    /// The batch settings went back to what they were before a warm-up cover tightened them,
    /// once the new replicas are ready.
    BatchRestored,
    /// The forecast load needs more capacity than runs: replicas (or batch settings that carry
    /// more) were added ahead of a violation.
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
    /// A new leader took over with the last one's memory: it holds until that one's
    /// evaluation interval ends, so a failover does not add an evaluation.
    Resumed,
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
            Reason::Resumed => "Resumed",
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
    /// The lever moved (or recommended), if any; the first of [`Decision::changes`].
    pub change: Option<Change>,
    /// Every lever moved (or recommended): a scale-up may also tighten the batch settings to
    /// cover the replicas' start.
    pub changes: Vec<Change>,
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
/// window starts again from now and the corrections are learned again, which only delays the
/// next change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct History {
    /// Smoothed ratio observed/target of TTFT.
    pub ttft_ratio: Option<f64>,
    /// Smoothed ratio observed/target of ITL.
    pub itl_ratio: Option<f64>,
    /// Smoothed ratio observed/target of E2E.
    pub e2e_ratio: Option<f64>,
    /// Since when the SLA has been violated (raw percentiles), if it is.
    pub violating_since: Option<Seconds>,
    /// Since when a cheaper configuration has been predicted to hold, if one has.
    pub headroom_since: Option<Seconds>,
    /// When each lever last moved.
    pub last_change: BTreeMap<String, Seconds>,
    /// The last scale-up: its target replicas and when, until they are all ready.
    pub pending_scale_up: Option<(i32, Seconds)>,
    /// When the last rollout started: a tier change, or a batch change where the engines read
    /// their batch settings only at start ([`PlannerSpec::batch_rolls`]).
    pub tier_changed_at: Option<Seconds>,
    /// Learned ratio of observed to predicted percentile, per engine configuration
    /// ([`correction_key`]).
    pub correction: BTreeMap<String, Correction>,
    /// When the levers last changed (any lever), for the change-rate guard.
    pub changes: Vec<Seconds>,
    /// Seconds a scale-up took to be ready, learned (the forecast's horizon).
    pub pod_start: Option<Seconds>,
    /// The batch settings before a warm-up cover tightened them (`max_batch_size`,
    /// `max_num_batched_tokens`): given back once the new replicas are ready.
    pub cover: Option<(u32, u32)>,
    /// When the planner last evaluated.
    pub evaluated_at: Option<Seconds>,
    /// The waiting requests of the last two observations, oldest first, for the early
    /// evaluation on a growing queue.
    pub waiting_seen: Vec<f64>,
    /// The requests in flight (running and waiting) at the last observation, and when.
    pub in_flight_seen: Option<(Seconds, f64)>,
    /// The request rates seen over the last scale-down stabilization window (when, the higher
    /// of the two windows' rates): capacity is given back only below their peak.
    pub recent_rates: Vec<(Seconds, f64)>,
    /// The request shape, smoothed over evaluations ([`decide::SHAPE_SMOOTHING`]): the prompt length
    /// at the percentile comes from wide histogram buckets and jumps from window to window.
    pub shape: Option<SeenShape>,
    /// Step models being learnt from the metrics, per tier no profile covers ([`online`]).
    pub online: BTreeMap<String, online::StepFit>,
    /// Per tier, the most requests per second one replica has been seen carrying while the
    /// SLA held with every replica ready: without a model, replicas are given back only while
    /// the rest would carry no more than that each.
    pub carried: BTreeMap<String, f64>,
}

/// A request shape (tokens per request), as last smoothed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeenShape {
    /// When.
    pub at: Seconds,
    /// Mean prompt tokens.
    pub prompt: f64,
    /// Prompt tokens at the SLA percentile, when observed.
    pub prompt_tail: Option<f64>,
    /// Mean generated tokens.
    pub output: f64,
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

/// The key of a correction: the tier, batch size and token budget it was learned at.
pub fn correction_key(config: &EngineConfig) -> String {
    format!("{}/{}/{}", config.tier, config.max_batch_size, config.token_budget)
}

fn parse_key(key: &str) -> Option<(String, f64, f64)> {
    let mut parts = key.split('/');
    let tier = parts.next()?.to_string();
    let batch: f64 = parts.next()?.parse().ok()?;
    let budget: f64 = parts.next()?.parse().ok()?;
    Some((tier, batch, budget))
}

/// The correction of `config`: learned there, or borrowed from the nearest configuration
/// learned (same tier first, nearest in log batch size and log budget), or none (1.0).
pub fn correction_for(history: &History, config: &EngineConfig) -> Correction {
    if let Some(c) = history.correction.get(&correction_key(config)) {
        return *c;
    }
    let (b, t) = (f64::from(config.max_batch_size.max(1)).ln(), f64::from(config.token_budget.max(1)).ln());
    history
        .correction
        .iter()
        .filter_map(|(k, c)| {
            let (tier, kb, kt) = parse_key(k)?;
            let other_tier = if tier == config.tier.as_str() { 0.0 } else { 100.0 };
            Some((other_tier + (kb.ln() - b).abs() + (kt.ln() - t).abs(), *c))
        })
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map_or_else(Correction::default, |(_, c)| c)
}
