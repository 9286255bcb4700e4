//! The engine's error type. Every failure a caller can act on has its own variant, so the HTTP
//! layer maps them to status codes in one place.

use thiserror::Error;

/// Errors from loading a model, tokenizing, templating, scheduling or running a step.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The model file is missing, unreadable, or not a model this engine runs.
    #[error("model: {0}")]
    Model(String),
    /// Reading the model file failed.
    #[error("reading the model file: {0}")]
    Io(#[from] std::io::Error),
    /// candle could not parse or convert a tensor.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// The request does not fit the model's context window.
    #[error(
        "the prompt ({prompt} tokens) plus at least one generated token exceeds the context length {context}"
    )]
    ContextOverflow {
        /// Prompt tokens.
        prompt: usize,
        /// Context length of the model.
        context: usize,
    },
    /// No free KV-cache blocks for a step; the caller waits or preempts.
    #[error("KV cache full: {needed} more tokens needed, {free} free")]
    KvCacheFull {
        /// Tokens that had to be reserved.
        needed: usize,
        /// Tokens still free.
        free: usize,
    },
    /// A request parameter is out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl EngineError {
    pub(crate) fn model(msg: impl Into<String>) -> Self {
        EngineError::Model(msg.into())
    }

    /// A short, stable label for metrics (`reason` / `kind` label values).
    pub fn metric_label(&self) -> &'static str {
        match self {
            EngineError::Model(_) | EngineError::Io(_) | EngineError::Tensor(_) => "model",
            EngineError::Tokenizer(_) => "tokenizer",
            EngineError::Template(_) => "template",
            EngineError::ContextOverflow { .. } => "context_overflow",
            EngineError::KvCacheFull { .. } => "kv_cache_full",
            EngineError::InvalidRequest(_) => "invalid",
        }
    }
}
