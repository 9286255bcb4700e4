//! What every Pacer binary (`pacer-engine`, `pacer-operator`, `pacer-bench`) does the same way,
//! written once:
//! - the logging setup: `RUST_LOG` (else a default filter), text or flat JSON lines (one shape
//!   for all three, so one log pipeline reads them), to stderr coloured only on a terminal and
//!   never under `NO_COLOR`, or to a file without colour;
//! - Pacer's cache, and where `scripts/fetch-model.sh` puts the default model in it;
//! - the check, for each binary's tests, that every flag has an environment twin;
//! - the stop signal: Ctrl-C or SIGTERM, on which the engine drains, the controller hands its
//!   work back and local mode stops its replicas.
//!
//! A leaf crate (clap, tracing-subscriber and tokio's signals only), so the operator links no
//! engine code through it.

use std::io::IsTerminal;
use std::path::PathBuf;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One flat JSON object per line: the event's fields beside `timestamp`, `level`,
    /// `target` and `message`.
    Json,
}

/// Where log lines go.
#[derive(Debug)]
pub enum LogTarget {
    /// Standard error, coloured only on a terminal and never under `NO_COLOR`.
    Stderr,
    /// A file, without colour (for when a live view owns the terminal).
    File(std::fs::File),
}

/// Whether stderr gets colour: a terminal, and no `NO_COLOR`.
fn stderr_has_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Installs the process's logging: `RUST_LOG` or else `default_filter` (`info`, say), in
/// `format`, to `target`. Call once, first thing in `main`.
pub fn init_logging(format: LogFormat, default_filter: &str, target: LogTarget) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let (writer, ansi) = match target {
        LogTarget::Stderr => (BoxMakeWriter::new(std::io::stderr), stderr_has_colour()),
        LogTarget::File(file) => (BoxMakeWriter::new(std::sync::Mutex::new(file)), false),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// File name of the default model in Pacer's cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Pacer's cache: `$PACER_CACHE`, else `$XDG_CACHE_HOME/pacer`, else `~/.cache/pacer`; `None`
/// with none of the three set.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("PACER_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(|x| PathBuf::from(x).join("pacer"))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pacer")))
    })
}

/// Where `scripts/fetch-model.sh` caches the default model (whether or not it is there yet).
pub fn default_model_path() -> Option<PathBuf> {
    Some(cache_dir()?.join("models").join(DEFAULT_MODEL_FILE))
}

/// Resolves when Ctrl-C or SIGTERM arrives, and says which, for the log line that follows.
/// Where SIGTERM cannot be watched, Ctrl-C still stops. Both handlers are installed at the
/// first poll; from then on the signal no longer ends the process by itself.
pub async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminated = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted (Ctrl-C)",
        () = terminated => "terminated (SIGTERM)",
    }
}

/// The flags of `cmd` and its subcommands that have no environment twin, as
/// `"binary subcommand --flag"`; `--help` and `--version` need none.
pub fn flags_without_env(cmd: &mut clap::Command) -> Vec<String> {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_positional() || arg.is_hide_set() || id == "help" || id == "version" {
                continue;
            }
            if arg.get_env().is_none() {
                missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    cmd.build();
    let mut missing = Vec::new();
    walk(cmd, cmd.get_name(), &mut missing);
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    #[test]
    fn a_flag_without_a_twin_is_named_with_its_subcommand() {
        let mut cmd = Command::new("pacer-x")
            .arg(Arg::new("port").long("port").env("PACER_X_PORT"))
            .subcommand(Command::new("serve").arg(Arg::new("threads").long("threads")))
            .arg(Arg::new("file").index(1));
        assert_eq!(flags_without_env(&mut cmd), ["pacer-x serve --threads"]);
        let mut twinned = Command::new("pacer-y").arg(Arg::new("port").long("port").env("PACER_Y_PORT"));
        assert!(flags_without_env(&mut twinned).is_empty());
    }

    /// SIGTERM, sent to this very process once the handler is installed, resolves the future
    /// (and does not end the test binary).
    #[cfg(unix)]
    #[test]
    fn sigterm_resolves_the_stop_signal_and_is_named() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let how = runtime.block_on(async {
            let stop = stop_signal();
            tokio::pin!(stop);
            // The first poll installs the handlers; nothing has arrived yet.
            tokio::select! {
                biased;
                how = &mut stop => panic!("stopped before any signal: {how}"),
                () = tokio::task::yield_now() => {}
            }
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .expect("running kill");
            assert!(sent.success());
            tokio::time::timeout(std::time::Duration::from_secs(10), stop)
                .await
                .expect("the signal within 10 s")
        });
        assert_eq!(how, "terminated (SIGTERM)");
    }

    #[test]
    fn the_model_sits_under_the_cache() {
        let path = default_model_path();
        assert_eq!(path.is_some(), cache_dir().is_some());
        if let (Some(path), Some(cache)) = (path, cache_dir()) {
            assert_eq!(path, cache.join("models").join(DEFAULT_MODEL_FILE));
        }
    }
}
