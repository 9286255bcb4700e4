//! Local mode's actuator: engine replicas as child processes on loopback ports. It converges
//! the processes on the levers the planner decided, one step per [`Supervisor::tick`]:
//! starts replicas (health-checked on `/ready` before the router sends them anything), drains
//! surplus ones (out of the router, in-flight requests finished, then SIGTERM and the engine's
//! own drain), rolls a new tier one replica at a time with surge (start one, wait until ready,
//! then drain one old), replaces a replica that died, and writes the live batch settings to
//! the one settings file every replica watches (temp file and rename, as the kubelet swaps a
//! mounted ConfigMap).
//!
//! Children die with the parent: each runs in its own process group (so a terminal's Ctrl-C
//! reaches only the operator, which drains them in order) and, on Linux, under
//! `setpriv --pdeathsig KILL`, so even a crashed or killed operator leaves no engine behind.

use super::router::{Backend, Pool};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use pacer_crds::Tier;
use pacer_planner::Levers;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How replicas are started.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// The `pacer-engine` executable.
    pub engine: PathBuf,
    /// The GGUF model.
    pub model: PathBuf,
    /// The name clients send in `model`.
    pub served_name: String,
    /// Compute threads per replica.
    pub threads: u32,
    /// Largest context, when the spec caps it.
    pub context_length: Option<u32>,
    /// Extra `pacer-engine serve` arguments from the spec.
    pub args: Vec<String>,
    /// Where the settings file and the replicas' logs go.
    pub dir: PathBuf,
    /// Seconds a replica may take to become ready before it is replaced.
    pub start_timeout: Duration,
    /// Seconds a drain may take (the engine's `--drain-timeout`, and the router's wait).
    pub drain_timeout: Duration,
    /// The engine settings the spec fixes: ITL budget and prompt hold
    /// ([`pacer_crds::settings::fixed_settings`]).
    pub fixed: pacer_crds::settings::FixedSettings,
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Started, not ready yet: gets no requests.
    Starting,
    /// In the router's choice.
    Ready,
}

/// One engine process.
#[derive(Debug)]
struct Replica {
    id: u32,
    port: u16,
    tier: Tier,
    phase: Phase,
    started: Instant,
    child: Child,
    backend: Arc<Backend>,
}

/// A replica on its way out: the task that drains and stops it.
#[derive(Debug)]
struct Draining {
    id: u32,
    task: tokio::task::JoinHandle<()>,
}

/// A snapshot of the replicas, for the loop, the view and the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Replicas in the router's choice, on the desired tier.
    pub ready: i32,
    /// Replicas started and not draining (ready or starting).
    pub live: i32,
    /// Replicas draining.
    pub draining: i32,
}

/// What happened to the replicas in one tick, for the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A replica was started.
    Started {
        /// Its id.
        id: u32,
        /// Its port.
        port: u16,
        /// Its tier.
        tier: Tier,
    },
    /// A replica passed its readiness check.
    Ready {
        /// Its id.
        id: u32,
        /// Seconds from start.
        after: f64,
    },
    /// A replica is being drained.
    Draining {
        /// Its id.
        id: u32,
    },
    /// A replica exited on its own or never became ready: it is replaced.
    Died {
        /// Its id.
        id: u32,
        /// Its exit status or why it was given up.
        why: String,
    },
}

/// Why the supervisor could not act.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// No free loopback port.
    #[error("finding a free loopback port: {0}")]
    Port(#[source] std::io::Error),
    /// The engine could not be started.
    #[error("starting {engine}: {source}")]
    Spawn {
        /// The executable.
        engine: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The settings file could not be written.
    #[error("writing the settings file {path}: {source}")]
    Settings {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The replicas and their convergence on the levers.
pub struct Supervisor {
    config: ReplicaConfig,
    pool: Arc<Pool>,
    http: reqwest::Client,
    target: Levers,
    /// The settings document last written, so only changes are written.
    written: Option<String>,
    replicas: Vec<Replica>,
    draining: Vec<Draining>,
    next_id: u32,
    setpriv: Option<PathBuf>,
}

impl Supervisor {
    /// A supervisor of no replicas yet, at `initial` levers; replicas start on the first tick.
    pub fn new(config: ReplicaConfig, pool: Arc<Pool>, initial: Levers) -> Supervisor {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Supervisor {
            config,
            pool,
            http,
            target: initial,
            written: None,
            replicas: Vec::new(),
            draining: Vec::new(),
            next_id: 0,
            setpriv: find_setpriv(),
        }
    }

    /// The settings file every replica watches.
    pub fn settings_file(&self) -> PathBuf {
        self.config.dir.join("settings.json")
    }

    /// The levers to converge on from now.
    pub fn set_target(&mut self, levers: Levers) {
        self.target = levers;
    }

    /// The levers being converged on.
    pub fn target(&self) -> Levers {
        self.target
    }

    /// Ready, live and draining replicas.
    pub fn counts(&self) -> Counts {
        let ready =
            self.replicas.iter().filter(|r| r.phase == Phase::Ready && r.tier == self.target.tier).count()
                as i32;
        Counts { ready, live: self.replicas.len() as i32, draining: self.draining.len() as i32 }
    }

    /// The replicas to scrape (draining ones are gone from here: their series stop, as a
    /// deleted pod's do): id, seconds since start, `/metrics` URL.
    pub fn metrics_targets(&self) -> Vec<(u32, f64, String)> {
        self.replicas
            .iter()
            .map(|r| (r.id, r.started.elapsed().as_secs_f64(), format!("{}/metrics", r.backend.base_url)))
            .collect()
    }

    /// The process ids of every replica still running, draining ones included.
    pub fn pids(&self) -> Vec<u32> {
        self.replicas.iter().filter_map(|r| r.child.id()).collect()
    }

    /// One convergence step: settings, deaths, readiness, then starts and drains.
    pub async fn tick(&mut self) -> Result<Vec<Event>, SupervisorError> {
        let mut events = Vec::new();
        self.write_settings()?;
        self.draining.retain(|d| !d.task.is_finished());
        self.reap(&mut events);
        self.check_ready(&mut events).await;
        self.converge(&mut events)?;
        Ok(events)
    }

    /// Writes the batch settings when they changed: a temp file renamed over the old one, so
    /// an engine never reads half a document.
    fn write_settings(&mut self) -> Result<(), SupervisorError> {
        let wanted = pacer_crds::settings::settings_json(&self.target, &self.config.fixed);
        if self.written.as_ref() == Some(&wanted) {
            return Ok(());
        }
        let path = self.settings_file();
        let err = |source| SupervisorError::Settings { path: path.display().to_string(), source };
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, &wanted).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)?;
        self.written = Some(wanted);
        Ok(())
    }

    /// Finds replicas that exited, or did not become ready in time, and forgets them (the
    /// convergence step then starts replacements).
    fn reap(&mut self, events: &mut Vec<Event>) {
        let timeout = self.config.start_timeout;
        let mut i = 0;
        while i < self.replicas.len() {
            let r = &mut self.replicas[i];
            let why = match r.child.try_wait() {
                Ok(Some(status)) => Some(format!("exited with {status}")),
                Err(e) => Some(format!("could not be waited for: {e}")),
                Ok(None) if r.phase == Phase::Starting && r.started.elapsed() > timeout => {
                    Some(format!("not ready after {}s", timeout.as_secs()))
                }
                Ok(None) => None,
            };
            if let Some(why) = why {
                let mut gone = self.replicas.remove(i);
                self.pool.remove(gone.id);
                let _ = gone.child.start_kill();
                tracing::warn!(replica = gone.id, port = gone.port, %why, "a replica died; replacing it");
                events.push(Event::Died { id: gone.id, why });
            } else {
                i += 1;
            }
        }
    }

    async fn check_ready(&mut self, events: &mut Vec<Event>) {
        for r in self.replicas.iter_mut().filter(|r| r.phase == Phase::Starting) {
            let url = format!("{}/ready", r.backend.base_url);
            let ready = self.http.get(&url).send().await.is_ok_and(|a| a.status().is_success());
            if ready {
                r.phase = Phase::Ready;
                self.pool.add(r.backend.clone());
                let after = r.started.elapsed().as_secs_f64();
                tracing::info!(replica = r.id, port = r.port, tier = %r.tier, after_s = after, "replica ready");
                events.push(Event::Ready { id: r.id, after });
            }
        }
    }

    /// Starts what is missing and drains what is surplus. A tier rollout surges: with every
    /// replica in place, one more on the new tier starts; an old one is drained only once a new
    /// one is ready, so capacity never drops.
    fn converge(&mut self, events: &mut Vec<Event>) -> Result<(), SupervisorError> {
        let want = self.target.replicas.max(0) as usize;
        let tier = self.target.tier;
        let live = self.replicas.len();
        let old = self.replicas.iter().filter(|r| r.tier != tier).count();
        let new_starting =
            self.replicas.iter().filter(|r| r.tier == tier && r.phase == Phase::Starting).count();
        if live < want {
            for _ in live..want {
                self.start(tier, events)?;
            }
            return Ok(());
        }
        if old > 0 && new_starting == 0 && live == want {
            return self.start(tier, events);
        }
        if live > want {
            if old > 0 && new_starting > 0 {
                // The surge replica is still starting: keep every old one until it is ready.
                return Ok(());
            }
            for _ in want..live {
                if let Some(victim) = self.victim() {
                    self.drain(victim, events);
                }
            }
        }
        Ok(())
    }

    /// The replica to drain next: old tier first, then one still starting, then the least busy.
    fn victim(&self) -> Option<usize> {
        let tier = self.target.tier;
        (0..self.replicas.len()).min_by_key(|&i| {
            let r = &self.replicas[i];
            (r.tier == tier, r.phase == Phase::Ready, r.backend.outstanding(), std::cmp::Reverse(r.id))
        })
    }

    fn start(&mut self, tier: Tier, events: &mut Vec<Event>) -> Result<(), SupervisorError> {
        let port = free_port()?;
        let id = self.next_id;
        self.next_id += 1;
        let c = &self.config;
        let log = std::fs::File::create(c.dir.join(format!("replica-{id}.log"))).ok();
        let mut command = match &self.setpriv {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.arg("--pdeathsig").arg("KILL").arg("--").arg(&c.engine);
                cmd
            }
            None => Command::new(&c.engine),
        };
        command
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--tier", tier.as_str()])
            .args(["--threads", &c.threads.to_string(), "--served-model-name", &c.served_name])
            .arg("--model")
            .arg(&c.model)
            .arg("--settings-file")
            .arg(self.settings_file())
            .args(["--max-batch-size", &self.target.max_batch_size.to_string()])
            .args(["--batch-wait-ms", &self.target.batch_wait_ms.to_string()])
            .args(["--max-num-batched-tokens", &self.target.max_num_batched_tokens.to_string()])
            .args(["--max-step-ms", &c.fixed.max_step_ms.to_string()])
            .args(["--prefill-hold-ms", &c.fixed.prefill_hold_ms.to_string()])
            .args(["--drain-timeout", &c.drain_timeout.as_secs().to_string()]);
        if let Some(n) = c.context_length {
            command.args(["--context-length", &n.to_string()]);
        }
        command.args(&c.args).env("NO_COLOR", "1").stdin(Stdio::null());
        match log.as_ref().and_then(|f| Some((f.try_clone().ok()?, f.try_clone().ok()?))) {
            Some((out, err)) => command.stdout(out).stderr(err),
            None => command.stdout(Stdio::null()).stderr(Stdio::null()),
        };
        // Its own process group: a terminal's Ctrl-C goes to the operator alone, which drains
        // the replicas in order instead of having them all stop at once.
        command.process_group(0).kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|source| SupervisorError::Spawn { engine: c.engine.display().to_string(), source })?;
        let backend = Backend::new(id, format!("http://127.0.0.1:{port}"));
        tracing::info!(replica = id, port, tier = %tier, pid = child.id(), "replica starting");
        events.push(Event::Started { id, port, tier });
        self.replicas.push(Replica {
            id,
            port,
            tier,
            phase: Phase::Starting,
            started: Instant::now(),
            child,
            backend,
        });
        Ok(())
    }

    /// Takes replica `index` out of the router and drains it in the background: waits for the
    /// router's in-flight requests to it, then SIGTERM (the engine finishes its own in-flight
    /// work within `--drain-timeout`), then SIGKILL if it is still there after that.
    fn drain(&mut self, index: usize, events: &mut Vec<Event>) {
        let r = self.replicas.remove(index);
        self.pool.remove(r.id);
        tracing::info!(replica = r.id, port = r.port, tier = %r.tier, "draining replica");
        events.push(Event::Draining { id: r.id });
        let timeout = self.config.drain_timeout;
        let id = r.id;
        let task = tokio::spawn(stop(r.child, r.backend, timeout));
        self.draining.push(Draining { id, task });
    }

    /// Drains every replica and waits until all have exited (Ctrl-C, end of run).
    pub async fn shutdown(&mut self) {
        while !self.replicas.is_empty() {
            self.drain(0, &mut Vec::new());
        }
        for d in self.draining.drain(..) {
            if d.task.await.is_err() {
                tracing::warn!(replica = d.id, "a drain task failed");
            }
        }
    }

    /// Kills a replica process at once, as a crash would (for tests and fault drills).
    pub fn kill_replica(&mut self, id: u32) -> bool {
        self.replicas.iter_mut().find(|r| r.id == id).is_some_and(|r| r.child.start_kill().is_ok())
    }

    /// Ids of the replicas, ready or starting, with their tier and phase.
    pub fn replicas(&self) -> Vec<(u32, Tier, Phase)> {
        self.replicas.iter().map(|r| (r.id, r.tier, r.phase)).collect()
    }
}

impl Drop for Supervisor {
    /// The last line of defence (a panic, an early return): every process group still there is
    /// killed, draining ones included.
    fn drop(&mut self) {
        for r in &self.replicas {
            if let Some(pid) = r.child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

async fn stop(mut child: Child, backend: Arc<Backend>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while backend.outstanding() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let grace = timeout + Duration::from_secs(5);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(replica = backend.id, "replica did not stop after its drain; killing it");
        let _ = child.kill().await;
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16, SupervisorError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(SupervisorError::Port)?;
    Ok(listener.local_addr().map_err(SupervisorError::Port)?.port())
}

/// `setpriv` (util-linux), which sets the parent-death signal and then runs the engine: the
/// kernel kills the engine when the operator dies, however it dies. Elsewhere, `None`.
fn find_setpriv() -> Option<PathBuf> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file());
    if found.is_none() {
        tracing::warn!("setpriv not found: engines outlive the operator if it is killed with SIGKILL");
    }
    found
}

/// Whether `path` can be run.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
