//! `pacer-engine profile`: step times and quality at one tier, as the engine profile the
//! planner reads.

use super::model::DeviceChoice;
use super::model::ModelArgs;
use anyhow::{Context, Result, bail};
use clap::Args;
use pacer_engine::ComputeDevice;
use pacer_engine::profile::{self, ProfilePlan, Progress};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// File to write the profile to (JSON, schema 1).
    #[arg(long, env = "PACER_PROFILE_OUT")]
    out: PathBuf,
    /// A small grid and a short quality text, for tests; too coarse to plan with.
    #[arg(long, env = "PACER_PROFILE_QUICK")]
    quick: bool,
}

pub fn run(args: ProfileArgs) -> Result<()> {
    let ProfileArgs { model: margs, out, quick } = args;
    let path = margs.model_path()?;
    if !path.is_file() {
        bail!("model file {} does not exist", path.display());
    }
    // Fail on an unwritable destination now, not after minutes of measuring.
    let file = std::fs::File::create(&out)
        .with_context(|| format!("cannot write the profile to {}", out.display()))?;
    // The profile's step-time model (and its KV copying) is the CPU kernels'; the candle
    // backend has no profile yet, so a GPU pod's planner works from observed metrics alone.
    if let DeviceChoice::Exactly(d @ (ComputeDevice::CandleCpu | ComputeDevice::Cuda(_))) = margs.device {
        bail!("profile measures the CPU kernels only; --device {d} is not supported by profile");
    }
    let threads = margs.init_threads();
    let plan = if quick { ProfilePlan::quick() } else { ProfilePlan::full() };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("loading {} at {}", path.display(), margs.tier));
    let result = profile::profile(&path, margs.tier, threads, &plan, |p| match p {
        Progress::Loaded { steps, positions } => {
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} profile {msg} [{bar:30}] {pos}/{len} {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_length((steps + positions) as u64);
            bar.set_message("steps");
        }
        Progress::Step(s) => {
            bar.set_message(format!("rows {} prefill {}", s.decode_rows, s.prefill_tokens));
            bar.inc(1);
        }
        Progress::LoadingReference => bar.set_message(format!("loading {}", profile::REFERENCE_TIER)),
        Progress::Position => {
            bar.set_message(format!("quality vs {}", profile::REFERENCE_TIER));
            bar.inc(1);
        }
    });
    bar.finish_and_clear();
    let (profile, fit) = match result {
        Ok(r) => r,
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(&out);
            return Err(e.into());
        }
    };
    let mut writer = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut writer, &profile)?;
    writeln!(writer)?;
    writer.flush().with_context(|| format!("writing {}", out.display()))?;

    let ms = |s: f64| s * 1e3;
    let m = &profile.step;
    println!(
        "{} at {} on {} thread(s), {} | load {:.0} ms, warm-up {:.0} ms",
        profile.model,
        profile.tier,
        profile.threads,
        profile.device,
        ms(profile.load_seconds),
        ms(profile.warmup_seconds)
    );
    println!(
        "step = {:.3} ms + {:.4} ms/decode row + {:.4} ms/prefill token + {:.6} ms/context token",
        ms(m.base_s),
        ms(m.per_decode_row_s),
        ms(m.per_prefill_token_s),
        ms(m.per_context_token_s)
    );
    println!(
        "fit over {} steps: mean relative error {:.1} %, max {:.1} %",
        profile.samples.len(),
        fit.mean_relative_error * 100.0,
        fit.max_relative_error * 100.0
    );
    println!("{:>5} {:>8} {:>8} {:>10} {:>10}", "rows", "prefill", "context", "measured", "fitted");
    for s in &profile.samples {
        println!(
            "{:>5} {:>8} {:>8} {:>7.2} ms {:>7.2} ms",
            s.decode_rows,
            s.prefill_tokens,
            s.context_tokens,
            ms(s.seconds),
            ms(m.predict(s))
        );
    }
    if let Some(q) = &profile.quality {
        println!(
            "quality vs {} over {} positions: top-1 agreement {:.1} %, mean KL {:.4} nats",
            q.reference_tier,
            q.tokens,
            q.top1_agreement * 100.0,
            q.mean_kl
        );
    }
    eprintln!("wrote {}", out.display());
    Ok(())
}
