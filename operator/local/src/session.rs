//! One run of local mode: the router and the replicas started for a checked InferenceService,
//! then one loop whose every arm is a method here — supervising the replicas (and starting the
//! load once one is ready), scraping them, handing each observation to the planner's driver and
//! showing what it decided — until the load ends, the time runs out or a signal comes; then the
//! drain and the report.

use super::{LoadKind, LocalError, Options, Outcome, load, report, router, source, unix_now, view};
use crate::replicas::{ReplicaConfig, Supervisor};
use crate::router::{Pool, RouterState};
use crate::source::LocalSource;
use kube::ResourceExt;
use pacer_crds::InferenceService;
use pacer_planner::observation::{ServiceKey, WindowRequest};
use pacer_planner::{CapacityModel, EngineProfile, Freshness, Levers, Observation, Planner, PlannerSpec};
use pacer_planner::{Decision, ServiceMetrics};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Everything one run holds.
pub(crate) struct Session {
    service: ServiceKey,
    served_name: String,
    spec: PlannerSpec,
    model: CapacityModel,
    planner: Planner,
    levers: Levers,
    supervisor: Supervisor,
    pool: Arc<Pool>,
    source: LocalSource,
    request: WindowRequest,
    router_addr: SocketAddr,
    server: JoinHandle<()>,
    stop: watch::Sender<bool>,
    profile: Option<load::Profile>,
    deadline: Option<Duration>,
    started: Instant,
    records: load::Records,
    load_task: Option<JoinHandle<()>>,
    load_started_at: Option<f64>,
    view: view::View,
    rows: Vec<report::EvaluationRow>,
    out: PathBuf,
    scrape_every: Duration,
}

/// The engine profiles in `paths`, read and checked.
fn read_profiles(paths: &[PathBuf]) -> Result<Vec<EngineProfile>, LocalError> {
    paths
        .iter()
        .map(|p| {
            let path = p.display().to_string();
            let text = std::fs::read_to_string(p)
                .map_err(|e| LocalError::Profile { path: path.clone(), message: e.to_string() })?;
            EngineProfile::parse(&text, &path)
                .map_err(|e| LocalError::Profile { path, message: e.to_string() })
        })
        .collect()
}

/// The router on `listen`, over `pool`, until `stop` turns true.
async fn start_router(
    listen: SocketAddr,
    pool: Arc<Pool>,
    mut stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), LocalError> {
    let io = |what: String| move |source| LocalError::Io { what, source };
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(io(format!("binding the router to {listen}")))?;
    let addr = listener.local_addr().map_err(io("reading the router's address".into()))?;
    let server = tokio::spawn(async move {
        let app = router::router(RouterState::new(pool));
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
    });
    Ok((addr, server))
}

impl Session {
    /// Starts the router and the supervisor of `isvc`'s replicas.
    pub(crate) async fn start(options: &Options, isvc: &InferenceService) -> Result<Session, LocalError> {
        let spec = isvc.spec.planner_spec();
        let model = CapacityModel::new(read_profiles(&options.profiles)?);
        let service = ServiceKey::new(isvc.namespace().unwrap_or_default(), isvc.name_any());
        let served_name = isvc.spec.model.served_name.clone().unwrap_or_else(|| isvc.name_any());
        let pool = Arc::new(Pool::default());
        let (stop, stop_rx) = watch::channel(false);
        let (router_addr, server) = start_router(options.listen, pool.clone(), stop_rx).await?;
        let levers = isvc.initial_levers();
        let replicas = ReplicaConfig {
            engine: options.engine.clone(),
            model: options.model.clone(),
            served_name: served_name.clone(),
            threads: isvc.spec.engine.threads.unwrap_or(1),
            context_length: isvc.spec.model.context_length,
            args: isvc.spec.engine.args.clone(),
            dir: options.out.clone(),
            start_timeout: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(30),
            fixed: pacer_crds::settings::fixed_settings(isvc),
        };
        let supervisor = Supervisor::new(replicas, pool.clone(), levers);
        let scrape_every = Duration::from_secs_f64((spec.evaluation_interval / 3.0).clamp(1.0, 5.0));
        let source = LocalSource::new(service.clone(), scrape_every, spec.window + 60.0, Arc::new(unix_now));
        let request = WindowRequest {
            service: service.clone(),
            quantile: spec.quantile(),
            window: spec.window,
            rate_window: spec.rate_window(),
        };
        let profile = match options.load {
            LoadKind::Step => Some(options.profile.clone().unwrap_or_else(load::Profile::default_step)),
            LoadKind::None => None,
        };
        let deadline = options
            .duration
            .or_else(|| profile.as_ref().map(|p| Duration::from_secs_f64(p.seconds() + 60.0)));
        let mut view = view::View::new(options.terminal);
        view.note(&format!(
            "Pacer local mode: {service} on http://{router_addr} (OpenAI API), report in {}",
            options.out.display()
        ));
        Ok(Session {
            planner: Planner::new(spec.clone()),
            service,
            served_name,
            spec,
            model,
            levers,
            supervisor,
            pool,
            source,
            request,
            router_addr,
            server,
            stop,
            profile,
            deadline,
            started: Instant::now(),
            records: load::Records::default(),
            load_task: None,
            load_started_at: None,
            view,
            rows: Vec::new(),
            out: options.out.clone(),
            scrape_every,
        })
    }

    /// Runs the loop until the load and its tail end, the deadline passes or a signal comes;
    /// returns why it ended.
    pub(crate) async fn drive(&mut self) -> Result<String, LocalError> {
        let mut supervise = tokio::time::interval(Duration::from_millis(500));
        let mut scrape = tokio::time::interval(self.scrape_every);
        // The planner looks at every scrape and decides when its driver says one is due: at its
        // evaluation interval, or early when a leading signal crosses.
        let mut evaluate = tokio::time::interval(self.scrape_every);
        for i in [&mut supervise, &mut scrape, &mut evaluate] {
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let signal = pacer_runtime::stop_signal();
        tokio::pin!(signal);
        let end = self.deadline.map(|d| self.started + d);
        loop {
            let load_done = async {
                match self.load_task.as_mut() {
                    Some(t) if !t.is_finished() => {
                        let _ = t.await;
                    }
                    _ => std::future::pending().await,
                }
            };
            let out_of_time = async {
                match end {
                    Some(end) => tokio::time::sleep_until(end.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                why = &mut signal => return Ok(why.to_string()),
                () = out_of_time => return Ok("the run's duration ended".to_string()),
                () = load_done => {
                    // A tail so the planner sees the load gone; then stop.
                    self.load_task = None;
                    self.view.note("the load ended");
                }
                _ = supervise.tick() => self.supervise().await?,
                _ = scrape.tick() => self.scrape().await,
                _ = evaluate.tick() => self.evaluate(),
            }
        }
    }

    /// Moves the replicas toward the levers, and starts the load once one is ready.
    async fn supervise(&mut self) -> Result<(), LocalError> {
        for event in self.supervisor.tick().await? {
            self.view.note(&format!("t={:.0}s {event:?}", self.started.elapsed().as_secs_f64()));
        }
        if self.load_task.is_none()
            && self.load_started_at.is_none()
            && self.pool.ready_count() > 0
            && let Some(p) = &self.profile
        {
            self.load_started_at = Some(self.started.elapsed().as_secs_f64());
            self.view.note(&format!(
                "starting the load: {} phases over {:.0} s",
                p.phases.len(),
                p.seconds()
            ));
            self.load_task = Some(tokio::spawn(load::drive(
                format!("http://{}", self.router_addr),
                self.served_name.clone(),
                p.clone(),
                self.records.clone(),
                self.stop.subscribe(),
            )));
        }
        Ok(())
    }

    /// Scrapes every live replica once.
    async fn scrape(&self) {
        let now = unix_now();
        let targets: Vec<source::Target> = self
            .supervisor
            .metrics_targets()
            .into_iter()
            .map(|(id, started_s, url)| source::Target { id, started: now - started_s, url })
            .collect();
        self.source.scrape(&targets).await;
    }

    /// Hands the current observation to the planner's driver; applies and shows what it
    /// decided, if it decided.
    fn evaluate(&mut self) {
        let reading = self.source.observe(std::slice::from_ref(&self.request));
        let (freshness, metrics) = reading.services.get(&self.service).cloned().unwrap_or_else(|| {
            (Freshness::Missing { reason: "no answer".into() }, ServiceMetrics::missing())
        });
        let counts = self.supervisor.counts();
        let observation = Observation {
            at: reading.at,
            freshness,
            metrics,
            ready_replicas: counts.ready,
            desired_replicas: self.levers.replicas.max(counts.live),
        };
        let Some(decision) = self.planner.tick(&self.model, &observation, &self.levers, reading.at) else {
            return;
        };
        let before = self.levers;
        if self.spec.enforce {
            self.levers = decision.levers;
            self.supervisor.set_target(self.levers);
        }
        if decision.change.is_some() {
            tracing::info!(reason = decision.reason.as_str(), message = %decision.message, "planner decision");
        }
        self.show(observation, before, &decision, counts.draining);
    }

    /// The live view's frame and the report's row for one decision.
    fn show(&mut self, observation: Observation, before: Levers, decision: &Decision, draining: i32) {
        let t = self.started.elapsed().as_secs_f64();
        let phase = self.load_started_at.zip(self.profile.as_ref()).map(|(at, p)| phase_of(p, t - at));
        self.view.show(&view::Frame {
            t,
            observation: &observation,
            decision,
            levers: self.levers,
            draining,
            targets: (self.spec.ttft_target, self.spec.itl_target),
            load: phase,
            router: &self.router_addr.to_string(),
        });
        self.rows.push(report::EvaluationRow {
            t,
            observation,
            before,
            decision: report::DecisionRow::of(decision),
            draining,
        });
    }

    /// Stops the load, drains the replicas and the router, and writes the report.
    pub(crate) async fn finish(mut self, ended_by: String) -> Result<Outcome, LocalError> {
        self.view.note(&format!("stopping: {ended_by}; draining the replicas"));
        let _ = self.stop.send(true);
        if let Some(task) = self.load_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(60), task).await;
        }
        self.supervisor.shutdown().await;
        let _ = self.server.await;

        let spec = &self.spec;
        let records = self.records.snapshot();
        let windows = report::client_windows(&records, 60.0, spec.ttft_target, spec.itl_target);
        let (held_percent, verdict) = report::verdict(&windows);
        let report = report::Report {
            service: self.service.to_string(),
            targets: (spec.ttft_target, spec.itl_target),
            percentile: spec.percentile,
            load: self.profile,
            load_started_at: self.load_started_at,
            ticks: self.rows,
            client_windows: windows,
            requests: records.len(),
            failed: records.iter().filter(|r| !r.ok()).count(),
            held_percent,
            verdict,
            ended_by,
        };
        let files = report::write(&self.out, &report).map_err(|e| LocalError::Io {
            what: "writing the report".into(),
            source: std::io::Error::other(e),
        })?;
        Ok(Outcome { report, files })
    }
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
