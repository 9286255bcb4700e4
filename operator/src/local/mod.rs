//! Local mode, the embedded default: the whole SLA loop on one machine. The same
//! `InferenceService` spec the cluster uses, the same [`planner::decide`], with a different
//! observe/actuate pair: engine replicas as child processes behind a least-outstanding-requests
//! router, and metrics scraped from the replicas directly.
//!
//! - [`replicas`]: the child processes and their convergence on the levers (the actuator).
//! - [`router`]: the OpenAI-compatible pass-through in front of them.
//! - [`source`]: the local [`MetricsSource`](crate::metrics_source::MetricsSource).
//! - [`load`]: built-in traffic with `pacer-bench`'s generator.
//! - [`report`]: the JSON report, the verdict and the timeline picture.
//! - [`view`]: the live terminal view.
//! - [`admission`]: the config checked with the CRD's own schema and CEL rules, in the API
//!   server's words.
//!
//! [`run`] ties them: every `policy.evaluationInterval` it observes, decides and actuates;
//! Ctrl-C or SIGTERM stops the load, drains the replicas and still writes the report.

pub mod admission;
pub mod load;
pub mod replicas;
pub mod report;
pub mod router;
pub mod source;
pub mod view;

use crate::metrics_source::{MetricsSource, ServiceKey, WindowRequest};
use crate::planner::{self, CapacityModel, EngineProfile, History, Observation};
use kube::ResourceExt;
use pacer_crds::InferenceService;
use replicas::{EngineConfig, Supervisor};
use router::{Pool, RouterState};
use source::LocalSource;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Why local mode could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The config file could not be read.
    #[error("reading the config {path}: {source}")]
    ReadConfig {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The config is not a valid InferenceService.
    #[error("the config {path} is not a valid InferenceService: {message}")]
    InvalidConfig {
        /// The file.
        path: String,
        /// What is wrong, in the apiserver's words where possible.
        message: String,
    },
    /// No engine executable.
    #[error(
        "no pacer-engine found ({looked}); build it with `cargo build --release -p pacer-engine` \
         (scripts/run.sh does) or pass --engine / PACER_ENGINE"
    )]
    NoEngine {
        /// Where it was looked for.
        looked: String,
    },
    /// The model file does not exist.
    #[error("no model at {0}; fetch it with scripts/fetch-model.sh or pass --model / PACER_MODEL")]
    NoModel(String),
    /// An engine profile could not be read.
    #[error("reading the engine profile {path}: {message}")]
    Profile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The output folder or the router's port.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The replicas could not be managed.
    #[error(transparent)]
    Supervisor(#[from] replicas::SupervisorError),
}

/// Which built-in load runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadKind {
    /// No load: the router waits for clients.
    None,
    /// Light → heavy → light ([`load::Profile::default_step`]).
    Step,
}

/// Everything `pacer-operator local` needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The InferenceService manifest.
    pub config: PathBuf,
    /// The `pacer-engine` executable.
    pub engine: PathBuf,
    /// The GGUF model.
    pub model: PathBuf,
    /// The router's address.
    pub listen: SocketAddr,
    /// The load.
    pub load: LoadKind,
    /// The profile to drive instead of the default step (tests use short ones).
    pub profile: Option<load::Profile>,
    /// Stop after this long [default: the load's length plus a minute; without load, never].
    pub duration: Option<Duration>,
    /// Where the report, settings file and replica logs go.
    pub out: PathBuf,
    /// Engine profiles seeding the capacity model (none: the planner is reactive).
    pub profiles: Vec<PathBuf>,
    /// Redraw a panel in place (stdout is a terminal) instead of plain lines.
    pub terminal: bool,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The report.
    pub report: report::Report,
    /// Files written.
    pub files: Vec<PathBuf>,
}

/// Reads and validates the InferenceService in `path`.
pub fn load_config(path: &Path) -> Result<InferenceService, LocalError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| LocalError::ReadConfig { path: path.display().to_string(), source })?;
    let invalid = |message: String| LocalError::InvalidConfig { path: path.display().to_string(), message };
    // The CRD's own schema and CEL rules, as the API server applies them on create; then the
    // operator's own checks, as in the cluster.
    let checked = admission::validate(&text).map_err(|e| invalid(e.to_string()))?;
    for warning in &checked.warnings {
        tracing::warn!(config = %path.display(), "{warning}");
    }
    let mut isvc = checked.service;
    crate::build::validate(&isvc).map_err(|e| invalid(e.to_string()))?;
    if isvc.spec.engine.runtime != pacer_crds::Runtime::Pacer {
        return Err(invalid(format!(
            "engine.runtime {} runs in a cluster only: local mode starts pacer-engine processes (set engine.runtime pacer, or leave it out)",
            isvc.spec.engine.runtime
        )));
    }
    isvc.metadata.namespace.get_or_insert_with(|| "default".into());
    Ok(isvc)
}

/// The `pacer-engine` to run: `explicit`, else the one next to this executable (the same
/// cargo target folder), else the first on `PATH`.
pub fn find_engine(explicit: Option<PathBuf>) -> Result<PathBuf, LocalError> {
    let mut looked = Vec::new();
    let candidates = explicit
        .into_iter()
        .chain(std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("pacer-engine"))));
    for c in candidates {
        if replicas::is_executable(&c) {
            return Ok(c);
        }
        looked.push(c.display().to_string());
    }
    if let Some(found) = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("pacer-engine"))
        .find(|p| replicas::is_executable(p))
    {
        return Ok(found);
    }
    looked.push("PATH".into());
    Err(LocalError::NoEngine { looked: looked.join(", ") })
}

/// The window request and token rates are computed over, as the cluster's observer does: short
/// enough to see a load step within a minute.
pub const RATE_WINDOW: f64 = 60.0;

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Runs local mode until the load and its tail end, `duration` passes, or a signal arrives;
/// drains everything and writes the report.
pub async fn run(options: Options) -> Result<Outcome, LocalError> {
    let isvc = load_config(&options.config)?;
    if !options.model.is_file() {
        return Err(LocalError::NoModel(options.model.display().to_string()));
    }
    let io = |what: String| move |source| LocalError::Io { what, source };
    std::fs::create_dir_all(&options.out).map_err(io(format!("creating {}", options.out.display())))?;
    let spec = isvc.spec.planner_spec();
    let mut profiles = Vec::new();
    for p in &options.profiles {
        let text = std::fs::read_to_string(p)
            .map_err(|e| LocalError::Profile { path: p.display().to_string(), message: e.to_string() })?;
        let profile = EngineProfile::parse(&text, &p.display().to_string())
            .map_err(|e| LocalError::Profile { path: p.display().to_string(), message: e.to_string() })?;
        profiles.push(profile);
    }
    let model = CapacityModel::new(profiles);
    let service = ServiceKey::new(isvc.namespace().unwrap_or_default(), isvc.name_any());
    let served_name = isvc.spec.model.served_name.clone().unwrap_or_else(|| isvc.name_any());

    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(io(format!("binding the router to {}", options.listen)))?;
    let router_addr = listener.local_addr().map_err(io("reading the router's address".into()))?;
    let pool = Arc::new(Pool::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut router_stop = stop_rx.clone();
    let router_pool = pool.clone();
    let server = tokio::spawn(async move {
        let app = router::router(RouterState::new(router_pool));
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = router_stop.wait_for(|s| *s).await;
            })
            .await;
    });

    let initial = isvc.initial_levers();
    let engine = EngineConfig {
        engine: options.engine.clone(),
        model: options.model.clone(),
        served_name: served_name.clone(),
        threads: isvc.spec.engine.threads.unwrap_or(1),
        context_length: isvc.spec.model.context_length,
        args: isvc.spec.engine.args.clone(),
        dir: options.out.clone(),
        start_timeout: Duration::from_secs(120),
        drain_timeout: Duration::from_secs(30),
        fixed: crate::build::fixed_settings(&isvc),
    };
    let mut supervisor = Supervisor::new(engine, pool.clone(), initial);
    let scrape_every = Duration::from_secs_f64((spec.evaluation_interval / 3.0).clamp(1.0, 5.0));
    let source = LocalSource::new(service.clone(), scrape_every, spec.window + 60.0, Arc::new(unix_now));
    let request = WindowRequest {
        service: service.clone(),
        quantile: spec.quantile(),
        window: spec.window,
        rate_window: RATE_WINDOW.min(spec.window),
    };

    let profile = match options.load {
        LoadKind::Step => Some(options.profile.clone().unwrap_or_else(load::Profile::default_step)),
        LoadKind::None => None,
    };
    let deadline =
        options.duration.or_else(|| profile.as_ref().map(|p| Duration::from_secs_f64(p.seconds() + 60.0)));
    let started = Instant::now();
    let records = load::Records::default();
    let mut load_task: Option<tokio::task::JoinHandle<()>> = None;
    let mut load_started_at = None;
    let mut view = view::View::new(options.terminal);
    view.note(&format!(
        "Pacer local mode: {} on http://{router_addr} (OpenAI API), report in {}",
        service,
        options.out.display()
    ));

    let mut levers = initial;
    let mut history = History::default();
    let mut ticks = Vec::new();
    let mut supervise = tokio::time::interval(Duration::from_millis(500));
    let mut scrape = tokio::time::interval(scrape_every);
    // The planner looks at every scrape and decides when `planner::due` says so: at its
    // evaluation interval, or early when a leading signal crosses.
    let mut evaluate = tokio::time::interval(scrape_every);
    for i in [&mut supervise, &mut scrape, &mut evaluate] {
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    let signal = pacer_cli::stop_signal();
    tokio::pin!(signal);
    let ended_by = loop {
        let load_done = async {
            match load_task.as_mut() {
                Some(t) if !t.is_finished() => {
                    let _ = t.await;
                }
                _ => std::future::pending().await,
            }
        };
        let out_of_time = async {
            match deadline {
                Some(d) => tokio::time::sleep_until((started + d).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            why = &mut signal => break why.to_string(),
            () = out_of_time => break "the run's duration ended".to_string(),
            () = load_done => {
                // A tail so the planner sees the load gone; then stop.
                load_task = None;
                view.note("the load ended");
            }
            _ = supervise.tick() => {
                for event in supervisor.tick().await? {
                    view.note(&format!("t={:.0}s {event:?}", started.elapsed().as_secs_f64()));
                }
                if load_task.is_none() && load_started_at.is_none() && pool.ready_count() > 0
                    && let Some(p) = &profile
                {
                        load_started_at = Some(started.elapsed().as_secs_f64());
                        view.note(&format!("starting the load: {} phases over {:.0} s", p.phases.len(), p.seconds()));
                        load_task = Some(tokio::spawn(load::drive(
                            format!("http://{router_addr}"),
                            served_name.clone(),
                            p.clone(),
                            records.clone(),
                            stop_rx.clone(),
                        )));
                }
            }
            _ = scrape.tick() => {
                let now = unix_now();
                let targets: Vec<source::Target> = supervisor
                    .metrics_targets()
                    .into_iter()
                    .map(|(id, started_s, url)| source::Target { id, started: now - started_s, url })
                    .collect();
                source.scrape(&targets).await;
            }
            _ = evaluate.tick() => {
                let observations = source.observe(std::slice::from_ref(&request)).await;
                let (freshness, metrics) = observations
                    .services
                    .get(&service)
                    .cloned()
                    .unwrap_or_else(|| (planner::Freshness::Missing { reason: "no answer".into() }, planner::ServiceMetrics::missing()));
                let counts = supervisor.counts();
                let observation = Observation {
                    at: observations.at,
                    freshness,
                    metrics,
                    ready_replicas: counts.ready,
                    desired_replicas: levers.replicas.max(counts.live),
                };
                let now = observations.at;
                if !planner::due(&spec, &observation, &history, now) {
                    planner::decide::note(&observation, &mut history);
                    continue;
                }
                let decision = planner::decide(&spec, &model, &observation, &levers, &history, now);
                history = decision.history.clone();
                let before = levers;
                if spec.enforce {
                    levers = decision.levers;
                    supervisor.set_target(levers);
                }
                if decision.change.is_some() {
                    tracing::info!(reason = decision.reason.as_str(), message = %decision.message, "planner decision");
                }
                let t = started.elapsed().as_secs_f64();
                let phase = load_started_at.zip(profile.as_ref()).map(|(at, p)| phase_of(p, t - at));
                view.show(&view::Frame {
                    t,
                    observation: &observation,
                    decision: &decision,
                    levers,
                    draining: counts.draining,
                    targets: (spec.ttft_target, spec.itl_target),
                    load: phase,
                    router: &router_addr.to_string(),
                });
                ticks.push(report::Tick {
                    t,
                    observation,
                    before,
                    decision: report::DecisionRow::of(&decision),
                    draining: counts.draining,
                });
            }
        }
    };

    view.note(&format!("stopping: {ended_by}; draining the replicas"));
    let _ = stop_tx.send(true);
    if let Some(task) = load_task {
        let _ = tokio::time::timeout(Duration::from_secs(60), task).await;
    }
    supervisor.shutdown().await;
    let _ = server.await;

    let records = records.snapshot();
    let windows = report::client_windows(&records, 60.0, spec.ttft_target, spec.itl_target);
    let (held_percent, verdict) = report::verdict(&windows);
    let report = report::Report {
        service: service.to_string(),
        targets: (spec.ttft_target, spec.itl_target),
        percentile: spec.percentile,
        load: profile,
        load_started_at,
        ticks,
        client_windows: windows,
        requests: records.len(),
        failed: records.iter().filter(|r| !r.ok()).count(),
        held_percent,
        verdict,
        ended_by,
    };
    let files = report::write(&options.out, &report).map_err(|e| LocalError::Io {
        what: "writing the report".into(),
        source: std::io::Error::other(e),
    })?;
    Ok(Outcome { report, files })
}

/// The load's phase at `t` seconds into it, as `rate/s (k of n)`.
fn phase_of(p: &load::Profile, t: f64) -> String {
    let mut end = 0.0;
    for (k, phase) in p.phases.iter().enumerate() {
        end += phase.seconds;
        if t < end {
            return format!("{:.1} req/s (phase {} of {})", phase.rate, k + 1, p.phases.len());
        }
    }
    "finished".into()
}
