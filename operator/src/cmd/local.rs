//! `pacer-operator local`: one InferenceService's SLA held on this machine (the `local`
//! feature; the controller's image is built without it).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct LocalArgs {
    /// The InferenceService manifest (the same file `kubectl apply -f` takes).
    #[arg(long, env = "PACER_LOCAL_CONFIG", default_value = "config/local.yaml")]
    config: PathBuf,
    /// The `pacer-engine` executable [default: next to this executable, then on PATH].
    #[arg(long, env = "PACER_ENGINE")]
    engine: Option<PathBuf>,
    /// The GGUF model the replicas serve [default: the model `scripts/fetch-model.sh` caches].
    #[arg(long, env = "PACER_MODEL")]
    model: Option<PathBuf>,
    /// The router's port on 127.0.0.1 (the OpenAI-compatible API clients use).
    #[arg(long, env = "PACER_LOCAL_PORT", default_value_t = 8000)]
    port: u16,
    /// Built-in traffic: `step` (light, heavy, light; about 4.5 minutes) or `none`.
    #[arg(long, env = "PACER_LOCAL_LOAD", value_enum, default_value_t = LoadArg::None)]
    load: LoadArg,
    /// Stop after this long (`90s`, `5m`) [default: the load plus a minute; without load, at Ctrl-C].
    #[arg(long, env = "PACER_LOCAL_DURATION", value_parser = parse_duration_arg)]
    duration: Option<std::time::Duration>,
    /// Where the report (JSON, timeline SVG and PNG), settings file and replica logs go.
    #[arg(long, env = "PACER_LOCAL_OUT", default_value = "target/pacer-local")]
    pub out: PathBuf,
    /// Engine profiles (`pacer-engine profile` JSON) seeding the capacity model; repeatable.
    #[arg(long = "profile", env = "PACER_LOCAL_PROFILES", value_delimiter = ',')]
    profiles: Vec<PathBuf>,
    /// With a load: the share of 1-minute windows (percent) that must hold the SLA; fewer, and
    /// the process exits with status 3 after writing its report.
    #[arg(long, env = "PACER_LOCAL_MIN_HELD", default_value_t = 80.0)]
    min_held: f64,
}

/// The exit status of `local` when its load ran and the SLA held in fewer windows than
/// `--min-held` asks.
const EXIT_SLA_NOT_HELD: i32 = 3;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LoadArg {
    Step,
    None,
}

fn parse_duration_arg(text: &str) -> Result<std::time::Duration, String> {
    pacer_crds::parse_duration(text).ok_or_else(|| format!("{text:?} is not a duration like 90s or 5m"))
}

/// Runs local mode; exits with [`EXIT_SLA_NOT_HELD`] when the load ran and the SLA was not held.
pub async fn run_local(args: LocalArgs) -> Result<()> {
    use pacer_local as local;
    let LocalArgs { config, engine, model, port, load, duration, out, profiles, min_held } = args;
    let engine = local::find_engine(engine)?;
    let model = match model {
        Some(m) => m,
        None => {
            default_model().context("no --model given and no cached model: run scripts/fetch-model.sh")?
        }
    };
    let options = local::Options {
        config,
        engine,
        model,
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        load: match load {
            LoadArg::Step => local::LoadKind::Step,
            LoadArg::None => local::LoadKind::None,
        },
        profile: None,
        duration,
        out,
        profiles,
        terminal: std::io::IsTerminal::is_terminal(&std::io::stdout()),
    };
    let outcome = local::run(options).await?;
    println!("{}", outcome.report.verdict);
    for file in &outcome.files {
        println!("wrote {}", file.display());
    }
    let report = &outcome.report;
    if report.load.is_some() && report.held_percent < min_held {
        eprintln!(
            "the SLA was not held: {:.0} % of windows, under the {min_held:.0} % that --min-held asks",
            report.held_percent
        );
        std::process::exit(EXIT_SLA_NOT_HELD);
    }
    Ok(())
}

/// The model `scripts/fetch-model.sh` caches, if it is there.
fn default_model() -> Option<PathBuf> {
    pacer_runtime::default_model_path().filter(|path| path.is_file())
}
