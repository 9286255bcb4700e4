//! One streaming request to an OpenAI-compatible server, timed per SSE event. Works with any
//! such server (Pacer, vLLM, llama.cpp, TGI): it asks for `stream_options.include_usage` and
//! falls back to counting content events where the server sends no usage.

use crate::metrics::{RequestRecord, TokenSource};
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::Instant;

/// Which API a run targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `POST /v1/completions` with `prompt`.
    Completions,
    /// `POST /v1/chat/completions` with one user message.
    Chat,
}

/// Where and how to send requests.
#[derive(Debug, Clone)]
pub struct Target {
    /// Server base URL, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// `model` field.
    pub model: String,
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Ask the server to ignore end-of-sequence so outputs have the requested length.
    pub ignore_eos: bool,
    /// Counts tokens locally when the server sends no `usage`.
    pub tokenizer: Option<std::sync::Arc<crate::tokens::TokenCounter>>,
    /// Reuse idle connections between requests (HTTP keep-alive); see [`http_client`].
    pub keep_alive: bool,
}

/// Connection attempts after the first for a request whose connection could not be opened.
pub const CONNECT_RETRIES: u32 = 3;

/// The HTTP client for `target`.
///
/// Without keep-alive every request opens its own connection. Some servers (llama.cpp's
/// `llama-server`) close a connection a fraction of a millisecond after the last chunk of a
/// streamed response while announcing `Keep-Alive`; a client that reuses the connection writes
/// its next request into that instant and sees it fail. Whether the server had read that request
/// cannot be known from the client's side, so it cannot safely be sent again. A fresh
/// connection costs one TCP handshake and leaves only failures that are unambiguous: a
/// connection that could not be opened never carried the request, and [`send`] retries those
/// ([`CONNECT_RETRIES`]).
pub fn http_client(target: &Target) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(if target.keep_alive { 1024 } else { 0 })
        .tcp_nodelay(true)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// The request body for `prompt` and `max_tokens`.
pub fn body(target: &Target, prompt: &str, max_tokens: usize) -> Value {
    let input = match target.endpoint {
        Endpoint::Completions => json!({"prompt": prompt}),
        Endpoint::Chat => json!({"messages": [{"role": "user", "content": prompt}]}),
    };
    finish_body(target, input, max_tokens)
}

/// The request body for a dataset item (`messages` need the chat endpoint).
pub fn body_for_item(
    target: &Target,
    item: &crate::dataset::DatasetItem,
    default_max_tokens: usize,
) -> Result<Value, String> {
    let input = match (&item.prompt, &item.messages, target.endpoint) {
        (Some(p), _, _) => return Ok(body(target, p, item.max_tokens.unwrap_or(default_max_tokens))),
        (None, Some(m), Endpoint::Chat) => json!({"messages": m}),
        _ => return Err("a `messages` item needs --endpoint chat".into()),
    };
    Ok(finish_body(target, input, item.max_tokens.unwrap_or(default_max_tokens)))
}

fn finish_body(target: &Target, mut b: Value, max_tokens: usize) -> Value {
    b["model"] = json!(target.model);
    b["max_tokens"] = json!(max_tokens);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    b["temperature"] = json!(0);
    if target.ignore_eos {
        b["ignore_eos"] = json!(true);
    }
    b
}

/// Whether a parsed chunk carries generated content (role-only and usage-only chunks do not).
pub fn content_of(chunk: &Value) -> Option<&str> {
    let choice = chunk.get("choices")?.get(0)?;
    let text = choice.get("text").or_else(|| choice.get("delta")?.get("content"))?.as_str()?;
    (!text.is_empty()).then_some(text)
}

/// Sends one request and records its timeline, relative to `epoch`.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    epoch: Instant,
    scheduled: f64,
) -> RequestRecord {
    send_with_text(client, target, body, epoch, scheduled).await.0
}

/// [`send`], also returning the generated text (the next turn of a conversation needs it).
pub async fn send_with_text(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    epoch: Instant,
    scheduled: f64,
) -> (RequestRecord, String) {
    let path = match target.endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::Chat => "/v1/chat/completions",
    };
    let url = format!("{}{path}", target.base_url.trim_end_matches('/'));
    let mut rec = RequestRecord { scheduled, token_source: TokenSource::Events, ..Default::default() };
    let resp = loop {
        let mut req = client.post(&url).json(body);
        if let Some(key) = &target.api_key {
            req = req.bearer_auth(key);
        }
        rec.sent = epoch.elapsed().as_secs_f64();
        match req.send().await {
            Ok(r) => break r,
            // Only a connection that was never opened is known not to have carried the request.
            Err(e) if e.is_connect() && rec.retries < CONNECT_RETRIES => {
                rec.retries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50 << rec.retries)).await;
            }
            Err(e) => {
                rec.error = Some(format!("request failed: {}", error_chain(&e)));
                rec.closed = epoch.elapsed().as_secs_f64();
                return (rec, String::new());
            }
        }
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        rec.error = Some(format!("HTTP {status}: {text}"));
        rec.closed = epoch.elapsed().as_secs_f64();
        return (rec, String::new());
    }
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut usage_tokens = None;
    let mut generated = String::new();
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let now = epoch.elapsed().as_secs_f64();
        match chunk {
            Ok(bytes) => buf.extend_from_slice(&bytes),
            Err(e) => {
                rec.error = Some(format!("stream broke: {e}"));
                break;
            }
        }
        // Events end with a blank line; one network read may hold several or part of one.
        while let Some(end) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end).collect();
            for line in String::from_utf8_lossy(&event).lines() {
                let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
                if let Some(err) = v.get("error") {
                    rec.error = Some(format!("server error: {err}"));
                }
                if let Some(text) = content_of(&v) {
                    rec.content_events.push(now);
                    generated.push_str(text);
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    usage_tokens = u.get("completion_tokens").and_then(Value::as_u64).map(|n| n as usize);
                    rec.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
                }
            }
        }
    }
    rec.closed = epoch.elapsed().as_secs_f64();
    match usage_tokens {
        Some(n) => {
            rec.output_tokens = n;
            rec.token_source = TokenSource::Usage;
        }
        None => match &target.tokenizer {
            Some(t) => {
                rec.output_tokens = t.count(&generated);
                rec.token_source = TokenSource::Tokenizer;
            }
            None => rec.output_tokens = rec.content_events.len(),
        },
    }
    if !done && rec.error.is_none() {
        rec.error = Some("the stream ended without data: [DONE]".into());
    }
    (rec, generated)
}

/// An error with its causes ("error sending request" alone does not say what happened).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_and_usage_chunks_carry_no_content() {
        let role = json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]});
        let usage = json!({"choices": [], "usage": {"completion_tokens": 3}});
        let chat = json!({"choices": [{"delta": {"content": "Hi"}}]});
        let text = json!({"choices": [{"text": " there"}]});
        assert_eq!(content_of(&role), None);
        assert_eq!(content_of(&usage), None);
        assert_eq!(content_of(&chat), Some("Hi"));
        assert_eq!(content_of(&text), Some(" there"));
    }

    #[test]
    fn events_split_on_blank_lines_of_either_style() {
        assert_eq!(find_event_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(find_event_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: a\n"), None);
    }
}
