//! The part of an InferenceService spec the planner reads, in the units it computes with
//! (`pacer-crds` maps the API object onto it), so the simulator and local mode can build one
//! without a Kubernetes object.

use crate::Tier;
use crate::forecast::RATE_WINDOW;
use serde::{Deserialize, Serialize};

/// Targets, ranges and policy, with durations in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannerSpec {
    /// The SLA percentile, e.g. 95.
    pub percentile: f64,
    /// Target time to first token, seconds.
    pub ttft_target: f64,
    /// Target inter-token latency, seconds.
    pub itl_target: f64,
    /// Optional target end-to-end latency, seconds.
    pub e2e_target: Option<f64>,
    /// The window percentiles are computed over, seconds.
    pub window: f64,
    /// Fewest replicas.
    pub min_replicas: i32,
    /// Most replicas.
    pub max_replicas: i32,
    /// Range of `max_batch_size`.
    pub batch_min: u32,
    /// Range of `max_batch_size`.
    pub batch_max: u32,
    /// The `max_batch_size` the user chose as the default.
    pub batch_initial: u32,
    /// Range of `max_num_batched_tokens` (the step's token budget).
    pub budget_min: u32,
    /// Range of `max_num_batched_tokens`.
    pub budget_max: u32,
    /// The `max_num_batched_tokens` the user chose as the default.
    pub budget_initial: u32,
    /// Allowed tiers, most precise first.
    pub tiers: Vec<Tier>,
    /// The tier to run while the SLA holds.
    pub preferred_tier: Tier,
    /// Whether a faster, less precise tier may be used at max replicas.
    pub allow_degrade: bool,
    /// Whether decisions are applied.
    pub enforce: bool,
    /// Seconds between evaluations.
    pub evaluation_interval: f64,
    /// Seconds a violation must last before capacity is added.
    pub scale_up_stabilization: f64,
    /// Seconds headroom must last before capacity or precision is given back.
    pub scale_down_stabilization: f64,
    /// The engines' ITL budget in ms (`batching.maxStepMs`; 0 = none), which the operator
    /// renders into the engines' settings and the capacity model predicts with.
    pub max_step_ms: u32,
    /// Whether the engines read their batch settings only at start (vLLM), so that moving them
    /// is a rolling update of every pod, not a live change: the planner then weighs a batch
    /// move as a slow lever ([`crate::choose::roll_cost`]) and never uses it to cover a start.
    #[serde(default)]
    pub batch_rolls: bool,
}

impl PlannerSpec {
    /// The SLA percentile as a quantile in 0..1.
    pub fn quantile(&self) -> f64 {
        self.percentile / 100.0
    }

    /// The window request and token rates are computed over: [`RATE_WINDOW`], or the SLA
    /// window when shorter. Every driver asks its metrics source for rates over this window, and
    /// the forecast assumes it.
    pub fn rate_window(&self) -> f64 {
        RATE_WINDOW.min(self.window)
    }

    /// Position of `tier` in the allowed list (0 = most precise), if allowed.
    pub fn tier_rank(&self, tier: Tier) -> Option<usize> {
        self.tiers.iter().position(|t| *t == tier)
    }
}
