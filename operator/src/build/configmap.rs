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

/// The settings document the engine parses (`pacer-engine serve --settings-file`).
pub fn settings_json(levers: &Levers) -> String {
    serde_json::json!({
        "max_batch_size": levers.max_batch_size,
        "batch_wait_ms": levers.batch_wait_ms,
        "max_num_batched_tokens": levers.max_num_batched_tokens.max(levers.max_batch_size),
    })
    .to_string()
}

/// The settings ConfigMap for `isvc` at `levers`.
pub fn configmap(isvc: &InferenceService, levers: &Levers) -> ConfigMap {
    ConfigMap {
        metadata: child_meta(isvc, settings_name(isvc)),
        data: Some(BTreeMap::from([(SETTINGS_KEY.to_string(), settings_json(levers))])),
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
        assert_eq!(
            doc,
            serde_json::json!({"max_batch_size": 12, "batch_wait_ms": 4, "max_num_batched_tokens": 256})
        );
    }
}
