//! The engine settings a service runs at: the live-settings document (the contract's
//! [`BatchSettings`]) from the levers the planner moves and the settings the spec fixes. One
//! function for the controller's ConfigMap and local mode's settings files.

use crate::InferenceService;
use pacer_engine_api::BatchSettings;
use pacer_planner::Levers;

/// The engine settings the spec fixes and the planner does not move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedSettings {
    /// The ITL budget (`max_step_ms`): `batching.maxStepMs`, or 0 (no time bound).
    pub max_step_ms: u64,
    /// The prompt hold (`prefill_hold_ms`): `batching.prefillHoldMs`, or 0 (no hold).
    pub prefill_hold_ms: u64,
}

/// The fixed engine settings of `isvc`. Always written, 0 when unset, so engines never fall
/// back to their own defaults and the planner predicts the steps the engines run.
pub fn fixed_settings(isvc: &InferenceService) -> FixedSettings {
    FixedSettings {
        max_step_ms: u64::from(isvc.spec.planner_spec().max_step_ms),
        prefill_hold_ms: u64::from(isvc.spec.batching.prefill_hold_ms.unwrap_or(0)),
    }
}

/// The settings the engines run at `levers`: the contract's document, so what the operator
/// writes is what the engine parses. A token budget below the batch is raised to it, as the
/// engine requires.
pub fn batch_settings(levers: &Levers, fixed: &FixedSettings) -> BatchSettings {
    BatchSettings {
        max_batch_size: levers.max_batch_size as usize,
        batch_wait_ms: u64::from(levers.batch_wait_ms),
        max_num_batched_tokens: levers.max_num_batched_tokens.max(levers.max_batch_size) as usize,
        max_step_ms: fixed.max_step_ms,
        prefill_hold_ms: fixed.prefill_hold_ms,
    }
}

/// The settings document the engine parses (`pacer-engine serve --settings-file`).
pub fn settings_json(levers: &Levers, fixed: &FixedSettings) -> String {
    batch_settings(levers, fixed).to_document()
}
