//! The three levers the planner moves, and the quantization tiers in the order the spec ranks
//! them (most precise first).

use crate::Tier;
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
