//! The three levers the planner moves, and the quantization tiers in the order the spec ranks
//! them (most precise first).

use pacer_crds::{InferenceService, Tier};
use serde::{Deserialize, Serialize};

/// The values of the three levers the children are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Levers {
    /// Engine replicas.
    pub replicas: i32,
    /// The engines' live `max_batch_size`.
    pub max_batch_size: u32,
    /// The engines' live `batch_wait_ms`.
    pub batch_wait_ms: u32,
    /// The engines' live `max_num_batched_tokens`: the token budget of one step.
    pub max_num_batched_tokens: u32,
    /// The weights' tier of the pod template.
    pub tier: Tier,
}

impl Levers {
    /// The levers a new InferenceService starts with: minimum replicas, the initial batch
    /// settings and the preferred tier.
    pub fn initial(isvc: &InferenceService) -> Levers {
        let s = &isvc.spec;
        Levers {
            replicas: s.replicas.min,
            max_batch_size: s.batching.max_batch_size.initial,
            batch_wait_ms: s.batching.batch_wait_ms.initial,
            max_num_batched_tokens: s
                .batching
                .max_num_batched_tokens
                .initial
                .max(s.batching.max_batch_size.initial),
            tier: s.quantization.preferred(),
        }
    }

    /// The levers the operator last decided (kept in status), brought inside the spec's current
    /// ranges: after a spec edit narrows a range, the nearest allowed value; without a status,
    /// the initial values.
    pub fn current(isvc: &InferenceService) -> Levers {
        let initial = Levers::initial(isvc);
        let Some(status) = &isvc.status else { return initial };
        let s = &isvc.spec;
        let tier = status
            .tier
            .as_deref()
            .and_then(|t| s.quantization.allowed_tiers.iter().copied().find(|a| a.as_str() == t))
            // Without degrading allowed, only the preferred tier runs.
            .filter(|t| s.quantization.allow_degrade || *t == initial.tier)
            .unwrap_or(initial.tier);
        Levers {
            replicas: status.replicas.unwrap_or(initial.replicas).clamp(s.replicas.min, s.replicas.max),
            max_batch_size: status
                .max_batch_size
                .unwrap_or(initial.max_batch_size)
                .clamp(s.batching.max_batch_size.min, s.batching.max_batch_size.max),
            batch_wait_ms: status
                .batch_wait_ms
                .unwrap_or(initial.batch_wait_ms)
                .clamp(s.batching.batch_wait_ms.min, s.batching.batch_wait_ms.max),
            max_num_batched_tokens: status
                .max_num_batched_tokens
                .unwrap_or(initial.max_num_batched_tokens)
                .clamp(s.batching.max_num_batched_tokens.min, s.batching.max_num_batched_tokens.max),
            tier,
        }
    }
}

/// Which lever a decision moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lever {
    /// Engine replicas.
    Replicas,
    /// `max_batch_size` / `batch_wait_ms` / `max_num_batched_tokens`: the live batch settings.
    Batch,
    /// The quantization tier.
    Tier,
}

impl Lever {
    /// The label value in metrics and the word in Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Lever::Replicas => "replicas",
            Lever::Batch => "batch",
            Lever::Tier => "tier",
        }
    }
}

/// Which way a lever moves, by its value: more replicas, a larger batch or a more precise tier
/// is `Up`; fewer, smaller or faster is `Down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// More replicas, a larger batch, or a more precise tier.
    Up,
    /// Fewer replicas, a smaller batch, or a faster, less precise tier.
    Down,
}

impl Direction {
    /// The label value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}
