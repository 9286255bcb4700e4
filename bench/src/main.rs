//! `pacer-bench`: load an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E, throughput
//! and goodput against SLOs; sweep load levels; search the highest rate that holds an SLA.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::metrics::Slo;
use pacer_bench::run::{RunPlan, RunResult, run};
use pacer_bench::search::{Probe, SearchSpace, next_probe};
use pacer_runtime::{LogFormat, LogTarget};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "pacer-bench",
    version,
    about = "Client-side SLA benchmark for OpenAI-compatible LLM servers"
)]
struct Cli {
    /// Log format: human-readable text, or JSON lines for log collectors.
    #[arg(long, env = "PACER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one load level and report latency, throughput and goodput.
    Run(RunArgs),
    /// Run several load levels (concurrencies or rates) and report each.
    Sweep(SweepArgs),
    /// Find the highest request rate whose SLO attainment stays at the target.
    Search(SearchArgs),
    /// Compare two runs' per-request files (from `run --requests-jsonl`): B − A at P50 and P95
    /// of each latency, with bootstrap intervals that say which differences are significant.
    Compare(CompareArgs),
}

#[derive(Args, Debug)]
struct CompareArgs {
    /// Baseline run (JSON lines).
    a: PathBuf,
    /// Candidate run (JSON lines).
    b: PathBuf,
    /// Bootstrap resamples.
    #[arg(long, env = "PACER_BENCH_COMPARE_ITERATIONS", default_value_t = 1000)]
    iterations: usize,
    /// Write the comparison as JSON here.
    #[arg(long, env = "PACER_BENCH_COMPARE_JSON")]
    json: Option<PathBuf>,
}

/// Server, workload and SLOs: shared by every command.
#[derive(Args, Debug, Clone)]
struct Common {
    /// Server base URL.
    #[arg(long, env = "PACER_BENCH_URL", default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name to send.
    #[arg(long, env = "PACER_BENCH_MODEL")]
    model: String,
    /// Endpoint to load.
    #[arg(long, env = "PACER_BENCH_ENDPOINT", value_enum, default_value_t = Endpoint::Chat)]
    endpoint: Endpoint,
    /// Bearer token.
    #[arg(long, env = "PACER_BENCH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Measured requests per level.
    #[arg(long, env = "PACER_BENCH_NUM_REQUESTS", default_value_t = 100)]
    num_requests: usize,
    /// Stop scheduling new requests of a level after this many seconds.
    #[arg(long, env = "PACER_BENCH_DURATION")]
    duration: Option<f64>,
    /// Unmeasured requests sent first, one at a time.
    #[arg(long, env = "PACER_BENCH_WARMUP", default_value_t = 2)]
    warmup: usize,
    /// Prompt length in tokens: N, uniform:MIN:MAX or normal:MEAN:SD.
    #[arg(long, env = "PACER_BENCH_INPUT_LEN", default_value = "128")]
    input_len: Length,
    /// max_tokens per request: N, uniform:MIN:MAX or normal:MEAN:SD.
    #[arg(long, env = "PACER_BENCH_OUTPUT_LEN", default_value = "64")]
    output_len: Length,
    /// Words every prompt starts with (a shared system prompt).
    #[arg(long, env = "PACER_BENCH_SHARED_PREFIX", default_value_t = 0)]
    shared_prefix: usize,
    /// Ask the server to ignore EOS so outputs have the requested length (vLLM, Pacer).
    #[arg(long, env = "PACER_BENCH_IGNORE_EOS")]
    ignore_eos: bool,
    /// Count output tokens locally (tokenizer.json or a GGUF) when the server sends no usage.
    #[arg(long, env = "PACER_BENCH_TOKENIZER")]
    tokenizer: Option<PathBuf>,
    /// Reuse connections between requests (HTTP keep-alive). Off by default: every request
    /// opens its own connection, so a server that closes a connection right after a streamed
    /// response (llama.cpp's llama-server does) cannot fail a request it never read. A request
    /// whose connection cannot be opened is retried; any other failure counts as one.
    #[arg(long, env = "PACER_BENCH_KEEP_ALIVE")]
    keep_alive: bool,
    /// The loaded `--tokenizer` (filled in after parsing).
    #[arg(skip)]
    token_counter: Option<std::sync::Arc<pacer_bench::tokens::TokenCounter>>,
    /// Seed for prompts, lengths and arrivals.
    #[arg(long, env = "PACER_BENCH_SEED", default_value_t = 0)]
    seed: u64,
    /// Turns per conversation (chat): each request becomes a session whose follow-up user
    /// turns (with the history and the assistant's replies) go out as soon as an answer ends.
    #[arg(long, env = "PACER_BENCH_TURNS", default_value_t = 1)]
    turns: usize,
    /// Requests from a JSON-lines file (`prompt` or `messages`, optional `max_tokens`,
    /// optional `timestamp`) instead of synthetic prompts.
    #[arg(long, env = "PACER_BENCH_DATASET")]
    dataset: Option<PathBuf>,
    /// Send the dataset's requests at their `timestamp`s (open loop), this many times faster.
    #[arg(long, env = "PACER_BENCH_REPLAY_SPEEDUP")]
    replay_speedup: Option<f64>,
    /// Open loop: gamma shape of inter-arrival times (1 = Poisson, <1 burstier, inf = constant).
    #[arg(long, env = "PACER_BENCH_BURSTINESS", default_value_t = 1.0)]
    burstiness: f64,
    /// Open loop: ramp the rate linearly up (or down) to this many requests/s by the last request.
    #[arg(long, env = "PACER_BENCH_RAMP_TO")]
    ramp_to: Option<f64>,
    /// SLO on TTFT, ms.
    #[arg(long, env = "PACER_BENCH_SLO_TTFT_MS")]
    slo_ttft_ms: Option<f64>,
    /// SLO on TPOT, ms.
    #[arg(long, env = "PACER_BENCH_SLO_TPOT_MS")]
    slo_tpot_ms: Option<f64>,
    /// SLO on E2E latency, ms.
    #[arg(long, env = "PACER_BENCH_SLO_E2E_MS")]
    slo_e2e_ms: Option<f64>,
    /// SLO on every inter-token gap of a request, ms.
    #[arg(long, env = "PACER_BENCH_SLO_ITL_MS")]
    slo_itl_ms: Option<f64>,
    /// Write the JSON report here.
    #[arg(long, env = "PACER_BENCH_JSON")]
    json: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long, env = "PACER_BENCH_PLOTS")]
    plots: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Closed loop: requests in flight (excludes --request-rate).
    #[arg(long, env = "PACER_BENCH_CONCURRENCY", conflicts_with = "request_rate")]
    concurrency: Option<usize>,
    /// Open loop: mean requests per second.
    #[arg(long, env = "PACER_BENCH_REQUEST_RATE")]
    request_rate: Option<f64>,
    /// Write one JSON line per request here (the input of `compare`).
    #[arg(long, env = "PACER_BENCH_REQUESTS_JSONL")]
    requests_jsonl: Option<PathBuf>,
    /// Write one CSV row per request here.
    #[arg(long, env = "PACER_BENCH_REQUESTS_CSV")]
    requests_csv: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SweepArgs {
    #[command(flatten)]
    common: Common,
    /// Closed-loop levels, e.g. 1,2,4,8 (excludes --request-rates).
    #[arg(long, env = "PACER_BENCH_CONCURRENCIES", value_delimiter = ',', conflicts_with = "request_rates")]
    concurrencies: Vec<usize>,
    /// Open-loop levels in requests per second, e.g. 0.5,1,2,4.
    #[arg(long, env = "PACER_BENCH_REQUEST_RATES", value_delimiter = ',')]
    request_rates: Vec<f64>,
}

#[derive(Args, Debug)]
struct SearchArgs {
    #[command(flatten)]
    common: Common,
    /// SLO attainment a rate must reach to pass.
    #[arg(long, env = "PACER_BENCH_TARGET_ATTAINMENT", default_value_t = 0.95)]
    target_attainment: f64,
    /// Lowest rate tried, requests per second.
    #[arg(long, env = "PACER_BENCH_MIN_RATE", default_value_t = 0.25)]
    min_rate: f64,
    /// Highest rate tried, requests per second.
    #[arg(long, env = "PACER_BENCH_MAX_RATE", default_value_t = 64.0)]
    max_rate: f64,
    /// Stop when the passing and failing rates are within this ratio.
    #[arg(long, env = "PACER_BENCH_PRECISION", default_value_t = 1.1)]
    precision: f64,
    /// Most probes.
    #[arg(long, env = "PACER_BENCH_MAX_PROBES", default_value_t = 10)]
    max_probes: usize,
}

fn main() -> Result<()> {
    let Cli { log_format, command } = Cli::parse();
    // The SVG rasterizer logs every cosmetic oddity at warn; keep its errors only.
    pacer_runtime::init_logging(log_format, "info,usvg=error,resvg=error", LogTarget::Stderr);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match command {
        Command::Run(mut a) => {
            a.common.load_tokenizer()?;
            run_cmd(&runtime, a)
        }
        Command::Sweep(mut a) => {
            a.common.load_tokenizer()?;
            sweep_cmd(&runtime, a)
        }
        Command::Search(mut a) => {
            a.common.load_tokenizer()?;
            search_cmd(&runtime, a)
        }
        Command::Compare(a) => compare_cmd(a),
    }
}

impl Common {
    fn load_tokenizer(&mut self) -> Result<()> {
        if let Some(path) = &self.tokenizer {
            let counter = pacer_bench::tokens::TokenCounter::open(path).map_err(anyhow::Error::msg)?;
            self.token_counter = Some(std::sync::Arc::new(counter));
        }
        Ok(())
    }

    fn target(&self) -> Target {
        Target {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            endpoint: self.endpoint,
            api_key: self.api_key.clone(),
            ignore_eos: self.ignore_eos,
            tokenizer: self.token_counter.clone(),
            keep_alive: self.keep_alive,
        }
    }

    fn slo(&self) -> Slo {
        Slo {
            ttft_ms: self.slo_ttft_ms,
            tpot_ms: self.slo_tpot_ms,
            e2e_ms: self.slo_e2e_ms,
            itl_ms: self.slo_itl_ms,
        }
    }

    fn plan(&self, arrivals: Arrivals) -> Result<RunPlan> {
        let dataset = match &self.dataset {
            None => None,
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                let items = pacer_bench::dataset::parse(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                let target = self.target();
                for (i, item) in items.iter().enumerate() {
                    pacer_bench::client::body_for_item(&target, item, 1)
                        .map_err(|e| anyhow::anyhow!("{} request {}: {e}", path.display(), i + 1))?;
                }
                Some(items)
            }
        };
        let replay = match (self.replay_speedup, &dataset) {
            (None, _) => None,
            (Some(s), Some(items)) if s > 0.0 => {
                Some(pacer_bench::dataset::replay_schedule(items, s).map_err(anyhow::Error::msg)?)
            }
            (Some(_), Some(_)) => bail!("--replay-speedup must be positive"),
            (Some(_), None) => bail!("--replay-speedup needs --dataset with timestamps"),
        };
        if self.turns == 0 || (self.turns > 1 && self.endpoint != Endpoint::Chat) {
            bail!("--turns must be at least 1, and more than 1 needs --endpoint chat");
        }
        Ok(RunPlan {
            turns: self.turns,
            dataset,
            replay,
            arrivals,
            requests: self.num_requests,
            warmup: self.warmup,
            input: self.input_len,
            output: self.output_len,
            shared_prefix: self.shared_prefix,
            seed: self.seed,
            max_duration: self.duration.map(Duration::from_secs_f64),
        })
    }

    fn open(&self, rate: f64) -> Result<Arrivals> {
        if rate <= 0.0 || self.burstiness <= 0.0 || self.ramp_to.is_some_and(|r| r <= 0.0) {
            bail!("request rates, --ramp-to and --burstiness must be positive");
        }
        Ok(Arrivals::Open { rate, burstiness: self.burstiness, ramp_to: self.ramp_to })
    }

    fn config(&self, arrivals: Arrivals) -> Value {
        json!({
            "base_url": self.base_url, "model": self.model, "endpoint": self.endpoint, "arrivals": arrivals,
            "num_requests": self.num_requests, "input_len": self.input_len, "output_len": self.output_len,
            "shared_prefix": self.shared_prefix, "ignore_eos": self.ignore_eos, "seed": self.seed,
        })
    }

    /// Runs one level with a progress bar and returns (report, raw result).
    fn level(
        &self,
        rt: &tokio::runtime::Runtime,
        arrivals: Arrivals,
        label: &str,
    ) -> Result<(Value, RunResult)> {
        let plan = self.plan(arrivals)?;
        let bar = indicatif::ProgressBar::new(self.num_requests as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {msg} {pos}/{len} requests [{bar:30}] {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(label.to_string());
        let progress = bar.clone();
        let result = rt.block_on(run(&self.target(), &plan, move || progress.inc(1)));
        bar.finish_and_clear();
        Ok((pacer_bench::report::report(&result, &self.slo(), self.config(arrivals)), result))
    }

    fn write_json(&self, v: &Value) -> Result<()> {
        if let Some(path) = &self.json {
            std::fs::write(path, serde_json::to_string_pretty(v)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

fn run_cmd(rt: &tokio::runtime::Runtime, a: RunArgs) -> Result<()> {
    let arrivals = match (a.concurrency, a.request_rate) {
        (Some(c), None) if c > 0 => Arrivals::Closed { concurrency: c },
        (None, Some(r)) => a.common.open(r)?,
        (None, None) => Arrivals::Closed { concurrency: 1 },
        _ => bail!("--concurrency must be positive"),
    };
    let (report, result) = a.common.level(rt, arrivals, "run")?;
    print!("{}", pacer_bench::report::table(&report));
    a.common.write_json(&report)?;
    if let Some(dir) = &a.common.plots {
        let files = pacer_bench::plots::run_plots(dir, &result.records).map_err(anyhow::Error::msg)?;
        eprintln!("plots: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    if let Some(path) = &a.requests_jsonl {
        let lines: Vec<String> =
            result.records.iter().map(|r| serde_json::to_string(r).unwrap_or_default()).collect();
        std::fs::write(path, lines.join("\n") + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.requests_csv {
        std::fs::write(path, pacer_bench::report::requests_csv(&result.records))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report["completed"] == 0 {
        bail!("no request completed; first error: {}", report.get("first_error").unwrap_or(&Value::Null));
    }
    Ok(())
}

fn sweep_cmd(rt: &tokio::runtime::Runtime, a: SweepArgs) -> Result<()> {
    let levels: Vec<Arrivals> = if !a.concurrencies.is_empty() {
        a.concurrencies.iter().map(|&c| Arrivals::Closed { concurrency: c.max(1) }).collect()
    } else if !a.request_rates.is_empty() {
        a.request_rates.iter().map(|&r| a.common.open(r)).collect::<Result<_>>()?
    } else {
        bail!("give --concurrencies or --request-rates");
    };
    let mut reports = Vec::new();
    for (i, arrivals) in levels.iter().enumerate() {
        let (report, _) = a.common.level(rt, *arrivals, &format!("level {}/{}", i + 1, levels.len()))?;
        reports.push(report);
    }
    print!("{}", pacer_bench::report::sweep_table(&reports));
    if let Some(dir) = &a.common.plots {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("latency_vs_throughput.svg");
        pacer_bench::plots::sweep_plot(&path, &reports).map_err(anyhow::Error::msg)?;
        let png = pacer_bench::plots::png_from_svg(&path).map_err(anyhow::Error::msg)?;
        eprintln!("plot: {} and {}", path.display(), png.display());
    }
    a.common.write_json(&json!({"levels": reports}))
}

fn search_cmd(rt: &tokio::runtime::Runtime, a: SearchArgs) -> Result<()> {
    if !a.common.slo().any() {
        bail!("search needs at least one SLO (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms, --slo-itl-ms)");
    }
    let space = SearchSpace {
        min_rate: a.min_rate,
        max_rate: a.max_rate,
        target_attainment: a.target_attainment,
        precision: a.precision,
        max_probes: a.max_probes,
    };
    let mut probes: Vec<Probe> = Vec::new();
    let mut reports = Vec::new();
    while let Some(rate) = next_probe(&space, &probes) {
        let (report, _) = a.common.level(rt, a.common.open(rate)?, &format!("probe {:.3} req/s", rate))?;
        let attainment = report["slo_attainment"].as_f64().unwrap_or(0.0);
        eprintln!("rate {rate:.3} req/s: attainment {:.1}%", attainment * 100.0);
        probes.push(Probe { rate, attainment });
        reports.push(report);
    }
    let best = probes
        .iter()
        .filter(|p| p.attainment >= space.target_attainment)
        .map(|p| p.rate)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    match best {
        Some(r) => println!(
            "highest rate meeting the SLO at {:.0}% attainment: {r:.3} req/s",
            space.target_attainment * 100.0
        ),
        None => println!(
            "no rate down to {:.3} req/s met the SLO at {:.0}% attainment",
            space.min_rate,
            space.target_attainment * 100.0
        ),
    }
    print!("{}", pacer_bench::report::sweep_table(&reports));
    a.common.write_json(
        &json!({"best_rate": best, "target_attainment": space.target_attainment, "probes": reports}),
    )
}

fn read_records(path: &std::path::Path) -> Result<Vec<pacer_bench::metrics::RequestRecord>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    pacer_bench::jsonl::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn compare_cmd(a: CompareArgs) -> Result<()> {
    let (ra, rb) = (read_records(&a.a)?, read_records(&a.b)?);
    let diffs = pacer_bench::stats::compare(&ra, &rb, a.iterations, 0);
    println!(
        "{:<6} {:>5} {:>10} {:>10} {:>10} {:>22}",
        "metric", "pct", "A ms", "B ms", "B-A ms", "95% CI of B-A"
    );
    for d in &diffs {
        println!(
            "{:<6} {:>5} {:>10.2} {:>10.2} {:>+10.2} {:>22}  {}",
            d.metric,
            format!("p{}", d.percentile),
            d.a,
            d.b,
            d.b - d.a,
            format!("[{:+.2}, {:+.2}]", d.ci.0, d.ci.1),
            if d.significant { "significant" } else { "within noise" }
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&diffs)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
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
