//! `pacer-operator`: the Kubernetes operator of Pacer.
//!
//! - `crd`: print the InferenceService CRD (the YAML committed under `crds/`).
//! - `run`: reconcile InferenceServices, with leader election, metrics and health endpoints.
//! - `local` (feature `local`): one InferenceService's SLA held on this machine.
//! - `simulate` and `calibrate` (feature `simulate`): a service under a scaling policy on a
//!   virtual clock, or every policy compared; the simulator against measured runs.
//!
//! The subcommands beside `crd` and `run` live in [`cmd`].

mod cmd;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use pacer_cli::{LogFormat, LogTarget};
use pacer_operator::controller::{self, Scope};
use pacer_operator::leader::{Elector, Leadership, Timing};
use pacer_operator::metrics_source::{MetricsSource, PrometheusArgs, PrometheusSource};
use pacer_operator::observer::Observer;
use pacer_operator::planner::{CapacityModel, EngineProfile};
use pacer_operator::sla::SlaLoop;
use pacer_operator::telemetry::{self, Metrics};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(
    name = "pacer-operator",
    version,
    about = "Pacer's Kubernetes operator: holds LLM inference to a latency SLA"
)]
struct Cli {
    /// Log format: human-readable text, or JSON lines for log collectors in a cluster.
    #[arg(long, env = "PACER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the InferenceService CustomResourceDefinition as YAML.
    Crd,
    /// Reconcile InferenceServices in the cluster of the kubeconfig (or in-cluster config).
    Run(Box<RunArgs>),
    /// Hold one InferenceService's SLA on this machine: engine replicas as local processes
    /// behind a router, the same planner, optional built-in load, a report at the end.
    #[cfg(feature = "local")]
    Local(cmd::local::LocalArgs),
    /// Simulate a service under a scaling policy on a virtual clock (no cluster, no engines).
    #[cfg(feature = "simulate")]
    Simulate(cmd::simulate::SimulateArgs),
    /// Replay a measured `pacer-bench run --requests-jsonl` through one simulated replica of the
    /// same tier and compare P50/P95 TTFT and ITL: how far the simulator is from the engine.
    #[cfg(feature = "simulate")]
    Calibrate(cmd::simulate::CalibrateArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
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

fn main() -> Result<()> {
    let Cli { log_format, command } = Cli::parse();
    // One logging setup for every subcommand, as for the other binaries.
    let log_target = match &command {
        // The live view owns the terminal: logs go to a file beside the report.
        #[cfg(feature = "local")]
        Command::Local(args) if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
            let log = std::fs::File::create(args.out.join("local.log")).context("creating local.log")?;
            LogTarget::File(log)
        }
        _ => LogTarget::Stderr,
    };
    pacer_cli::init_logging(log_format, "info", log_target);
    match command {
        Command::Crd => {
            print!("{}", pacer_operator::crd_yaml());
            Ok(())
        }
        #[cfg(feature = "simulate")]
        Command::Simulate(args) => cmd::simulate::simulate(args),
        #[cfg(feature = "simulate")]
        Command::Calibrate(args) => cmd::simulate::calibrate(args),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(run(*args)),
        #[cfg(feature = "local")]
        Command::Local(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(cmd::local::run_local(args)),
    }
}

async fn run(args: RunArgs) -> Result<()> {
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
    let mut leadership = Leadership::always();
    let keeper = if leader_elect {
        let timing = Timing {
            lease_duration: std::time::Duration::from_secs(lease_duration.max(2)),
            renew_deadline: std::time::Duration::from_secs(lease_duration.max(2) * 2 / 3),
            retry: std::time::Duration::from_secs((lease_duration / 7).max(1)),
        };
        let mut elector = Elector::new(
            Api::<Lease>::namespaced(client.clone(), &lease_namespace),
            lease_name,
            identity.clone(),
            timing,
        );
        tracing::info!(identity = %elector.identity(), "waiting for the leader Lease");
        // Standing by counts as ready: the replica is healthy and will take over when needed.
        metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::select! {
            acquired = elector.acquire() => acquired?,
            _ = pacer_cli::stop_signal() => return Ok(()),
        }
        metrics.leader.set(1);
        leadership = elector.leadership();
        Some(tokio::spawn(elector.keep(leading_tx, stop_rx)))
    } else {
        None
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
            _ = pacer_cli::stop_signal() => false,
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
    let observer = Observer::new(source, std::time::Duration::from_secs(interval.max(1)));
    Ok(Some(SlaLoop::new(observer, model)))
}

/// Every `*.json` engine profile in `dir`.
fn read_profiles(dir: &Path) -> Result<Vec<EngineProfile>> {
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading profiles in {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let profile = cmd::read_profile(&path)?;
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag can be set from the environment too, and `--help` names the variable.
    #[test]
    fn every_flag_has_an_environment_twin() {
        let missing = pacer_cli::flags_without_env(&mut super::Cli::command());
        assert!(missing.is_empty(), "flags without an environment twin: {missing:?}");
    }
}
