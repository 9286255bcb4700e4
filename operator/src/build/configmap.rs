//! The ConfigMap with the engines' live batch settings, mounted at `--settings-file`; the
//! engine re-reads it when the kubelet swaps the mounted file, so no pod restarts.

use super::{Levers, child_meta, settings_name};
use k8s_openapi::api::core::v1::ConfigMap;
use pacer_crds::InferenceService;
use std::collections::BTreeMap;

/// The key of the settings document in the ConfigMap.
pub const SETTINGS_KEY: &str = "settings.json";
/// Where engine pods see it.
pub const SETTINGS_FILE: &str = "/etc/pacer/settings/settings.json";

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

/// The settings document the engine parses (`pacer-engine serve --settings-file`).
pub fn settings_json(levers: &Levers, fixed: &FixedSettings) -> String {
    serde_json::json!({
        "max_batch_size": levers.max_batch_size,
        "batch_wait_ms": levers.batch_wait_ms,
        "max_num_batched_tokens": levers.max_num_batched_tokens.max(levers.max_batch_size),
        "max_step_ms": fixed.max_step_ms,
        "prefill_hold_ms": fixed.prefill_hold_ms,
    })
    .to_string()
}

/// The settings ConfigMap for `isvc` at `levers`.
pub fn configmap(isvc: &InferenceService, levers: &Levers) -> ConfigMap {
    let doc = settings_json(levers, &fixed_settings(isvc));
    ConfigMap {
        metadata: child_meta(isvc, settings_name(isvc)),
        data: Some(BTreeMap::from([(SETTINGS_KEY.to_string(), doc)])),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use pacer_crds::Tier;

    #[test]
    fn settings_are_what_the_engine_reads() {
        let levers = Levers {
            replicas: 1,
            max_batch_size: 12,
            batch_wait_ms: 4,
            max_num_batched_tokens: 256,
            tier: Tier::Native,
        };
        let cm = configmap(&fixtures::isvc(), &levers);
        assert_eq!(cm.metadata.name.as_deref(), Some("smol-settings"));
        let doc: serde_json::Value =
            serde_json::from_str(&cm.data.expect("data")[SETTINGS_KEY]).expect("json");
        // No ITL budget and no hold in the spec: written as 0, so the engine does not use its
        // own defaults.
        assert_eq!(
            doc,
            serde_json::json!({"max_batch_size": 12, "batch_wait_ms": 4, "max_num_batched_tokens": 256, "max_step_ms": 0, "prefill_hold_ms": 0})
        );
        let mut isvc = fixtures::isvc();
        isvc.spec.batching.max_step_ms = Some(45);
        isvc.spec.batching.prefill_hold_ms = Some(700);
        let cm = configmap(&isvc, &levers);
        let doc: serde_json::Value =
            serde_json::from_str(&cm.data.expect("data")[SETTINGS_KEY]).expect("json");
        assert_eq!((&doc["max_step_ms"], &doc["prefill_hold_ms"]), (&45.into(), &700.into()));
    }

    #[test]
    fn the_engine_reads_the_document_as_written() {
        let levers = Levers {
            replicas: 2,
            max_batch_size: 24,
            batch_wait_ms: 3,
            max_num_batched_tokens: 8,
            tier: Tier::Native,
        };
        let doc = settings_json(&levers, &FixedSettings { max_step_ms: 40, prefill_hold_ms: 1500 });
        let base = pacer_engine::scheduler::BatchSettings::default();
        let read =
            pacer_engine::scheduler::BatchSettings::parse_over(base, &doc).expect("the engine accepts it");
        // A budget below the batch is raised to it, as the engine requires.
        let want = pacer_engine::scheduler::BatchSettings {
            max_batch_size: 24,
            batch_wait_ms: 3,
            max_num_batched_tokens: 24,
            max_step_ms: 40,
            prefill_hold_ms: 1500,
        };
        assert_eq!(read, want);
    }
}
