//! Pacer's LLM engine: llama-family GGUF models on candle with batched CPU kernels.
//!
//! - [`model`]: GGUF loading at a quantization [`Tier`], the batched forward over sequences at
//!   different positions, and the paged KV cache.
//! - [`kernels`]: the quantized and f32 compute kernels the forward runs on.
//! - [`tokenizer`], [`chat`], [`sampling`], [`stop`]: text in and out.
//! - [`generate`]: the per-sequence generation state machine and a simple batch driver.
//! - [`scheduler`]: continuous batching, an actor that owns the model and the KV cache.
//! - [`server`]: the OpenAI-compatible HTTP API, metrics ([`metrics`]), health and drain.
//! - [`bench`], [`profile`]: throughput figures, and the step-time and quality profile the
//!   operator's planner reads.
#![deny(unsafe_code)]
// Output goes through `tracing` or a returned value; a print in a library is a leftover.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod bench;
pub mod chat;
pub mod error;
pub mod generate;
pub mod kernels;
pub mod metrics;
pub mod model;
pub mod profile;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod stop;
pub mod threads;
pub mod tokenizer;

pub use error::EngineError;
pub use model::{ComputeDevice, Model, Tier};
pub use tokenizer::Tokenizer;

use std::path::Path;

/// The default model's file name and where `scripts/fetch-model.sh` caches it
/// (`$PACER_CACHE/models/…`, else `$XDG_CACHE_HOME/pacer/models/…`, else `~/.cache/pacer/models/…`).
pub use pacer_runtime::{DEFAULT_MODEL_FILE, default_model_path};

/// A model with its tokenizer and chat template, read from one GGUF file.
#[derive(Debug)]
pub struct LoadedModel {
    /// Weights and forward.
    pub model: Model,
    /// Tokenizer from the same file.
    pub tokenizer: Tokenizer,
    /// Chat template, when the file has one.
    pub chat_template: Option<chat::ChatTemplate>,
}

impl LoadedModel {
    /// Reads `path` once and builds model (for the CPU kernels), tokenizer and chat template.
    pub fn open(path: &Path, tier: Tier) -> Result<Self, EngineError> {
        Self::open_on(path, tier, ComputeDevice::Cpu)
    }

    /// As [`LoadedModel::open`], with the forward step on `device`.
    pub fn open_on(path: &Path, tier: Tier, device: ComputeDevice) -> Result<Self, EngineError> {
        let (content, mut reader) = model::read_content(path)?;
        let tokenizer = Tokenizer::from_gguf(&content)?;
        let model = Model::from_gguf(path, &content, &mut reader, tier, device)?;
        if tokenizer.vocab_size() != model.config.vocab_size {
            return Err(EngineError::Model(format!(
                "tokenizer has {} tokens but the embedding has {} rows",
                tokenizer.vocab_size(),
                model.config.vocab_size
            )));
        }
        let name = |id: Option<u32>| id.and_then(|i| tokenizer.token(i)).unwrap_or_default().to_string();
        let chat_template = tokenizer
            .chat_template()
            .map(|src| chat::ChatTemplate::new(src, &name(tokenizer.bos()), &name(tokenizer.eos())))
            .transpose()?;
        Ok(LoadedModel { model, tokenizer, chat_template })
    }
}
