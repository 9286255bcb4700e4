//! `pacer-bench run`: load an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E,
//! throughput and goodput against SLOs.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::metrics::Slo;
use pacer_bench::run::{RunPlan, run};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "pacer-bench",
    version,
    about = "Client-side SLA benchmark for OpenAI-compatible LLM servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one load level and report latency, throughput and goodput.
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Server base URL.
    #[arg(long, env = "PACER_BENCH_URL", default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name to send.
    #[arg(long, env = "PACER_BENCH_MODEL")]
    model: String,
    /// Endpoint to load.
    #[arg(long, value_enum, default_value_t = Endpoint::Chat)]
    endpoint: Endpoint,
    /// Bearer token.
    #[arg(long, env = "PACER_BENCH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Closed loop: requests in flight (excludes --request-rate).
    #[arg(long, conflicts_with = "request_rate")]
    concurrency: Option<usize>,
    /// Open loop: mean requests per second.
    #[arg(long)]
    request_rate: Option<f64>,
    /// Open loop: gamma shape of inter-arrival times (1 = Poisson, <1 burstier, inf = constant).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Measured requests.
    #[arg(long, default_value_t = 100)]
    num_requests: usize,
    /// Stop scheduling new requests after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Unmeasured requests sent first, one at a time.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Prompt length in tokens: N, uniform:MIN:MAX or normal:MEAN:SD.
    #[arg(long, default_value = "128")]
    input_len: Length,
    /// max_tokens per request: N, uniform:MIN:MAX or normal:MEAN:SD.
    #[arg(long, default_value = "64")]
    output_len: Length,
    /// Words every prompt starts with (a shared system prompt).
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// Ask the server to ignore EOS so outputs have the requested length (vLLM, Pacer).
    #[arg(long)]
    ignore_eos: bool,
    /// Seed for prompts, lengths and arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// SLO on TTFT, ms.
    #[arg(long)]
    slo_ttft_ms: Option<f64>,
    /// SLO on TPOT, ms.
    #[arg(long)]
    slo_tpot_ms: Option<f64>,
    /// SLO on E2E latency, ms.
    #[arg(long)]
    slo_e2e_ms: Option<f64>,
    /// SLO on every inter-token gap of a request, ms.
    #[arg(long)]
    slo_itl_ms: Option<f64>,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one JSON line per request here.
    #[arg(long)]
    requests_jsonl: Option<PathBuf>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let Cli { command } = Cli::parse();
    match command {
        Command::Run(args) => run_cmd(args),
    }
}

fn run_cmd(a: RunArgs) -> Result<()> {
    let arrivals = match (a.concurrency, a.request_rate) {
        (Some(c), None) if c > 0 => Arrivals::Closed { concurrency: c },
        (None, Some(r)) if r > 0.0 => Arrivals::Open { rate: r, burstiness: a.burstiness },
        (None, None) => Arrivals::Closed { concurrency: 1 },
        _ => bail!("--concurrency must be positive, --request-rate must be positive"),
    };
    if a.burstiness <= 0.0 {
        bail!("--burstiness must be positive");
    }
    let target = Target {
        base_url: a.base_url.clone(),
        model: a.model.clone(),
        endpoint: a.endpoint,
        api_key: a.api_key.clone(),
        ignore_eos: a.ignore_eos,
    };
    let plan = RunPlan {
        arrivals,
        requests: a.num_requests,
        warmup: a.warmup,
        input: a.input_len,
        output: a.output_len,
        shared_prefix: a.shared_prefix,
        seed: a.seed,
        max_duration: a.duration.map(Duration::from_secs_f64),
    };
    let slo =
        Slo { ttft_ms: a.slo_ttft_ms, tpot_ms: a.slo_tpot_ms, e2e_ms: a.slo_e2e_ms, itl_ms: a.slo_itl_ms };
    let bar = indicatif::ProgressBar::new(plan.requests as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos}/{len} requests [{bar:30}] {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let progress = bar.clone();
    let result = runtime.block_on(run(&target, &plan, move || progress.inc(1)));
    bar.finish_and_clear();
    let config = serde_json::json!({
        "base_url": a.base_url, "model": a.model, "endpoint": a.endpoint, "arrivals": arrivals,
        "num_requests": a.num_requests, "input_len": a.input_len, "output_len": a.output_len,
        "shared_prefix": a.shared_prefix, "ignore_eos": a.ignore_eos, "seed": a.seed,
    });
    let report = pacer_bench::report::report(&result, &slo, config);
    print!("{}", pacer_bench::report::table(&report));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.requests_jsonl {
        let lines: Vec<String> =
            result.records.iter().map(|r| serde_json::to_string(r).unwrap_or_default()).collect();
        std::fs::write(path, lines.join("\n") + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report["completed"] == 0 {
        bail!(
            "no request completed; first error: {}",
            report.get("first_error").unwrap_or(&serde_json::Value::Null)
        );
    }
    Ok(())
}
