//! Pure builders: an `InferenceService` plus the lever values to run at → the desired child
//! objects (Deployment, Service, ConfigMap, PodDisruptionBudget, PodMonitor). No IO; every
//! object carries the owner reference that lets Kubernetes garbage-collect it with its parent.
//! The engine container is `pacer-engine`'s or, with `engine.runtime: vllm`, vLLM's.

mod configmap;
mod deployment;
mod podmonitor;
mod service;
mod vllm;

pub use configmap::{FixedSettings, SETTINGS_FILE, SETTINGS_KEY, configmap, fixed_settings, settings_json};
pub use deployment::{
    DRAIN_SECONDS, ENGINE_CONTAINER, HTTP_PORT, PRE_STOP_SLEEP_SECONDS, PROBE_PORT, PROBE_PORT_NAME,
    TERMINATION_GRACE_SECONDS, deployment,
};
pub use podmonitor::{PodMonitor, PodMonitorSpec, pod_monitor};
pub use service::{pdb, service};
pub use vllm::VLLM_PORT_NAME;

pub use crate::planner::Levers;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
pub use pacer_crds::check::{MAX_NAME_LEN, SpecError, validate};
use pacer_crds::{INFERENCESERVICE_LABEL, InferenceService, parse_duration};
use std::collections::BTreeMap;
use std::time::Duration;

/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "pacer-operator";
/// `app.kubernetes.io/managed-by` on every child; the operator's watches select on it.
pub const MANAGED_BY: &str = "pacer-operator";
/// Label on the pod template naming the tier the pods run (also a Prometheus series label).
pub const TIER_LABEL: &str = "serving.pacer.dev/tier";
/// The evaluation interval (the requeue period of a healthy reconcile).
pub fn evaluation_interval(isvc: &InferenceService) -> Duration {
    parse_duration(&isvc.spec.policy.evaluation_interval).unwrap_or(Duration::from_secs(30))
}

/// The labels that select one InferenceService's engine pods (immutable in the Deployment).
pub fn selector_labels(isvc: &InferenceService) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "pacer-engine".to_string()),
        (INFERENCESERVICE_LABEL.to_string(), isvc.name_any()),
    ])
}

/// The labels of every child: the selector labels plus the recommended Kubernetes labels.
pub fn labels(isvc: &InferenceService) -> BTreeMap<String, String> {
    let mut l = selector_labels(isvc);
    l.insert("app.kubernetes.io/instance".to_string(), isvc.name_any());
    l.insert("app.kubernetes.io/component".to_string(), "engine".to_string());
    l.insert("app.kubernetes.io/part-of".to_string(), "pacer".to_string());
    l.insert("app.kubernetes.io/managed-by".to_string(), MANAGED_BY.to_string());
    l
}

/// The selector as a string, for status (`key=value,...`).
pub fn selector_string(isvc: &InferenceService) -> String {
    selector_labels(isvc).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Metadata of a child named `name`: namespace, labels, and a controller owner reference.
pub fn child_meta(isvc: &InferenceService, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: isvc.namespace(),
        labels: Some(labels(isvc)),
        owner_references: owner_reference(isvc).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

fn owner_reference(isvc: &InferenceService) -> Option<OwnerReference> {
    // `controller_owner_ref` needs the uid, which every object read from the API server has.
    isvc.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = Some(true);
        o
    })
}

/// The name of the ConfigMap with the live batch settings.
pub fn settings_name(isvc: &InferenceService) -> String {
    format!("{}-settings", isvc.name_any())
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! A valid InferenceService as read from the API server, for the builders' tests.
    use pacer_crds::{InferenceService, InferenceServiceSpec};

    /// `smol` in namespace `ml`, with a uid, built from sample-like YAML.
    pub fn isvc() -> InferenceService {
        let spec: InferenceServiceSpec = serde_json::from_value(serde_json::json!({
            "model": {"source": {"pvc": {"claimName": "models", "path": "smol/model.gguf"}}},
            "sla": {"ttftMs": 400, "itlMs": 60},
            "replicas": {"min": 1, "max": 3},
            "quantization": {"allowedTiers": ["native", "q4_0"], "allowDegrade": true},
        }))
        .expect("fixture spec");
        read_from_api("smol", spec)
    }

    /// `qwen` in namespace `ml`: a vLLM deployment with a bf16 and an fp8 variant on one GPU.
    pub fn vllm() -> InferenceService {
        let spec: InferenceServiceSpec = serde_json::from_value(serde_json::json!({
            "model": {},
            "engine": {
                "runtime": "vllm",
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"}},
            },
            "sla": {"ttftMs": 500, "itlMs": 50},
            "replicas": {"min": 1, "max": 4},
            "batching": {
                "maxBatchSize": {"min": 16, "max": 256, "initial": 64},
                "maxNumBatchedTokens": {"min": 512, "max": 8192, "initial": 2048},
            },
            "quantization": {
                "allowedTiers": ["bf16", "fp8"],
                "allowDegrade": true,
                "variants": [
                    {"tier": "bf16", "model": "Qwen/Qwen2.5-7B-Instruct"},
                    {"tier": "fp8", "model": "Qwen/Qwen2.5-7B-Instruct-FP8-dynamic", "args": ["--kv-cache-dtype=fp8"]},
                ],
            },
        }))
        .expect("fixture spec");
        read_from_api("qwen", spec)
    }

    fn read_from_api(name: &str, spec: InferenceServiceSpec) -> InferenceService {
        let mut isvc = InferenceService::new(name, spec);
        isvc.metadata.namespace = Some("ml".into());
        isvc.metadata.uid = Some("0b8a1c8e-0000-4000-8000-000000000001".into());
        isvc.metadata.generation = Some(1);
        isvc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pacer_crds::{InferenceServiceStatus, Tier};

    #[test]
    fn levers_start_at_the_initial_values() {
        let isvc = fixtures::isvc();
        let l = isvc.current_levers();
        assert_eq!(
            l,
            Levers {
                replicas: 1,
                max_batch_size: 8,
                batch_wait_ms: 0,
                max_num_batched_tokens: 512,
                tier: Tier::Native
            }
        );
    }

    #[test]
    fn levers_from_status_are_clamped_into_the_spec() {
        let mut isvc = fixtures::isvc();
        isvc.status = Some(InferenceServiceStatus {
            replicas: Some(9),
            max_batch_size: Some(64),
            batch_wait_ms: Some(5),
            tier: Some("q4_0".into()),
            ..Default::default()
        });
        let l = isvc.current_levers();
        assert_eq!(
            l,
            Levers {
                replicas: 3,
                max_batch_size: 32,
                batch_wait_ms: 5,
                max_num_batched_tokens: 512,
                tier: Tier::Q4_0
            }
        );
        // A tier no longer allowed, or degrading switched off, returns to the preferred tier.
        isvc.spec.quantization.allow_degrade = false;
        assert_eq!(isvc.current_levers().tier, Tier::Native);
    }

    #[test]
    fn names_that_cannot_name_a_service_are_rejected() {
        let mut isvc = fixtures::isvc();
        assert_eq!(validate(&isvc), Ok(()));
        for bad in ["a".repeat(MAX_NAME_LEN + 1), "9lives".into(), "with.dot".into(), "trailing-".into()] {
            isvc.metadata.name = Some(bad.clone());
            assert_eq!(validate(&isvc), Err(SpecError::Name(bad)));
        }
    }

    #[test]
    fn children_are_owned_by_their_inferenceservice() {
        let isvc = fixtures::isvc();
        let meta = child_meta(&isvc, "smol".into());
        let owner = &meta.owner_references.expect("owner")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("InferenceService", "smol"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(meta.labels.expect("labels")[INFERENCESERVICE_LABEL], "smol");
    }
}
