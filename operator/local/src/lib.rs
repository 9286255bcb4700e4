//! Local mode, the embedded default: the whole SLA loop on one machine. The same
//! `InferenceService` spec the cluster uses, the same planner ([`pacer_planner::Planner`]), with
//! a different observe/actuate pair: engine replicas as child processes behind a
//! least-outstanding-requests router, and metrics scraped from the replicas directly.
//!
//! - [`replicas`]: the child processes and their convergence on the levers (the actuator).
//! - [`router`]: the OpenAI-compatible pass-through in front of them.
//! - [`source`]: the replicas' metrics, scraped, kept and windowed as PromQL would.
//! - [`load`]: built-in traffic with `pacer-bench`'s generator.
//! - [`report`]: the JSON report, the verdict and the timeline picture.
//! - [`view`]: the live terminal view.
//!
//! The config is checked with the CRD's own schema and CEL rules, in the API server's words
//! ([`pacer_crds::admission`]), then with the controller's own checks ([`pacer_crds::check`]).
//!
//! [`run`] ties them in one session (`session.rs`): every `policy.evaluationInterval` it
//! observes, decides and actuates; Ctrl-C or SIGTERM stops the load, drains the replicas and
//! still writes the report.

#![warn(clippy::too_many_lines)]

pub mod load;
pub mod replicas;
pub mod report;
pub mod router;
mod session;
pub mod source;
pub mod view;

use pacer_crds::InferenceService;
use pacer_crds::admission;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    pacer_crds::check::validate(&isvc).map_err(|e| invalid(e.to_string()))?;
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
    std::fs::create_dir_all(&options.out)
        .map_err(|source| LocalError::Io { what: format!("creating {}", options.out.display()), source })?;
    let mut session = session::Session::start(&options, &isvc).await?;
    let ended_by = session.drive().await?;
    session.finish(ended_by).await
}
