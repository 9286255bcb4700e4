//! The ConfigMap with the engines' live batch settings, mounted at `--settings-file`; the
//! engine re-reads it when the kubelet swaps the mounted file, so no pod restarts.

use super::{Levers, child_meta, settings_name};
use k8s_openapi::api::core::v1::ConfigMap;
use pacer_crds::InferenceService;
pub use pacer_crds::settings::{FixedSettings, fixed_settings, settings_json};
use std::collections::BTreeMap;

/// The key of the settings document in the ConfigMap.
pub const SETTINGS_KEY: &str = "settings.json";
/// Where engine pods see it.
pub const SETTINGS_FILE: &str = "/etc/pacer/settings/settings.json";

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
    use pacer_engine_api::BatchSettings;

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
        let base = BatchSettings::default();
        let read = BatchSettings::parse_over(base, &doc).expect("the engine accepts it");
        // A budget below the batch is raised to it, as the engine requires.
        let want = BatchSettings {
            max_batch_size: 24,
            batch_wait_ms: 3,
            max_num_batched_tokens: 24,
            max_step_ms: 40,
            prefill_hold_ms: 1500,
        };
        assert_eq!(read, want);
    }
}
