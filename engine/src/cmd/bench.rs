//! `pacer-engine bench`: prefill and batched decode throughput at one tier.

use anyhow::Result;
use clap::Args;
use pacer_engine::bench::{self, BenchPlan};
use pacer_engine::model::Model;

use super::model::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths for prefill.
    #[arg(long, env = "PACER_ENGINE_BENCH_PREFILL", value_delimiter = ',', default_value = "128,512")]
    prefill: Vec<usize>,
    /// Batch sizes for decode.
    #[arg(long, env = "PACER_ENGINE_BENCH_BATCH", value_delimiter = ',', default_value = "1,4,8,16")]
    batch: Vec<usize>,
    /// Prompt tokens each decoding sequence holds before the timed steps (the context its
    /// attention reads).
    #[arg(long, env = "PACER_ENGINE_BENCH_DECODE_CONTEXT", default_value_t = 32)]
    decode_context: usize,
    /// Decode steps timed per batch size.
    #[arg(long, env = "PACER_ENGINE_BENCH_DECODE_STEPS", default_value_t = 32)]
    decode_steps: usize,
    /// Repetitions (median reported).
    #[arg(long, env = "PACER_ENGINE_BENCH_REPEATS", default_value_t = 3)]
    repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "PACER_ENGINE_BENCH_JSON")]
    json: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let BenchArgs { model: margs, prefill, batch, decode_context, decode_steps, repeats, json } = args;
    let path = margs.model_path()?;
    let threads = margs.init_threads();
    let model = Model::load_on(&path, margs.tier, margs.device())?;
    let plan =
        BenchPlan { prefill_lengths: prefill, batch_sizes: batch, decode_context, decode_steps, repeats };
    let bar = indicatif::ProgressBar::new((plan.prefill_lengths.len() + plan.batch_sizes.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} bench {msg} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let figures = bench::run(&model, &plan, |what| {
        bar.set_message(what.to_string());
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    if json {
        let out = serde_json::json!({
            "engine": "pacer",
            "tier": margs.tier,
            "device": model.device.to_string(),
            "threads": threads,
            "weight_bytes": model.weight_bytes(),
            "load_seconds": model.load_time.as_secs_f64(),
            "figures": figures,
        });
        println!("{out}");
    } else {
        println!(
            "tier {} | device {} | threads {threads} | weights {:.1} MiB | load {:.0} ms",
            margs.tier,
            model.device,
            model.weight_bytes() as f64 / (1 << 20) as f64,
            model.load_time.as_secs_f64() * 1e3
        );
        for f in figures {
            println!("{:<8} {:>5}  {:>9.1} tok/s", f.phase, f.size, f.tokens_per_second);
        }
    }
    Ok(())
}
