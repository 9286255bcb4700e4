//! `pacer-operator simulate` and `calibrate`: the planner and the baselines on the simulator's
//! virtual clock, and the simulator held against measured runs (the `simulate` feature; the
//! controller's image is built without it).

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Engine profile (`pacer-engine profile` JSON), once per tier; `builtin` for the built-in
    /// test profiles of q8_0 and q4_0; `builtin-vllm` for the derived vLLM-like profiles of
    /// bf16 and fp8 (and, without --spec, a vLLM service to run them).
    #[arg(long, env = "PACER_SIM_PROFILE", value_delimiter = ',', default_value = "builtin")]
    profile: Vec<String>,
    /// Trace: steady, step, ramp, diurnal, bursty, flash-crowd, llmd-bench, chat-sessions, rag-mix or
    /// replay:FILE.jsonl.
    #[arg(long, env = "PACER_SIM_TRACE", default_value = "step")]
    trace: String,
    /// Policy: pacer, pacer-online (no profile: it learns the steps from the metrics),
    /// llmd-slo, dynamo, dynamo-v1, kpa, static:N, bound, or the references
    /// hindsight and hindsight-no-lead (the per-window need, known in advance).
    #[arg(long, env = "PACER_SIM_POLICY", default_value = "pacer")]
    policy: String,
    /// InferenceService YAML whose SLA, ranges and policy to simulate [default: a built-in one].
    /// With `engine.runtime: vllm` a batch change rolls the pods.
    #[arg(long, env = "PACER_SIM_SPEC")]
    spec: Option<PathBuf>,
    /// Hours of simulated time.
    #[arg(long, env = "PACER_SIM_HOURS", default_value_t = 1.0)]
    hours: f64,
    /// Seed of the trace.
    #[arg(long, env = "PACER_SIM_SEED", default_value_t = 1)]
    seed: u64,
    /// Seconds from pod creation to the engine process starting.
    #[arg(long, env = "PACER_SIM_CONTAINER_START", default_value_t = 20.0)]
    container_start: f64,
    /// Seconds between Prometheus scrapes.
    #[arg(long, env = "PACER_SIM_SCRAPE_INTERVAL", default_value_t = 15.0)]
    scrape_interval: f64,
    /// Run every policy on every trace and write the comparison table.
    #[arg(long, env = "PACER_SIM_COMPARE")]
    compare: bool,
    /// Folder for the summary, timeline and pictures.
    #[arg(long, env = "PACER_SIM_OUT")]
    out: PathBuf,
}

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Engine profile of the tier and thread count the measured engine ran.
    #[arg(long, env = "PACER_SIM_PROFILE")]
    profile: PathBuf,
    /// The run's per-request file (`pacer-bench run --requests-jsonl`), once per run (or
    /// comma-separated).
    #[arg(long, env = "PACER_CALIBRATE_REQUESTS", value_delimiter = ',', required = true)]
    requests: Vec<PathBuf>,
    /// `--max-batch-size` the engine ran with.
    #[arg(long, env = "PACER_CALIBRATE_MAX_BATCH_SIZE", default_value_t = 16)]
    max_batch_size: u32,
    /// `--batch-wait-ms` the engine ran with.
    #[arg(long, env = "PACER_CALIBRATE_BATCH_WAIT_MS", default_value_t = 0.0)]
    batch_wait_ms: f64,
    /// `--max-step-ms` the engine ran with (the engine's default is 100; 0 = no time bound).
    #[arg(long, env = "PACER_CALIBRATE_MAX_STEP_MS", default_value_t = 100)]
    max_step_ms: u64,
    /// Write the comparisons as JSON here as well.
    #[arg(long, env = "PACER_CALIBRATE_JSON")]
    json: Option<PathBuf>,
}

/// `simulate`: one run, or every policy on every trace; prints the files written.
pub fn simulate(args: SimulateArgs) -> Result<()> {
    use pacer_simulator::{self as sim, compare};
    let SimulateArgs {
        profile,
        trace,
        policy,
        spec,
        hours,
        seed,
        container_start,
        scrape_interval,
        compare: all,
        out,
    } = args;
    let vllm = profile == ["builtin-vllm"];
    let profiles = if profile == ["builtin"] {
        vec![sim::test_profile(pacer_crds::Tier::Q8_0), sim::test_profile(pacer_crds::Tier::Q4_0)]
    } else if vllm {
        vec![sim::vllm_profile(pacer_crds::Tier::Bf16), sim::vllm_profile(pacer_crds::Tier::Fp8)]
    } else {
        profile.iter().map(|p| super::read_profile(Path::new(p))).collect::<Result<_, _>>()?
    };
    let yaml = match &spec {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None if vllm => sim::VLLM_SPEC.to_string(),
        None => sim::DEFAULT_SPEC.to_string(),
    };
    let mut config = sim::SimConfig::new(&sim::read_spec(&yaml)?, profiles)?;
    config.container_start = container_start;
    config.scrape_interval = scrape_interval;
    let options = compare::Options {
        config,
        trace: trace.parse().map_err(anyhow::Error::msg)?,
        policy: policy.parse().map_err(anyhow::Error::msg)?,
        hours,
        seed,
        out,
        compare: all,
    };
    for file in compare::run(&options)? {
        println!("{}", file.display());
    }
    Ok(())
}

/// `calibrate`: the measured runs replayed through one simulated replica, as a Markdown table.
pub fn calibrate(args: CalibrateArgs) -> Result<()> {
    use pacer_simulator::{fidelity, replica::Settings};
    let profile = super::read_profile(&args.profile)?;
    let settings = Settings {
        max_step: args.max_step_ms as f64 / 1e3,
        ..Settings::new(args.max_batch_size, args.batch_wait_ms / 1e3)
    };
    println!(
        "| run | tier | rate (req/s) | requests | latency | P50 measured | P50 simulated | error | P95 measured | P95 simulated | error |"
    );
    println!("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut all = Vec::new();
    for path in &args.requests {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let records: Vec<pacer_bench::metrics::RequestRecord> = pacer_bench::jsonl::parse(&text)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}: not a `pacer-bench run --requests-jsonl` file", path.display()))?;
        let f = fidelity::replay(profile.step, &records, settings)
            .with_context(|| format!("{}: no request succeeded", path.display()))?;
        let name = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        for row in &f.rows {
            let (e50, e95) = row.errors();
            let ms = |s: f64| format!("{:.1} ms", s * 1e3);
            println!(
                "| {name} | {} | {:.2} | {} | {} | {} | {} | {:+.0} % | {} | {} | {:+.0} % |",
                profile.tier,
                f.rate,
                f.requests,
                row.latency.to_uppercase(),
                ms(row.measured_p50),
                ms(row.simulated_p50),
                e50 * 100.0,
                ms(row.measured_p95),
                ms(row.simulated_p95),
                e95 * 100.0
            );
        }
        all.push(
            serde_json::json!({"run": name, "tier": profile.tier, "threads": profile.threads, "fidelity": f}),
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
