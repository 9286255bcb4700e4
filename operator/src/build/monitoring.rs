//! The Service in front of the engine pods, their PodDisruptionBudget, and the PodMonitor that
//! tells a Prometheus Operator to scrape them with the labels METRICS.md names. All built from
//! typed structs; the PodMonitor's are declared here (the fields Pacer sets, nothing more).

use super::{HTTP_PORT, child_meta, selector_labels};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, ResourceExt};
use pacer_crds::{INFERENCESERVICE_LABEL, InferenceService};
use serde::{Deserialize, Serialize};

/// The engine Service: the OpenAI API and `/metrics` on port `http`.
pub fn service(isvc: &InferenceService) -> Service {
    Service {
        metadata: child_meta(isvc, isvc.name_any()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(isvc)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// At most one engine pod down for voluntary disruptions (node drains), so a drain never takes
/// several replicas at once; a single replica may still be moved.
pub fn pdb(isvc: &InferenceService) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: child_meta(isvc, isvc.name_any()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(isvc)),
                ..LabelSelector::default()
            }),
            // Pods that never became ready may be evicted: they serve nothing.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// The Prometheus Operator's PodMonitor (`monitoring.coreos.com/v1`), as far as Pacer sets it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(group = "monitoring.coreos.com", version = "v1", kind = "PodMonitor", namespaced, schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct PodMonitorSpec {
    /// The pods to scrape.
    pub selector: LabelSelector,
    /// How to scrape them.
    #[serde(default)]
    pub pod_metrics_endpoints: Vec<PodMetricsEndpoint>,
}

/// One scrape endpoint of a PodMonitor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodMetricsEndpoint {
    /// The container port's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The HTTP path of the metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The scrape interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Relabelings applied before ingestion.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<RelabelConfig>,
}

/// One Prometheus relabeling: copy `sourceLabels` (or write `replacement`) into `targetLabel`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RelabelConfig {
    /// The labels whose values are joined.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_labels: Vec<String>,
    /// The label written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
    /// The value written (without source labels: a constant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
}

/// A PodMonitor scraping the engines' `/metrics`, relabelling the pod label
/// `serving.pacer.dev/inferenceservice` to `inferenceservice` (and keeping namespace and pod).
pub fn pod_monitor(isvc: &InferenceService) -> PodMonitor {
    let label_meta =
        format!("__meta_kubernetes_pod_label_{}", INFERENCESERVICE_LABEL.replace(['.', '/', '-'], "_"));
    let relabel = |source: &str, target: &str| RelabelConfig {
        source_labels: vec![source.to_string()],
        target_label: Some(target.to_string()),
        replacement: None,
    };
    // The job the planner's queries match (`ENGINE_JOB`), in place of the operator's default
    // `<namespace>/<name>`.
    let job = RelabelConfig {
        source_labels: Vec::new(),
        target_label: Some("job".into()),
        replacement: Some(crate::metrics_source::queries::ENGINE_JOB.into()),
    };
    let mut pm = PodMonitor::new(
        &isvc.name_any(),
        PodMonitorSpec {
            selector: LabelSelector { match_labels: Some(selector_labels(isvc)), ..LabelSelector::default() },
            pod_metrics_endpoints: vec![PodMetricsEndpoint {
                // pacer-engine's probe port: its own connection limit keeps scrapes going under a
                // flood of API connections. vLLM serves its metrics on the API port.
                port: Some(
                    match isvc.spec.engine.runtime {
                        pacer_crds::Runtime::Pacer => super::PROBE_PORT_NAME,
                        pacer_crds::Runtime::Vllm => super::VLLM_PORT_NAME,
                    }
                    .into(),
                ),
                path: Some("/metrics".into()),
                interval: Some("15s".into()),
                relabelings: vec![
                    relabel(&label_meta, "inferenceservice"),
                    relabel("__meta_kubernetes_namespace", "namespace"),
                    relabel("__meta_kubernetes_pod_name", "pod"),
                    job,
                ],
            }],
        },
    );
    pm.metadata = child_meta(isvc, isvc.name_any());
    pm
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
        let pm = serde_json::to_value(pod_monitor(&fixtures::isvc())).expect("json");
        let relabel = &pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0];
        assert_eq!(
            relabel["sourceLabels"][0],
            "__meta_kubernetes_pod_label_serving_pacer_dev_inferenceservice"
        );
        assert_eq!(relabel["targetLabel"], "inferenceservice");
        assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "probes", "scraped on the probe port");
        let vllm = serde_json::to_value(pod_monitor(&fixtures::vllm())).expect("json");
        assert_eq!(
            vllm["spec"]["podMetricsEndpoints"][0]["port"], "http",
            "vLLM's metrics are on its API port"
        );
        let job = &pm["spec"]["podMetricsEndpoints"][0]["relabelings"][3];
        assert_eq!((&job["targetLabel"], &job["replacement"]), (&"job".into(), &"pacer-engines".into()));
        assert_eq!(
            (pm["apiVersion"].as_str(), pm["kind"].as_str()),
            (Some("monitoring.coreos.com/v1"), Some("PodMonitor"))
        );
        assert_eq!(pm["metadata"]["ownerReferences"][0]["name"], "smol");
    }
}
