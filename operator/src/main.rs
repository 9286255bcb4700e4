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
use clap::{Parser, Subcommand};
use pacer_runtime::{LogFormat, LogTarget};

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
    Run(Box<cmd::run::RunArgs>),
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
    pacer_runtime::init_logging(log_format, "info", log_target);
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
            .block_on(cmd::run::run(*args)),
        #[cfg(feature = "local")]
        Command::Local(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(cmd::local::run_local(args)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag can be set from the environment too, and `--help` names the variable.
    #[test]
    fn every_flag_has_an_environment_twin() {
        let missing = pacer_runtime::flags_without_env(&mut super::Cli::command());
        assert!(missing.is_empty(), "flags without an environment twin: {missing:?}");
    }
}
