//! The Service in front of the engine pods, their PodDisruptionBudget, and the PodMonitor that
//! tells a Prometheus Operator to scrape them with the labels METRICS.md names.

use super::{HTTP_PORT, child_meta, selector_labels};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use pacer_crds::{INFERENCESERVICE_LABEL, InferenceService};
use serde_json::json;

/// The engine Service: the OpenAI API and `/metrics` on port `http`.
pub fn service(isvc: &InferenceService) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(isvc, isvc.name_any()),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(isvc),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }))
    .expect("the Service JSON matches its schema (tested)")
}

/// At most one engine pod down for voluntary disruptions (node drains), so a drain never takes
/// several replicas at once; a single replica may still be moved.
pub fn pdb(isvc: &InferenceService) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_meta(isvc, isvc.name_any()),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(isvc)},
            // Pods that never became ready may be evicted: they serve nothing.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }))
    .expect("the PodDisruptionBudget JSON matches its schema (tested)")
}

/// The Prometheus Operator's PodMonitor kind.
pub fn pod_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PodMonitor"),
        "podmonitors",
    )
}

/// A PodMonitor scraping the engines' `/metrics`, relabelling the pod label
/// `serving.pacer.dev/inferenceservice` to `inferenceservice` (and keeping namespace and pod).
pub fn pod_monitor(isvc: &InferenceService) -> DynamicObject {
    let label_meta =
        format!("__meta_kubernetes_pod_label_{}", INFERENCESERVICE_LABEL.replace(['.', '/', '-'], "_"));
    let mut obj = DynamicObject::new(&isvc.name_any(), &pod_monitor_resource());
    obj.metadata = child_meta(isvc, isvc.name_any());
    obj.data = json!({
        "spec": {
            "selector": {"matchLabels": selector_labels(isvc)},
            "podMetricsEndpoints": [{
                "port": "http",
                "path": "/metrics",
                "interval": "15s",
                "relabelings": [
                    {"sourceLabels": [label_meta], "targetLabel": "inferenceservice"},
                    {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
                    {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"},
                ],
            }],
        },
    });
    obj
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;

    #[test]
    fn service_and_pdb_select_the_engine_pods() {
        let isvc = fixtures::isvc();
        let svc = service(&isvc);
        assert_eq!(svc.spec.as_ref().and_then(|s| s.selector.clone()), Some(selector_labels(&isvc)));
        let pdb = pdb(&isvc);
        let spec = pdb.spec.expect("spec");
        assert_eq!(spec.selector.and_then(|s| s.match_labels), Some(selector_labels(&isvc)));
    }

    #[test]
    fn pod_monitor_relabels_the_inferenceservice_label() {
        let pm = pod_monitor(&fixtures::isvc());
        let relabel = &pm.data["spec"]["podMetricsEndpoints"][0]["relabelings"][0];
        assert_eq!(
            relabel["sourceLabels"][0],
            "__meta_kubernetes_pod_label_serving_pacer_dev_inferenceservice"
        );
        assert_eq!(relabel["targetLabel"], "inferenceservice");
        assert_eq!(pm.types.as_ref().map(|t| t.kind.as_str()), Some("PodMonitor"));
    }
}
