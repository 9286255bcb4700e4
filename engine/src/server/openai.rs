//! OpenAI request bodies and their validation into a [`GenerateRequest`]. Fields the engine
//! does not implement are ignored, as OpenAI-compatible servers do; fields it implements are
//! checked, and each error names the field.

use super::error::ApiError;
use crate::LoadedModel;
use crate::chat::ChatMessage;
use crate::generate::GenerateRequest;
use crate::sampling::SamplingParams;
use serde::Deserialize;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

/// `prompt`: text, a one-element list of text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// A list of texts (only one is accepted: `n` and batch prompts are not supported).
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send one usage chunk (with empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and length fields shared by both endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Model name; must be the served one.
    pub model: String,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// Softmax temperature (0–2; default 1).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass (default 1).
    pub top_p: Option<f32>,
    /// Top-k (vLLM extension; 0 or −1 = off).
    pub top_k: Option<i64>,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Stream with server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt; only 1.
    pub n: Option<u32>,
    /// Keep generating past end-of-sequence (vLLM extension, for fixed-length benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// Message content: text, or a list of parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One incoming chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageIn {
    /// Role.
    pub role: String,
    /// Content (null is allowed for assistant turns).
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<MessageIn>,
    /// OpenAI's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// What a validated request becomes.
#[derive(Debug)]
pub struct Prepared {
    /// The generation to run.
    pub request: GenerateRequest,
    /// Stream the answer.
    pub stream: bool,
    /// Send a usage chunk when streaming.
    pub include_usage: bool,
}

const MAX_STOPS: usize = 4;

impl Common {
    fn sampling(&self) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("top_k must be -1, 0 or positive, got {k}"),
                    Some("top_k"),
                ));
            }
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            seed: self.seed,
        };
        p.validate().map_err(|m| {
            let param = if m.starts_with("temperature") { "temperature" } else { "top_p" };
            ApiError::invalid(m, Some(param))
        })?;
        Ok(p)
    }

    fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                format!("at most {MAX_STOPS} stop sequences are allowed"),
                Some("stop"),
            ));
        }
        Ok(stops)
    }

    /// Checks the fields every endpoint shares and builds the request around `prompt`.
    fn prepare(
        &self,
        model: &LoadedModel,
        served: &str,
        prompt: Vec<u32>,
        max_tokens: Option<usize>,
        default_max: usize,
    ) -> Result<Prepared, ApiError> {
        if self.model != served {
            return Err(ApiError::model_not_found(&self.model, served));
        }
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(format!("only n = 1 is supported, got {n}"), Some("n")));
        }
        let context = model.model.config.context_length;
        if prompt.is_empty() {
            return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
        }
        if prompt.len() >= context {
            return Err(ApiError::invalid(
                format!(
                    "This model's maximum context length is {context} tokens, but the prompt has {} tokens.",
                    prompt.len()
                ),
                Some("messages"),
            ));
        }
        let room = context - prompt.len();
        let max_tokens = max_tokens.unwrap_or(default_max.min(room));
        if max_tokens == 0 || max_tokens > room {
            return Err(ApiError::invalid(
                format!(
                    "max_tokens must be between 1 and {room} (context {context} minus {} prompt tokens), got {max_tokens}",
                    prompt.len()
                ),
                Some("max_tokens"),
            ));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= model.model.config.vocab_size) {
            return Err(ApiError::invalid(
                format!("token id {bad} is outside the vocabulary"),
                Some("prompt"),
            ));
        }
        Ok(Prepared {
            request: GenerateRequest {
                prompt,
                max_tokens,
                sampling: self.sampling()?,
                stop: self.stops()?,
                ignore_eos: self.ignore_eos,
            },
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }
}

/// OpenAI's default `max_tokens` for legacy completions.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

impl CompletionRequest {
    /// Validates and tokenizes.
    pub fn prepare(&self, model: &LoadedModel, served: &str) -> Result<Prepared, ApiError> {
        let tokens = match &self.prompt {
            Prompt::Text(t) => model.tokenizer.encode(t)?,
            Prompt::Texts(v) if v.len() == 1 => model.tokenizer.encode(&v[0])?,
            Prompt::Texts(v) => {
                return Err(ApiError::invalid(
                    format!("exactly one prompt is supported, got {}", v.len()),
                    Some("prompt"),
                ));
            }
            Prompt::Tokens(ids) => ids.clone(),
        };
        self.common.prepare(model, served, tokens, self.common.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
    }
}

impl ChatRequest {
    /// Validates, applies the chat template and tokenizes.
    pub fn prepare(&self, model: &LoadedModel, served: &str) -> Result<Prepared, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("`messages` must not be empty", Some("messages")));
        }
        let template = model
            .chat_template
            .as_ref()
            .ok_or_else(|| ApiError::invalid("this model has no chat template; use /v1/completions", None))?;
        let mut messages = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    format!("content parts of type `{kind}` are not supported (text only)"),
                                    Some("messages"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            messages.push(ChatMessage::new(m.role.clone(), content));
        }
        let text = template.render(&messages, true)?;
        let tokens = model.tokenizer.encode(&text)?;
        let max = self.max_completion_tokens.or(self.common.max_tokens);
        self.common.prepare(model, served, tokens, max, usize::MAX)
    }
}
