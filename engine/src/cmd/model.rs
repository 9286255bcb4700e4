//! The model flags every subcommand shares (file, tier, threads, device), and loading the model
//! they name.

use anyhow::{Context, Result, bail};
use clap::Args;
use pacer_engine::{ComputeDevice, LoadedModel, Tier, threads};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ModelArgs {
    /// GGUF model file [default: the model `scripts/fetch-model.sh` caches].
    #[arg(long, env = "PACER_MODEL")]
    pub model: Option<PathBuf>,
    /// Quantization tier of the weights: f32, q8_0, q4_0, or native (as stored in the file).
    #[arg(long, env = "PACER_TIER", default_value = "native", value_parser = Tier::parse_pacer)]
    pub tier: Tier,
    /// Compute threads [default: the CPUs this process may use, after cgroup quota].
    #[arg(long, env = "PACER_THREADS")]
    pub threads: Option<usize>,
    /// Where the forward step runs: `cpu` (Pacer's CPU kernels), `cuda` / `cuda:N` (the candle
    /// backend on GPU N; needs a build with the `cuda` feature), `candle-cpu` (the candle
    /// backend on the CPU, the GPU code path without a GPU), or `auto`: `cuda:0` when this
    /// build has the `cuda` feature and a GPU answers, else `cpu`.
    #[arg(long, env = "PACER_DEVICE", default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
}

/// `--device`: a device, or `auto`.
#[derive(Debug, Clone, Copy)]
pub enum DeviceChoice {
    Auto,
    Exactly(ComputeDevice),
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    if s == "auto" { Ok(DeviceChoice::Auto) } else { s.parse().map(DeviceChoice::Exactly) }
}

impl ModelArgs {
    pub fn model_path(&self) -> Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        match pacer_engine::default_model_path() {
            Some(p) if p.exists() => Ok(p),
            _ => bail!(
                "no model given: pass --model PATH or set PACER_MODEL (scripts/fetch-model.sh fetches the default)"
            ),
        }
    }

    pub fn device(&self) -> ComputeDevice {
        match self.device {
            DeviceChoice::Auto => ComputeDevice::auto(),
            DeviceChoice::Exactly(d) => d,
        }
    }

    pub fn init_threads(&self) -> usize {
        let n = threads::compute_threads(self.threads);
        threads::init_pool(n);
        n
    }
}

pub fn load(args: &ModelArgs) -> Result<LoadedModel> {
    let path = args.model_path()?;
    let threads = args.init_threads();
    let device = args.device();
    let loaded = LoadedModel::open_on(&path, args.tier, device)
        .with_context(|| format!("loading {} for --device {device}", path.display()))?;
    tracing::info!(
        model = %path.display(),
        tier = %args.tier,
        %device,
        threads,
        weight_mib = loaded.model.weight_bytes() as f64 / (1 << 20) as f64,
        load_ms = loaded.model.load_time.as_millis() as u64,
        kernels = ?pacer_engine::kernels::isa(),
        amx_tiles = pacer_engine::kernels::amx_tiles(),
        "model loaded"
    );
    Ok(loaded)
}
