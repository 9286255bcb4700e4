//! The PodMonitor that tells a Prometheus Operator to scrape the engine pods with the labels
//! docs/metrics.md names, and its type (the fields Pacer sets, nothing more).

use super::{child_meta, selector_labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, ResourceExt};
use pacer_crds::{INFERENCESERVICE_LABEL, InferenceService};
use serde::{Deserialize, Serialize};

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
