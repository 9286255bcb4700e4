//! OpenAI request bodies as they arrive, parsed field by field (the checks that turn them into
//! a [`GenerateRequest`](crate::generate::GenerateRequest) are in `prepare.rs`). Fields the engine implements are checked, and
//! each error names the field. Fields that would change the answer
//! and that it does not implement (tools, `response_format`, penalties, ...) are
//! refused with a 400 naming the field, unless set to their neutral value: silently ignoring
//! them would hand back something the client did not ask for. Other unknown fields (`user`,
//! `metadata`, ...) are ignored, as OpenAI-compatible servers do.

use super::error::ApiError;
use crate::sampling::MAX_TOP_LOGPROBS;
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
    /// Fields the engine does not implement; accepted only at their neutral value.
    #[serde(skip)]
    pub unsupported: Unsupported,
}

/// OpenAI fields that change the answer and that the engine does not implement. Each is kept
/// as raw JSON so that its neutral value (absent, `null`, `false`, `0`, empty, `"none"`,
/// `{"type": "text"}`) passes and anything else gets a 400 naming it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unsupported {
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    functions: Option<serde_json::Value>,
    function_call: Option<serde_json::Value>,
    parallel_tool_calls: Option<serde_json::Value>,
    response_format: Option<serde_json::Value>,
    presence_penalty: Option<serde_json::Value>,
    frequency_penalty: Option<serde_json::Value>,
    logit_bias: Option<serde_json::Value>,
    best_of: Option<serde_json::Value>,
    echo: Option<serde_json::Value>,
    suffix: Option<serde_json::Value>,
}

impl Unsupported {
    /// The first field set to something other than its neutral value, with why.
    pub(super) fn check(&self) -> Result<(), ApiError> {
        use serde_json::Value;
        let neutral = |v: &Value| match v {
            Value::Null | Value::Bool(false) => true,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty() || s == "none" || s == "auto",
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            Value::Bool(true) => false,
        };
        let fields: [(&'static str, &Option<Value>, &str); 12] = [
            ("tools", &self.tools, "tool calling is not supported by this server"),
            ("tool_choice", &self.tool_choice, "tool calling is not supported by this server"),
            ("functions", &self.functions, "function calling is not supported by this server"),
            ("function_call", &self.function_call, "function calling is not supported by this server"),
            (
                "parallel_tool_calls",
                &self.parallel_tool_calls,
                "tool calling is not supported by this server",
            ),
            ("response_format", &self.response_format, "only `{\"type\": \"text\"}` is supported"),
            ("presence_penalty", &self.presence_penalty, "only 0 is supported"),
            ("frequency_penalty", &self.frequency_penalty, "only 0 is supported"),
            ("logit_bias", &self.logit_bias, "logit bias is not supported by this server"),
            ("best_of", &self.best_of, "only best_of = 1 is supported"),
            ("echo", &self.echo, "echo is not supported by this server"),
            ("suffix", &self.suffix, "suffix (insertion) is not supported by this server"),
        ];
        for (name, value, why) in fields {
            let Some(v) = value else { continue };
            let ok = match name {
                // `"auto"` asks for tools only when tools are given; `"none"` asks for none.
                "tool_choice" | "function_call" => neutral(v),
                "parallel_tool_calls" => true,
                "response_format" => {
                    neutral(v)
                        || v.get("type").and_then(Value::as_str) == Some("text")
                            && v.as_object().is_some_and(|o| o.len() == 1)
                }
                "best_of" => v.is_null() || v.as_u64() == Some(1),
                "suffix" => v.is_null() || v.as_str() == Some(""),
                _ => neutral(v) && !v.is_string(),
            };
            if !ok {
                return Err(ApiError::invalid(format!("`{name}` = {v}: {why}"), Some(name)));
            }
        }
        Ok(())
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Log probabilities of each token and this many alternatives (0 to 20).
    pub logprobs: Option<usize>,
    /// Everything else.
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
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<MessageIn>,
    /// OpenAI's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Log probabilities of each token (`logprobs: true`) with `top_logprobs` alternatives.
    pub logprobs: Option<usize>,
    /// Everything else.
    pub common: Common,
}

type Fields = serde_json::Map<String, serde_json::Value>;

/// The body as a JSON object; a syntax error or another JSON type is a 400.
fn object(body: &[u8]) -> Result<Fields, ApiError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::invalid(
            format!("invalid request body: expected a JSON object, got {}", json_kind(&other)),
            None,
        )),
        Err(e) => Err(ApiError::invalid(format!("invalid request body: {e}"), None)),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Deserializes `value` (found at `at`, `""` for the body itself), naming the field at fault
/// in words a client understands rather than Rust's (`expected usize`, `untagged enum`).
fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value, at: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner_path = e.path().to_string();
        let message = plain_words(&e.into_inner().to_string());
        // A missing field is reported at its parent; name the field itself.
        let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next());
        let mut path: Vec<String> = Vec::new();
        if !at.is_empty() {
            path.push(at.to_string());
        }
        if inner_path != "." {
            path.push(inner_path);
        }
        if let Some(field) = missing {
            path.push(field.to_string());
        }
        let param = path.join(".").replace(".[", "[");
        if param.is_empty() {
            ApiError::invalid(format!("invalid request body: {message}"), None)
        } else {
            ApiError::invalid_field(format!("invalid `{param}`: {message}"), param)
        }
    })
}

/// Removes `name` from `fields` and deserializes it; absent or `null` is `None`.
fn take<T: serde::de::DeserializeOwned>(fields: &mut Fields, name: &str) -> Result<Option<T>, ApiError> {
    match fields.remove(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => typed(v, name).map(Some),
    }
}

fn missing(name: &'static str) -> ApiError {
    ApiError::invalid(format!("missing field `{name}`"), Some(name))
}

/// serde's wording of a type error, in JSON's terms, without the line and column.
fn plain_words(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    let mut out = message.replace("data did not match any variant of ", "expected ");
    for (rust, json) in [
        ("untagged enum Prompt", "a string, a list of one string, or a list of token ids"),
        ("untagged enum Stop", "a string or a list of strings"),
        ("untagged enum Content", "a string or a list of content parts"),
        ("usize", "a non-negative integer"),
        ("u64", "a non-negative integer"),
        ("u32", "a non-negative integer"),
        ("i64", "an integer"),
        ("f32", "a number"),
        ("f64", "a number"),
        ("a sequence", "a list"),
        ("a map", "an object"),
    ] {
        out = out.replace(rust, json);
    }
    out
}

impl Common {
    /// The shared fields from what is left of the body once the endpoint's own are taken.
    fn from_fields(fields: Fields) -> Result<Common, ApiError> {
        let unsupported: Unsupported = typed(serde_json::Value::Object(fields.clone()), "")?;
        let common: Common = typed(serde_json::Value::Object(fields), "")?;
        Ok(Common { unsupported, ..common })
    }
}

impl CompletionRequest {
    /// Parses a `/v1/completions` body.
    pub fn from_json(body: &[u8]) -> Result<CompletionRequest, ApiError> {
        let mut fields = object(body)?;
        let prompt = take(&mut fields, "prompt")?.ok_or_else(|| missing("prompt"))?;
        // Legacy completions ask with `logprobs: N`; `top_logprobs` is the chat endpoint's.
        if fields.get("top_logprobs").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                "`top_logprobs` belongs to /v1/chat/completions; here ask with `logprobs`: N (0 to 20)",
                Some("top_logprobs"),
            ));
        }
        let logprobs = match fields.remove("logprobs") {
            // `false` is what some clients send for "none".
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => None,
            Some(v) => Some(top_logprobs(typed(v, "logprobs")?, "logprobs")?),
        };
        Ok(CompletionRequest { prompt, logprobs, common: Common::from_fields(fields)? })
    }
}

impl ChatRequest {
    /// Parses a `/v1/chat/completions` body.
    pub fn from_json(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let mut fields = object(body)?;
        let messages = take(&mut fields, "messages")?.ok_or_else(|| missing("messages"))?;
        let max_completion_tokens = take(&mut fields, "max_completion_tokens")?;
        let wanted: Option<bool> = take(&mut fields, "logprobs")?;
        let top: Option<usize> = take(&mut fields, "top_logprobs")?;
        let logprobs = match (wanted.unwrap_or(false), top) {
            (true, top) => Some(top_logprobs(top.unwrap_or(0), "top_logprobs")?),
            (false, Some(n)) if n > 0 => {
                return Err(ApiError::invalid("`top_logprobs` needs `logprobs`: true", Some("top_logprobs")));
            }
            (false, _) => None,
        };
        Ok(ChatRequest { messages, max_completion_tokens, logprobs, common: Common::from_fields(fields)? })
    }
}

/// Checks a number of alternatives against OpenAI's limit.
fn top_logprobs(n: usize, param: &'static str) -> Result<usize, ApiError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            format!("`{param}` must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
            Some(param),
        ));
    }
    Ok(n)
}
