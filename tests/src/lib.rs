//! Pacer's cross-component test harness: a real Kubernetes control plane on loopback.
//!
//! [`Cluster::start`] runs etcd and kube-apiserver (and, with [`Workloads::Pods`], the
//! controller manager, the scheduler and kwok, whose fake nodes run pods to Ready without a
//! kubelet), built by `scripts/build-cluster-bins.sh` from their upstream Go modules. Ports are
//! free loopback ports, state lives in a temporary directory, and every process is stopped when
//! the [`Cluster`] drops — or, for a cluster shared by a whole test binary, when that binary
//! exits for any reason: each process runs under a watchdog that kills it once the test
//! process's end of a pipe closes, which the kernel does even after a panic or a kill.
//!
//! [`Prometheus::start`] runs a real Prometheus (built by `scripts/build-prometheus.sh`) that
//! scrapes [`EngineProcess`]es or [`StaticMetrics`] through file service discovery, relabelled
//! as a Kubernetes pod scrape would be.
//!
//! [`StallProxy`] sits between a client and the apiserver and can stall every byte, for the
//! faults a hung apiserver causes.
//!
//! Two identities: an admin (`system:masters`) for setting up, and `pacer-operator`, which holds
//! only what `config/rbac/operator.yaml` grants, so the operator's RBAC is tested for real.
#![forbid(unsafe_code)]

mod agent;
mod control_plane;
mod kwok;
mod process;
mod prometheus;
mod proxy;

pub use agent::{AgentConfig, NodeAgent, POD_NETWORK_RELABELING, loopback_of};
pub use control_plane::{Cluster, Workloads, bin_dir};
pub use process::OperatorProcess;
pub use prometheus::{
    EngineProcess, KUBERNETES_RELABELING, Prometheus, ScrapeTarget, Series, StaticMetrics, engine_bin,
    prometheus_bin_dir,
};
pub use proxy::StallProxy;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use std::sync::atomic::{AtomicU32, Ordering};

/// Creates a namespace named `<prefix>-<n>` (unique within this process) and returns its name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// Polls `check` every 100 ms until it returns `Some`, or panics with `what` after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {secs}s waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Parses a multi-document YAML file into JSON values (empty documents skipped).
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|doc| serde_json::Value::deserialize(doc).ok())
        .filter(|v| !v.is_null())
        .collect()
}
