//! HTTP handlers: OpenAI completions and chat completions (JSON or SSE), models, health,
//! readiness and metrics. Handlers validate, submit to the scheduler, and turn its events into
//! responses; they never touch the model.

use super::AppState;
use super::error::ApiError;
use super::logprobs::LogprobsWriter;
use super::openai::{ChatRequest, CompletionRequest};
use super::prepare::Prepared;
use crate::LoadedModel;
use crate::generate::FinishReason;
use crate::sampling::TokenLogprob;
use crate::scheduler::{Event, Submission};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// Which endpoint a response is shaped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), key.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

/// Whether `a == b`, in a time that depends on their lengths only, not on where they differ:
/// a client timing wrong keys learns nothing of the right one's bytes.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i).copied().unwrap_or(0), b.get(i).copied().unwrap_or(0));
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// A request body and its share of the server's body budget, held until the request is
/// prepared.
struct ReadBody {
    bytes: Bytes,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

/// The request body, at most `max_body_bytes` (413 beyond), within `body_timeout` of the
/// headers (408 after: a client that never finishes its body does not hold a handler). Its
/// bytes come out of the budget shared by all connections first (`max_buffered_bytes`): the
/// declared length, or the largest body when none is declared; with the budget spent the
/// request gets a 503 with `Retry-After` before anything is read.
async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    path: &str,
) -> Result<ReadBody, ApiError> {
    let too_large = || {
        ApiError::from_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The limit is {} bytes.", state.max_body_bytes),
            "POST",
            path,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if declared.is_some_and(|n| n > state.max_body_bytes) {
        return Err(too_large());
    }
    let reserve = super::buffer_kib(declared.unwrap_or(state.max_body_bytes));
    let Ok(budget) = state.buffered.clone().try_acquire_many_owned(reserve as u32) else {
        return Err(ApiError::busy(
            "The server is reading as many request bodies as it buffers at once; retry shortly.",
        ));
    };
    match tokio::time::timeout(state.body_timeout, axum::body::to_bytes(body, state.max_body_bytes)).await {
        Ok(Ok(bytes)) => Ok(ReadBody { bytes, _budget: budget }),
        Ok(Err(e)) if format!("{e:#}").contains("length limit") => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::invalid(format!("reading the request body failed: {e}"), None)),
        Err(_) => Err(ApiError::from_status(
            StatusCode::REQUEST_TIMEOUT,
            format!("Nothing completed it within {} s of its headers.", state.body_timeout.as_secs_f64()),
            "POST",
            path,
        )),
    }
}

/// Checks the API key on the headers, then reads the body: a client without the key never
/// gets a byte of its body buffered.
async fn authorized_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    path: &str,
) -> Result<ReadBody, ApiError> {
    check_auth(state, headers)?;
    read_body(state, headers, body, path).await
}

/// Runs `prepare` (parsing, the chat template, tokenizing: milliseconds usually, seconds for a
/// long text) on the blocking pool, at most [`super::PREPARING`] at a time, so the HTTP runtime
/// keeps answering other streams and the health probes meanwhile.
///
/// Fair between long and short: a body over [`super::LONG_BODY_BYTES`] first waits its turn
/// among long ones (one at a time), so a client sending long texts holds at most one of the
/// slots and short requests keep the others.
async fn off_runtime<F>(state: &Arc<AppState>, body_bytes: usize, prepare: F) -> Result<Prepared, ApiError>
where
    F: FnOnce(&AppState) -> Result<Prepared, ApiError> + Send + 'static,
{
    let stopping = |_| ApiError::internal("the server is stopping");
    let _long = if body_bytes > super::LONG_BODY_BYTES {
        Some(state.preparing_long.acquire().await.map_err(stopping)?)
    } else {
        None
    };
    let _permit = state.preparing.acquire().await.map_err(stopping)?;
    let state = state.clone();
    tokio::task::spawn_blocking(move || prepare(&state))
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("preparing the request failed: {e}"))))
}

/// Any path no route serves: a 404 with OpenAI's error body.
pub async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::from_status(StatusCode::NOT_FOUND, String::new(), method.as_str(), uri.path()).into_response()
}

/// A served path with the wrong method: a 405 with OpenAI's error body.
pub async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::from_status(StatusCode::METHOD_NOT_ALLOWED, String::new(), method.as_str(), uri.path())
        .into_response()
}

/// Rewrites an error response that is not JSON (axum's extractor rejections, such as 413 for a
/// body over the limit, and the panic handler's 500) into OpenAI's error body, keeping its
/// status and headers: every error a client sees has the same shape.
pub async fn openai_errors(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let mut rewritten = ApiError::from_status(status, text, method.as_str(), &path).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().insert(name.clone(), value.clone());
        }
    }
    rewritten
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    let prepared = match authorized_body(&state, &headers, body, "/v1/completions").await {
        Ok(body) => {
            off_runtime(&state, body.bytes.len(), move |s| {
                CompletionRequest::from_json(&body.bytes)
                    .and_then(|r| r.prepare(&s.model, &s.served_name, s.kv_tokens))
            })
            .await
        }
        Err(e) => Err(e),
    };
    respond(state, prepared, Endpoint::Completions, arrived).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let prepared = match authorized_body(&state, &headers, body, "/v1/chat/completions").await {
        Ok(body) => {
            off_runtime(&state, body.bytes.len(), move |s| {
                ChatRequest::from_json(&body.bytes)
                    .and_then(|r| r.prepare(&s.model, &s.served_name, s.kv_tokens))
            })
            .await
        }
        Err(e) => Err(e),
    };
    respond(state, prepared, Endpoint::Chat, arrived).await
}

async fn respond(
    state: Arc<AppState>,
    prepared: Result<Prepared, ApiError>,
    endpoint: Endpoint,
    arrived: Instant,
) -> Response {
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            state.metrics.rejected(e.reason());
            // A body left unread (over the limit, or never finished) leaves the connection
            // unusable: say so, or a client reuses it and its next request fails.
            let unread = matches!(
                e.status,
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT | StatusCode::UNAUTHORIZED
            ) || e.code == Some("server_busy");
            let mut response = e.into_response();
            if unread {
                response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            }
            return response;
        }
    };
    let id = state.next_id(endpoint == Endpoint::Chat);
    if state.log_prompts {
        tracing::info!(request_id = %id, prompt_tokens = prepared.request.prompt.len(), prompt = ?prepared.request.prompt, "request");
    } else {
        tracing::info!(request_id = %id, prompt_tokens = prepared.request.prompt.len(), max_tokens = prepared.request.max_tokens, stream = prepared.stream, "request");
    }
    let logprobs = prepared.request.logprobs.is_some();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission { id: id.clone(), request: prepared.request, arrived, events: tx };
    if let Err(refusal) = state.scheduler.submit(submission) {
        let e = ApiError::from(refusal);
        state.metrics.rejected(e.reason());
        return e.into_response();
    }
    let shape = Shape {
        id,
        endpoint,
        model: state.served_name.clone(),
        created: unix_now(),
        logprobs,
        loaded: state.model.clone(),
    };
    if prepared.stream {
        stream_response(shape, rx, prepared.include_usage, state.closing.clone()).into_response()
    } else {
        collect_response(shape, rx, state.closing.clone()).await
    }
}

/// Identity of one response, repeated in every chunk.
struct Shape {
    id: String,
    endpoint: Endpoint,
    model: String,
    created: u64,
    /// Whether the request asked for log probabilities.
    logprobs: bool,
    /// For the text of tokens in log probabilities.
    loaded: Arc<LoadedModel>,
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// The `logprobs` of a choice holding `entries` (`null` unless the request asked).
    fn logprobs(&self, writer: &mut LogprobsWriter, entries: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let tokenizer = &self.loaded.tokenizer;
        match self.endpoint {
            Endpoint::Chat => writer.chat(tokenizer, entries),
            Endpoint::Completions => writer.completions(tokenizer, entries),
        }
    }

    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<FinishReason>, logprobs: Value) -> Value {
        let finish = finish.map(FinishReason::as_str);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                    delta.insert("content".into(), json!(""));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": [choice]})
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// SSE as OpenAI clients expect: (chat) a role chunk first, content deltas, a chunk with
/// `finish_reason`, optionally a usage chunk with `"choices": []`, then `data: [DONE]`.
fn stream_response(
    shape: Shape,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    closing: tokio::sync::watch::Receiver<bool>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    // Headers are gone already: a failure is reported in-band, as OpenAI does, then `[DONE]`,
    // so a client reading to `[DONE]` ends too.
    let failed = move |message: &str| {
        let body =
            json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}});
        stream::iter(vec![data(body), Ok(SseEvent::default().data("[DONE]"))])
    };
    let first = if shape.endpoint == Endpoint::Chat {
        vec![data(shape.chunk(None, true, None, Value::Null))]
    } else {
        vec![]
    };
    // Log probabilities of tokens whose text is still held back (half a character, a possible
    // stop string) wait for the chunk that releases it.
    let state = StreamState {
        rx,
        shape,
        closing,
        done: false,
        pending: Vec::new(),
        writer: LogprobsWriter::default(),
    };
    let events = stream::unfold(state, move |mut st| async move {
        if st.done {
            return None;
        }
        let event = tokio::select! {
            event = st.rx.recv() => event,
            () = async { let _ = st.closing.wait_for(|c| *c).await; } => {
                let cut = "the engine is shutting down: the response was cut at its drain deadline";
                st.done = true;
                return Some((failed(cut), st));
            }
        };
        let out: Vec<Result<SseEvent, Infallible>> = match event {
            Some(Event::Token { text, logprob, .. }) => {
                st.pending.extend(logprob);
                if text.is_empty() {
                    vec![]
                } else {
                    let logprobs = st.shape.logprobs(&mut st.writer, &std::mem::take(&mut st.pending));
                    vec![data(st.shape.chunk(Some(&text), false, None, logprobs))]
                }
            }
            Some(Event::Finished { reason, prompt_tokens, completion_tokens }) => {
                let logprobs = if st.pending.is_empty() {
                    Value::Null
                } else {
                    st.shape.logprobs(&mut st.writer, &std::mem::take(&mut st.pending))
                };
                let shape = &st.shape;
                let mut v = vec![data(shape.chunk(None, false, Some(reason), logprobs))];
                if include_usage {
                    v.push(data(json!({
                        "id": shape.id, "object": shape.object(true), "created": shape.created,
                        "model": shape.model, "choices": [], "usage": usage(prompt_tokens, completion_tokens),
                    })));
                }
                v.push(Ok(SseEvent::default().data("[DONE]")));
                st.done = true;
                return Some((stream::iter(v), st));
            }
            Some(Event::Failed(msg)) => {
                st.done = true;
                return Some((failed(&msg), st));
            }
            None => {
                st.done = true;
                return Some((failed("the scheduler stopped before the request finished"), st));
            }
        };
        Some((stream::iter(out), st))
    })
    .flatten();
    Sse::new(stream::iter(first).chain(events)).keep_alive(KeepAlive::default())
}

/// What a streamed response carries from one event to the next.
struct StreamState {
    rx: UnboundedReceiver<Event>,
    shape: Shape,
    closing: tokio::sync::watch::Receiver<bool>,
    done: bool,
    pending: Vec<TokenLogprob>,
    writer: LogprobsWriter,
}

/// Non-streaming: wait for the whole answer. Dropping this future (client gone) drops the
/// receiver, which cancels the sequence at the next step. At the drain deadline it answers
/// 503: nothing was sent yet, so the client can retry elsewhere.
async fn collect_response(
    shape: Shape,
    mut rx: UnboundedReceiver<Event>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let mut text = String::new();
    let mut entries = Vec::new();
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            _ = closing.wait_for(|c| *c) => return ApiError::from(crate::scheduler::Refusal::Draining).into_response(),
        };
        let Some(ev) = event else { break };
        match ev {
            Event::Token { text: t, logprob, .. } => {
                text.push_str(&t);
                entries.extend(logprob);
            }
            Event::Finished { reason, prompt_tokens, completion_tokens } => {
                let finish = reason.as_str();
                let logprobs = shape.logprobs(&mut LogprobsWriter::default(), &entries);
                let choice = match shape.endpoint {
                    Endpoint::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish})
                    }
                    Endpoint::Completions => {
                        json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish})
                    }
                };
                let body = json!({
                    "id": shape.id, "object": shape.object(false), "created": shape.created, "model": shape.model,
                    "choices": [choice], "usage": usage(prompt_tokens, completion_tokens),
                });
                return axum::Json(body).into_response();
            }
            Event::Failed(msg) => return ApiError::internal(msg).into_response(),
        }
    }
    ApiError::internal("the scheduler stopped before the request finished").into_response()
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    let cfg = &state.model.model.config;
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.served_name, "object": "model", "created": state.started, "owned_by": "pacer",
            "max_model_len": cfg.context_length, "tier": state.model.model.tier.as_str(),
        }]
    }))
    .into_response()
}

/// `GET /health` (liveness): the scheduler thread runs, its steps do not keep failing, and
/// none has hung past `--stall-timeout`. A failing answer gets the pod restarted.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.scheduler.shared().sickness(state.stall_timeout) {
        Some(sick) => (StatusCode::SERVICE_UNAVAILABLE, format!("{sick}\n")).into_response(),
        None => (StatusCode::OK, "ok\n").into_response(),
    }
}

/// `GET /ready`: model loaded and warmed up, not draining, and healthy.
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.scheduler.shared();
    if let Some(sick) = shared.sickness(state.stall_timeout) {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{sick}\n")).into_response()
    } else if shared.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if shared.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
        .into_response()
}
