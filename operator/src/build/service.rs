//! The Service in front of the engine pods and their PodDisruptionBudget: how the replicas are
//! reached, and how many a voluntary disruption may take at once.

use super::{HTTP_PORT, child_meta, selector_labels};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use pacer_crds::InferenceService;

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
}
