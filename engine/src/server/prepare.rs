//! A parsed OpenAI request turned into a [`GenerateRequest`]: the served model's name, the
//! sampling parameters and stops in range, the prompt (or the chat template's rendering of the
//! messages) tokenized within the context, and the answer's token budget.

use super::error::ApiError;
use super::openai::{ChatRequest, Common, CompletionRequest, Content, Prompt, Stop};
use crate::LoadedModel;
use crate::chat::ChatMessage;
use crate::generate::GenerateRequest;
use crate::sampling::SamplingParams;

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
        prompt_param: &'static str,
        budget: Budget,
    ) -> Result<Prepared, ApiError> {
        let Budget { max_tokens, default_max, kv_tokens, logprobs } = budget;
        if self.model != served {
            return Err(ApiError::model_not_found(&self.model, served));
        }
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(format!("only n = 1 is supported, got {n}"), Some("n")));
        }
        self.unsupported.check()?;
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
                Some(prompt_param),
            ));
        }
        // The scheduler reserves KV blocks for the prompt plus `max_tokens` when it admits a
        // request: one that cannot fit the whole cache would fail after its 200 went out.
        if prompt.len() >= kv_tokens {
            return Err(ApiError::invalid(
                format!(
                    "The prompt has {} tokens, but this engine's KV cache holds {kv_tokens} (--kv-cache-tokens).",
                    prompt.len()
                ),
                Some(prompt_param),
            ));
        }
        let kv_room = kv_tokens - prompt.len();
        let room = context - prompt.len();
        let max_tokens = max_tokens.unwrap_or(default_max.min(room).min(kv_room));
        if max_tokens == 0 || max_tokens > room {
            return Err(ApiError::invalid(
                format!(
                    "max_tokens must be between 1 and {room} (context {context} minus {} prompt tokens), got {max_tokens}",
                    prompt.len()
                ),
                Some("max_tokens"),
            ));
        }
        if max_tokens > kv_room {
            return Err(ApiError::invalid(
                format!(
                    "{} prompt tokens plus max_tokens {max_tokens} need {} KV-cache tokens, but this engine holds {kv_tokens} (--kv-cache-tokens); ask for at most {kv_room}",
                    prompt.len(),
                    prompt.len() + max_tokens
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
                logprobs,
            },
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }
}

/// How many tokens a request may generate: what it asked for, the endpoint's default when it
/// did not ask, and the KV cache's capacity in tokens.
#[derive(Debug, Clone, Copy)]
struct Budget {
    max_tokens: Option<usize>,
    default_max: usize,
    kv_tokens: usize,
    /// Not a budget, but settled per endpoint like one: the log probabilities asked for.
    logprobs: Option<usize>,
}

/// OpenAI's default `max_tokens` for legacy completions.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Refuses text that cannot fit the context before tokenizing it: megabytes of text take
/// seconds to tokenize and end in a context-length error anyway.
fn fits_before_tokenizing(model: &LoadedModel, bytes: usize, param: &'static str) -> Result<(), ApiError> {
    let context = model.model.config.context_length;
    let cap = model.tokenizer.max_text_bytes(context);
    if bytes > cap {
        return Err(ApiError::invalid(
            format!(
                "The prompt is {bytes} bytes; no text over {cap} bytes fits this model's maximum context length of {context} tokens."
            ),
            Some(param),
        ));
    }
    Ok(())
}

/// `text`'s tokens, refused as soon as they fill the context: tokenizing stops there
/// ([`Tokenizer::encode_within`](crate::tokenizer::Tokenizer::encode_within)), so text far over
/// the context costs about what a full context costs, however long it is.
fn tokens_within_context(model: &LoadedModel, text: &str, param: &'static str) -> Result<Vec<u32>, ApiError> {
    let context = model.model.config.context_length;
    model.tokenizer.encode_within(text, context)?.map_err(|over| {
        ApiError::invalid(
            format!(
                "This model's maximum context length is {context} tokens, but the prompt has at least {} tokens.",
                over.at_least
            ),
            Some(param),
        )
    })
}

impl CompletionRequest {
    /// Validates and tokenizes.
    pub fn prepare(&self, model: &LoadedModel, served: &str, kv_tokens: usize) -> Result<Prepared, ApiError> {
        let bytes = match &self.prompt {
            Prompt::Text(t) => t.len(),
            Prompt::Texts(v) => v.iter().map(String::len).sum(),
            Prompt::Tokens(_) => 0,
        };
        fits_before_tokenizing(model, bytes, "prompt")?;
        let tokens = match &self.prompt {
            Prompt::Text(t) => tokens_within_context(model, t, "prompt")?,
            Prompt::Texts(v) if v.len() == 1 => tokens_within_context(model, &v[0], "prompt")?,
            Prompt::Texts(v) => {
                return Err(ApiError::invalid(
                    format!("exactly one prompt is supported, got {}", v.len()),
                    Some("prompt"),
                ));
            }
            Prompt::Tokens(ids) => ids.clone(),
        };
        self.common.prepare(
            model,
            served,
            tokens,
            "prompt",
            Budget {
                max_tokens: self.common.max_tokens,
                default_max: COMPLETIONS_DEFAULT_MAX_TOKENS,
                kv_tokens,
                logprobs: self.logprobs,
            },
        )
    }
}

impl ChatRequest {
    /// Validates, applies the chat template and tokenizes.
    pub fn prepare(&self, model: &LoadedModel, served: &str, kv_tokens: usize) -> Result<Prepared, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("`messages` must not be empty", Some("messages")));
        }
        let template = model
            .chat_template
            .as_ref()
            .ok_or_else(|| ApiError::invalid("this model has no chat template; use /v1/completions", None))?;
        let bytes = self
            .messages
            .iter()
            .map(|m| match &m.content {
                None => 0,
                Some(Content::Text(t)) => t.len(),
                Some(Content::Parts(parts)) => {
                    parts.iter().filter_map(|p| p.text.as_ref()).map(String::len).sum()
                }
            })
            .sum();
        fits_before_tokenizing(model, bytes, "messages")?;
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
        let tokens = tokens_within_context(model, &text, "messages")?;
        let max = self.max_completion_tokens.or(self.common.max_tokens);
        self.common.prepare(
            model,
            served,
            tokens,
            "messages",
            Budget { max_tokens: max, default_max: usize::MAX, kv_tokens, logprobs: self.logprobs },
        )
    }
}
