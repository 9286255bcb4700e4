//! The model core: a llama-family transformer loaded from GGUF at a chosen quantization tier,
//! with a batched forward over sequences at different positions and a paged KV cache.
//!
//! The forward step has two backends behind one [`Model::forward`]: Pacer's own CPU kernels
//! (`--device cpu`, [`forward`]) and candle tensors on a candle device (`--device cuda[:N]`
//! with the `cuda` feature, or `--device candle-cpu`; [`candle_backend`]). Everything above
//! the step — scheduling, KV block accounting and prefix cache, sampling — is shared.

mod candle_backend;
mod candle_ops;
mod config;
mod forward;
mod kv;
mod load;

pub use config::{LLAMA_FAMILY, LlamaConfig, Tier};
pub use forward::SeqStep;
pub use kv::{BLOCK_TOKENS, KvCache, SeqCache};
pub use load::{Weights, read_content};

use crate::error::EngineError;
use candle_backend::CandleWeights;
use candle_core::quantized::gguf_file;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Where the forward step runs (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDevice {
    /// Pacer's CPU kernels: the fastest on a CPU, and the default without a GPU.
    #[default]
    Cpu,
    /// The candle backend on candle's CPU device: the GPU code path, testable without a GPU.
    CandleCpu,
    /// The candle backend on CUDA GPU `N` (a build with the `cuda` feature).
    Cuda(usize),
}

impl ComputeDevice {
    /// What `--device auto` means here: `cuda:0` when this build has the `cuda` feature and a
    /// GPU answers, else `cpu`.
    pub fn auto() -> Self {
        if cfg!(feature = "cuda") && candle_core::Device::new_cuda(0).is_ok() {
            ComputeDevice::Cuda(0)
        } else {
            ComputeDevice::Cpu
        }
    }

    /// Whether the step runs on the candle backend.
    pub fn is_candle(self) -> bool {
        !matches!(self, ComputeDevice::Cpu)
    }
}

impl fmt::Display for ComputeDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComputeDevice::Cpu => f.write_str("cpu"),
            ComputeDevice::CandleCpu => f.write_str("candle-cpu"),
            ComputeDevice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for ComputeDevice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(ComputeDevice::Cpu),
            "candle-cpu" => Ok(ComputeDevice::CandleCpu),
            "cuda" => Ok(ComputeDevice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(ComputeDevice::Cuda)
                .ok_or_else(|| format!("unknown device `{s}`: expected cpu, candle-cpu, cuda or cuda:N")),
        }
    }
}

/// The weights in the form the chosen backend computes with.
#[derive(Debug)]
enum Backend {
    Kernels(Weights),
    Candle(Box<CandleWeights>),
}

/// A loaded model: configuration, weights at one tier, and precomputed RoPE tables.
#[derive(Debug)]
pub struct Model {
    /// Shape and numerics.
    pub config: LlamaConfig,
    /// Tier the weights were loaded at.
    pub tier: Tier,
    /// How long reading and converting the weights took.
    pub load_time: Duration,
    /// Where the step runs.
    pub device: ComputeDevice,
    backend: Backend,
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
}

impl Model {
    /// Serves at most `limit` tokens of context (prompt + output), below the trained context:
    /// a smaller context bounds each request's KV reservation.
    pub fn limit_context(&mut self, limit: usize) -> Result<(), EngineError> {
        let trained = self.config.context_length;
        if limit == 0 || limit > trained {
            return Err(EngineError::Model(format!(
                "--context-length {limit} must be between 1 and the model's trained context of {trained} tokens"
            )));
        }
        self.config.context_length = limit;
        Ok(())
    }

    /// Loads the weights of an already-parsed GGUF (see [`read_content`]) at `tier`, for the
    /// backend of `device`.
    pub fn from_gguf(
        path: &Path,
        content: &gguf_file::Content,
        reader: &mut std::io::BufReader<std::fs::File>,
        tier: Tier,
        device: ComputeDevice,
    ) -> Result<Self, EngineError> {
        let started = Instant::now();
        if !tier.is_pacer() {
            return Err(EngineError::model(format!(
                "tier {tier} is a vLLM precision class; pacer-engine loads f32, q8_0, native and q4_0"
            )));
        }
        let config = LlamaConfig::from_gguf(content)?;
        let backend = if device.is_candle() {
            let dev = candle_backend::candle_device(device)?;
            Backend::Candle(Box::new(CandleWeights::load(path, content, reader, &config, tier, &dev)?))
        } else {
            Backend::Kernels(load::load_weights(path, content, reader, &config, tier)?)
        };
        let (rope_cos, rope_sin) = rope_tables(&config);
        Ok(Model { config, tier, load_time: started.elapsed(), device, backend, rope_cos, rope_sin })
    }

    /// Opens `path` and loads it at `tier` for the CPU kernels.
    pub fn load(path: &Path, tier: Tier) -> Result<Self, EngineError> {
        Self::load_on(path, tier, ComputeDevice::Cpu)
    }

    /// Opens `path` and loads it at `tier` for the backend of `device`.
    pub fn load_on(path: &Path, tier: Tier, device: ComputeDevice) -> Result<Self, EngineError> {
        let (content, mut reader) = read_content(path)?;
        Self::from_gguf(path, &content, &mut reader, tier, device)
    }

    /// Bytes held by the weights at this tier (on the device, for the candle backend).
    pub fn weight_bytes(&self) -> usize {
        match &self.backend {
            Backend::Kernels(w) => w.size_bytes(),
            Backend::Candle(c) => c.size_bytes(),
        }
    }

    /// A KV cache sized for `tokens` tokens of this model, its storage where the step runs.
    pub fn new_kv_cache(&self, tokens: usize) -> Result<KvCache, EngineError> {
        match &self.backend {
            Backend::Kernels(_) => Ok(KvCache::new(&self.config, tokens)),
            Backend::Candle(c) => KvCache::on_device(&self.config, tokens, c.device()),
        }
    }
}

/// cos/sin of `pos · base^(-2i/head_dim)` for every position of the context, computed in f64
/// so large positions keep full f32 accuracy.
fn rope_tables(cfg: &LlamaConfig) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim / 2;
    let inv: Vec<f64> =
        (0..half).map(|i| f64::from(cfg.rope_base).powf(-2.0 * i as f64 / cfg.head_dim as f64)).collect();
    let mut cos = Vec::with_capacity(cfg.context_length * half);
    let mut sin = Vec::with_capacity(cfg.context_length * half);
    for p in 0..cfg.context_length {
        for f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}
