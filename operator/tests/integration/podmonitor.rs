//! With the Prometheus Operator's PodMonitor kind served, the operator owns a PodMonitor per
//! InferenceService and watches it like its other children: an edit is reverted through the
//! watch, and a no-op reconcile sends no request at all. In a binary of its own, since the
//! PodMonitor CRD changes what every operator in the cluster does.

use crate::common::{TestNs, isvc_doc};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use pacer_operator::build::PodMonitor;
use pacer_tests::{OperatorProcess, eventually};
use serde_json::json;

/// A minimal PodMonitor CRD (the real one's schema is not needed to store the objects).
async fn install_pod_monitor_crd(ns: &TestNs) {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "podmonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"plural": "podmonitors", "singular": "podmonitor", "kind": "PodMonitor", "listKind": "PodMonitorList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    });
    crate::common::apply_json(&ns.admin, None, crd).await;
    let pm: Api<DynamicObject> =
        Api::namespaced_with(ns.admin.clone(), &ns.name, &crate::common::pod_monitor_resource());
    eventually(30, "the PodMonitor kind to be served", || {
        let pm = pm.clone();
        async move { pm.list(&Default::default()).await.ok().map(|_| ()) }
    })
    .await;
}

/// Requests to the API server by method and resource, leaving out watches and the leader Lease
/// (renewed on a timer).
async fn requests(op: &OperatorProcess) -> Vec<(String, f64)> {
    let mut counts = Vec::new();
    for resource in [
        "deployments",
        "services",
        "configmaps",
        "poddisruptionbudgets",
        "podmonitors",
        "inferenceservices",
        "events",
    ] {
        for method in ["GET", "PATCH", "POST", "PUT", "DELETE"] {
            let labels = format!("method=\"{method}\",resource=\"{resource}\"");
            let n = op.metric("pacer_operator_api_requests_total", &labels).await.unwrap_or(0.0);
            counts.push((format!("{method} {resource}"), n));
        }
    }
    counts
}

#[tokio::test]
async fn pod_monitors_are_owned_watched_and_cost_nothing_when_unchanged() {
    let ns = TestNs::new("podmonitor").await;
    install_pod_monitor_crd(&ns).await;
    let op = ns.operator("only");
    let created = ns.create(isvc_doc("smol")).await;
    let pod_monitors: Api<PodMonitor> = ns.api();
    let pm = eventually(60, "the PodMonitor", || {
        let pod_monitors = pod_monitors.clone();
        async move { pod_monitors.get_opt("smol").await.ok().flatten() }
    })
    .await;
    let owner = pm.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.first().map(|o| o.uid.as_str()), created.metadata.uid.as_deref());
    assert_eq!(pm.spec.pod_metrics_endpoints[0].path.as_deref(), Some("/metrics"));

    // An edit by someone else reaches the operator through the watch and is reverted.
    let edit = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                      "spec": {"podMetricsEndpoints": [{"port": "http", "path": "/other", "interval": "1m"}]}});
    pod_monitors
        .patch("smol", &PatchParams::apply("someone").force(), &Patch::Apply(&edit))
        .await
        .expect("edit");
    eventually(30, "the PodMonitor edit to be reverted", || {
        let pod_monitors = pod_monitors.clone();
        async move {
            let pm = pod_monitors.get("smol").await.ok()?;
            (pm.spec.pod_metrics_endpoints.len() == 1
                && pm.spec.pod_metrics_endpoints[0].path.as_deref() == Some("/metrics"))
            .then_some(())
        }
    })
    .await;

    // Wait for a settled state (Deployment status under kwok, our status write), then count the
    // requests of reconciles that find nothing to do.
    let sample = || async {
        (requests(&op).await, op.metric("pacer_operator_reconciles_total", "result=\"ok\"").await)
    };
    let mut last = sample().await;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let now = sample().await;
        if now == last {
            break;
        }
        last = now;
    }
    let (before, reconciles) = last;
    let reconciles = reconciles.unwrap_or(0.0);
    for i in 0..3 {
        let touch = json!({"metadata": {"labels": {"touched": format!("{i}")}}});
        ns.isvcs().patch("smol", &PatchParams::default(), &Patch::Merge(&touch)).await.expect("touch");
    }
    eventually(30, "the reconciles the touches cause", || async {
        let ok = op.metric("pacer_operator_reconciles_total", "result=\"ok\"").await?;
        (ok >= reconciles + 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(requests(&op).await, before, "a no-op reconcile sent requests:\n{}", op.log_text());
}
