//! The model core: a llama-family transformer loaded from GGUF at a chosen quantization tier,
//! with a batched forward over sequences at different positions and a paged KV cache.

mod config;
mod forward;
mod kv;
mod load;

pub use config::{LLAMA_FAMILY, LlamaConfig, Tier};
pub use forward::SeqStep;
pub use kv::{BLOCK_TOKENS, KvCache, SeqCache};
pub use load::{Weights, read_content};

use crate::error::EngineError;
use candle_core::quantized::gguf_file;
use std::path::Path;
use std::time::{Duration, Instant};

/// A loaded model: configuration, weights at one tier, and precomputed RoPE tables.
#[derive(Debug)]
pub struct Model {
    /// Shape and numerics.
    pub config: LlamaConfig,
    /// Tier the weights were loaded at.
    pub tier: Tier,
    /// How long reading and converting the weights took.
    pub load_time: Duration,
    weights: Weights,
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

    /// Loads the weights of an already-parsed GGUF (see [`read_content`]) at `tier`.
    pub fn from_gguf(
        path: &Path,
        content: &gguf_file::Content,
        reader: &mut std::io::BufReader<std::fs::File>,
        tier: Tier,
    ) -> Result<Self, EngineError> {
        let started = Instant::now();
        let config = LlamaConfig::from_gguf(content)?;
        let weights = load::load_weights(path, content, reader, &config, tier)?;
        let (rope_cos, rope_sin) = rope_tables(&config);
        Ok(Model { config, tier, load_time: started.elapsed(), weights, rope_cos, rope_sin })
    }

    /// Opens `path` and loads it at `tier`.
    pub fn load(path: &Path, tier: Tier) -> Result<Self, EngineError> {
        let (content, mut reader) = read_content(path)?;
        Self::from_gguf(path, &content, &mut reader, tier)
    }

    /// Bytes held by the weights at this tier.
    pub fn weight_bytes(&self) -> usize {
        self.weights.size_bytes()
    }

    /// A KV cache sized for `tokens` tokens of this model.
    pub fn new_kv_cache(&self, tokens: usize) -> KvCache {
        KvCache::new(&self.config, tokens)
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
