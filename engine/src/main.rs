//! `pacer-engine`: run a llama-family GGUF model on CPU.
//!
//! - `generate`: stream a completion (or a chat reply) to stdout, with prefill/decode timings.
//! - `info`: print the model's metadata, sizes and available tiers.
//! - `bench`: measure prefill and batched decode throughput at one tier.
//! - `serve`: the OpenAI-compatible server with continuous batching and Prometheus metrics.
//! - `profile`: step times and quality at one tier, as the engine profile the planner reads.

mod cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};
use cmd::{bench::BenchArgs, generate::GenerateArgs, info::InfoArgs, profile::ProfileArgs, serve::ServeArgs};
use pacer_runtime::{LogFormat, LogTarget};

#[derive(Parser, Debug)]
#[command(
    name = "pacer-engine",
    version,
    about = "Pacer's LLM engine: llama-family GGUF models on CPU or, built with the `cuda` feature, NVIDIA GPUs"
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
    /// Generate text for a prompt and stream it to stdout.
    Generate(GenerateArgs),
    /// Print the model's metadata, sizes and tiers.
    Info(InfoArgs),
    /// Measure prefill and batched decode throughput.
    Bench(BenchArgs),
    /// Serve the OpenAI-compatible API with continuous batching.
    Serve(ServeArgs),
    /// Measure step times and quality at one tier into an engine profile (JSON).
    Profile(ProfileArgs),
}

fn main() -> Result<()> {
    let Cli { log_format, command } = Cli::parse();
    pacer_runtime::init_logging(log_format, "info", LogTarget::Stderr);
    match command {
        Command::Generate(args) => cmd::generate::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Profile(args) => cmd::profile::run(args),
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
