//! `pacer-operator run`: the controller. Connects to the API server (every request counted),
//! serves `/metrics`, `/healthz` and `/readyz`, waits for the leader Lease when several replicas
//! run, and reconciles until a stop signal or the loss of the Lease.

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use pacer_operator::controller::{self, Scope};
use pacer_operator::leader::{Elector, Leadership, Timing};
use pacer_operator::metrics_source::{MetricsSource, PrometheusArgs, PrometheusSource};
use pacer_operator::planner::{CapacityModel, EngineProfile};
use pacer_operator::poller::MetricsPoller;
use pacer_operator::sla::SlaLoop;
use pacer_operator::telemetry::{self, Metrics};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Watch only these namespaces, comma-separated (the operator then needs Roles in them
    /// only) [default: every namespace].
    #[arg(long, alias = "namespace", env = "PACER_WATCH_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Never act in these namespaces, comma-separated, whatever the mode or their labels;
    /// `--exclude-namespaces=` excludes none.
    #[arg(
        long,
        env = "PACER_EXCLUDE_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease"
    )]
    exclude_namespaces: Vec<String>,
    /// In cluster mode (no `--namespaces`), act only in namespaces whose labels match this
    /// label selector, e.g. `pacer.dev/enabled=true` (needs `list` and `watch` on namespaces).
    #[arg(long, env = "PACER_NAMESPACE_SELECTOR")]
    namespace_selector: Option<String>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "PACER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Elect a leader with a Lease, so several replicas can run and one acts.
    #[arg(long, env = "PACER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, env = "PACER_LEASE_NAME", default_value = "pacer-operator")]
    lease_name: String,
    /// Namespace of the leader Lease [default: the pod's namespace, from POD_NAMESPACE].
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's identity in the Lease [default: the pod name, from POD_NAME, or host name and pid].
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, env = "PACER_LEASE_DURATION", default_value_t = 15)]
    lease_duration: u64,
    /// Where the SLA metrics come from. Without `--prometheus-url` the planner is off: the
    /// levers stay at their initial values and `SLAMet` is Unknown.
    #[command(flatten)]
    prometheus: PrometheusArgs,
    /// Seconds between two reads of the SLA metrics (for every InferenceService at once).
    #[arg(long, env = "PACER_METRICS_INTERVAL", default_value_t = 15)]
    metrics_interval: u64,
    /// A directory of engine profiles (`pacer-engine profile` JSON, one per tier) that seed the
    /// planner's capacity model; without them the planner is purely reactive.
    #[arg(long, env = "PACER_PROFILES")]
    profiles: Option<PathBuf>,
}

pub async fn run(args: RunArgs) -> Result<()> {
    let RunArgs {
        namespaces,
        exclude_namespaces,
        namespace_selector,
        metrics_addr,
        leader_elect,
        lease_name,
        lease_namespace,
        identity,
        lease_duration,
        prometheus,
        metrics_interval,
        profiles,
    } = args;
    let scope = Scope::new(namespaces, exclude_namespaces, namespace_selector)?;
    let sla = sla_loop(&prometheus, metrics_interval, profiles.as_deref())?;
    let metrics = Metrics::new();
    let mut config = kube::Config::infer().await.context("reading the kubeconfig or in-cluster config")?;
    // No request may hang forever: the apiserver answers a request within seconds, and a
    // watch is a long poll the server ends itself (kube's watcher asks for at most 290 s).
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    config.write_timeout = Some(std::time::Duration::from_secs(30));
    config.read_timeout = Some(std::time::Duration::from_secs(330));
    config.reset_reader_on_write = true;
    // Every request is counted by method and resource: the scale benchmark's "API calls per
    // no-op reconcile" reads this, and so can anyone watching the operator in production.
    let counter = metrics.api_requests.clone();
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        let (method, resource) =
            telemetry::request_labels(req.method().as_str(), req.uri().path(), req.uri().query());
        counter.with_label_values(&[&method, &resource]).inc();
        req
    });
    let client = kube::client::ClientBuilder::try_from(config)
        .context("building the Kubernetes client")?
        .with_layer(&count)
        .build();
    let version = client.apiserver_version().await.context("connecting to the Kubernetes API")?;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API");

    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding {metrics_addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let router = telemetry::router(metrics.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let identity = identity.unwrap_or_else(host_name);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (leading_tx, mut leading_rx) = watch::channel(true);
    let (leadership, keeper) = if leader_elect {
        let lease = Api::<Lease>::namespaced(client.clone(), &lease_namespace);
        let timing = Timing {
            lease_duration: std::time::Duration::from_secs(lease_duration.max(2)),
            renew_deadline: std::time::Duration::from_secs(lease_duration.max(2) * 2 / 3),
            retry: std::time::Duration::from_secs((lease_duration / 7).max(1)),
        };
        let elector = Elector::new(lease, lease_name, identity.clone(), timing);
        let Some((leadership, keeper)) = lead(elector, &metrics, leading_tx, stop_rx).await? else {
            return Ok(());
        };
        (leadership, Some(keeper))
    } else {
        (Leadership::always(), None)
    };

    // Stop on SIGTERM/Ctrl-C, or when leadership is lost (another replica is acting now).
    let lost = async move {
        while *leading_rx.borrow() {
            if leading_rx.changed().await.is_err() {
                break;
            }
        }
    };
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<bool>();
    let shutdown = async move {
        let lost_leadership = tokio::select! {
            _ = pacer_runtime::stop_signal() => false,
            _ = lost => true,
        };
        let _ = lost_tx.send(lost_leadership);
    };
    controller::run(client, scope, metrics.clone(), identity, sla, leadership, shutdown).await?;
    let lost_leadership = lost_rx.await.unwrap_or(false);
    let _ = stop_tx.send(true);
    if let Some(keeper) = keeper {
        let _ = keeper.await;
    }
    metrics.leader.set(0);
    if lost_leadership {
        anyhow::bail!("lost the leader Lease; exiting so a restart rejoins the election");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Waits for the leader Lease, then keeps renewing it in a task of its own; `None` when a stop
/// signal came first.
async fn lead(
    mut elector: Elector,
    metrics: &Metrics,
    leading: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> Result<Option<(Leadership, tokio::task::JoinHandle<()>)>> {
    tracing::info!(identity = %elector.identity(), "waiting for the leader Lease");
    // Standing by counts as ready: the replica is healthy and will take over when needed.
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::select! {
        acquired = elector.acquire() => acquired?,
        _ = pacer_runtime::stop_signal() => return Ok(None),
    }
    metrics.leader.set(1);
    let leadership = elector.leadership();
    Ok(Some((leadership, tokio::spawn(elector.keep(leading, stop)))))
}

/// The SLA loop, when a metrics source is configured.
fn sla_loop(prometheus: &PrometheusArgs, interval: u64, profiles: Option<&Path>) -> Result<Option<SlaLoop>> {
    let Some(source) =
        PrometheusSource::from_args(prometheus).context("configuring the Prometheus source")?
    else {
        tracing::warn!("no --prometheus-url: the SLA planner is off and SLAMet stays Unknown");
        return Ok(None);
    };
    let model = CapacityModel::new(match profiles {
        Some(dir) => read_profiles(dir)?,
        None => Vec::new(),
    });
    let source: Arc<dyn MetricsSource> = Arc::new(source);
    let poller = MetricsPoller::new(source, std::time::Duration::from_secs(interval.max(1)));
    Ok(Some(SlaLoop::new(poller, model)))
}

/// Every `*.json` engine profile in `dir`.
fn read_profiles(dir: &Path) -> Result<Vec<EngineProfile>> {
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading profiles in {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let profile = super::read_profile(&path)?;
            tracing::info!(tier = %profile.tier, path = %path.display(), "engine profile");
            profiles.push(profile);
        }
    }
    Ok(profiles)
}

/// The host name plus the process id: unique even for two replicas on one machine.
fn host_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "pacer-operator".into());
    format!("{host}_{}", std::process::id())
}
