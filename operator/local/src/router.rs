//! Local mode's router: one loopback port in front of the engine replicas. It passes every
//! request through unchanged (OpenAI-compatible, SSE streamed chunk by chunk, bodies never
//! buffered) to the ready replica with the fewest outstanding requests, answers 503 with an
//! OpenAI error body when none is ready, and serves its own `/metrics` and `/health`.
//!
//! A draining replica is taken out of the choice at once; its outstanding count tells the
//! supervisor when it may be stopped.
//!
//! A replica that fails a request midway never leaves the client hanging or guessing: one
//! that does not answer within [`Timeouts::answer`] gets a 504, a stream that goes silent for
//! [`Timeouts::idle`] or breaks (the replica died) ends with an OpenAI error event and
//! `data: [DONE]`, as the engine itself ends a stream it cuts.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use pacer_engine_api::metrics as names;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One replica as the router sees it.
#[derive(Debug)]
pub struct Backend {
    /// The replica's id (a label in the router's metrics).
    pub id: u32,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    outstanding: AtomicUsize,
}

impl Backend {
    /// A backend for replica `id` at `base_url`.
    pub fn new(id: u32, base_url: String) -> Arc<Backend> {
        Arc::new(Backend { id, base_url, outstanding: AtomicUsize::new(0) })
    }

    /// Requests sent to this replica whose response has not finished yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// The replicas requests may go to, and the choice among them.
#[derive(Debug, Default)]
pub struct Pool {
    ready: Mutex<Vec<Arc<Backend>>>,
    turn: AtomicU64,
}

impl Pool {
    /// Adds a replica that passed its readiness check.
    pub fn add(&self, backend: Arc<Backend>) {
        let mut ready = self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !ready.iter().any(|b| b.id == backend.id) {
            ready.push(backend);
        }
    }

    /// Takes a replica out of the choice (draining, dead); requests already sent finish.
    pub fn remove(&self, id: u32) {
        let mut ready = self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ready.retain(|b| b.id != id);
    }

    /// Replicas in the choice.
    pub fn ready_count(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.len())
    }

    /// The ready replica with the fewest outstanding requests, its count already raised; ties
    /// go round-robin so equal replicas share a light load. `None` when none is ready.
    pub fn pick(&self) -> Option<InFlight> {
        self.pick_except(&[])
    }

    /// [`Pool::pick`] among the replicas not in `tried`.
    pub fn pick_except(&self, tried: &[u32]) -> Option<InFlight> {
        let ready = self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ready.is_empty() {
            return None;
        }
        let start = (self.turn.fetch_add(1, Ordering::Relaxed) % ready.len() as u64) as usize;
        let chosen = (0..ready.len())
            .map(|k| &ready[(start + k) % ready.len()])
            .filter(|b| !tried.contains(&b.id))
            .min_by_key(|b| b.outstanding())
            .cloned()?;
        // Raised under the lock, so two concurrent picks see each other's choice.
        chosen.outstanding.fetch_add(1, Ordering::AcqRel);
        Some(InFlight { backend: chosen })
    }
}

/// A request's hold on a replica: lowers its outstanding count when dropped, which is when the
/// response body has been streamed to the end (or the client went away).
#[derive(Debug)]
pub struct InFlight {
    backend: Arc<Backend>,
}

impl InFlight {
    /// The replica.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.backend.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router's own metrics.
#[derive(Clone)]
pub struct RouterMetrics {
    registry: Registry,
    requests: IntCounterVec,
    outstanding: IntGaugeVec,
    unavailable: IntCounterVec,
    ready: IntGauge,
}

impl RouterMetrics {
    fn new() -> RouterMetrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(names::ROUTER_REQUESTS.name, names::ROUTER_REQUESTS.help),
            &["replica", "status"],
        )
        .expect("valid metric");
        let outstanding = IntGaugeVec::new(
            Opts::new(names::ROUTER_OUTSTANDING.name, names::ROUTER_OUTSTANDING.help),
            &["replica"],
        )
        .expect("valid metric");
        let unavailable =
            IntCounterVec::new(Opts::new(names::ROUTER_ERRORS.name, names::ROUTER_ERRORS.help), &["reason"])
                .expect("valid metric");
        let ready = IntGauge::new(names::ROUTER_READY.name, names::ROUTER_READY.help).expect("valid metric");
        for m in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(outstanding.clone()),
            Box::new(unavailable.clone()),
            Box::new(ready.clone()),
        ] {
            registry.register(m).expect("unique metric");
        }
        RouterMetrics { registry, requests, outstanding, unavailable, ready }
    }
}

/// How long the router waits on a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For the response's headers (a non-streamed answer sends them when generation ends).
    pub answer: Duration,
    /// For the next chunk of a response body once it started.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { answer: Duration::from_secs(300), idle: Duration::from_secs(60) }
    }
}

/// What the router's handlers share.
#[derive(Clone)]
pub struct RouterState {
    /// The replicas.
    pub pool: Arc<Pool>,
    client: reqwest::Client,
    metrics: RouterMetrics,
    timeouts: Timeouts,
}

impl RouterState {
    /// A router over `pool`.
    pub fn new(pool: Arc<Pool>) -> RouterState {
        RouterState::with_timeouts(pool, Timeouts::default())
    }

    /// A router over `pool` that gives up on a silent replica after `timeouts`.
    pub fn with_timeouts(pool: Arc<Pool>, timeouts: Timeouts) -> RouterState {
        // An idle connection is dropped well before the engine's own idle limit (its header
        // timeout, 10 s by default) closes it: reusing a connection the server is closing
        // at that instant fails the request after it was sent.
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(Duration::from_secs(4))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        RouterState { pool, client, metrics: RouterMetrics::new(), timeouts }
    }
}

/// The router's routes: `/health`, `/metrics`, everything else passed through.
pub fn router(state: RouterState) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .fallback(pass_through)
        .with_state(state)
}

async fn metrics(State(state): State<RouterState>) -> Response {
    state.metrics.ready.set(state.pool.ready_count() as i64);
    let body = TextEncoder::new().encode_to_string(&state.metrics.registry.gather()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// An error in OpenAI's shape, as the engine itself answers.
fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    (status, axum::Json(body)).into_response()
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) are the connection's, not the message's.
fn end_to_end(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &header::HeaderValue)> {
    headers.iter().filter(|(name, _)| {
        !matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "host"
        )
    })
}

/// Largest request body the router accepts (the engine's own default limit).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Sends the request to the least busy ready replica, and to another when one refuses the
/// connection (it never saw the request); the answer's head, or the error response to give.
async fn send(
    state: &RouterState,
    parts: &axum::http::request::Parts,
    path: &str,
    body: &axum::body::Bytes,
) -> Result<(InFlight, IntGauge, reqwest::Response), Response> {
    let mut tried = Vec::new();
    loop {
        let Some(lease) = state.pool.pick_except(&tried) else {
            state.metrics.unavailable.with_label_values(&["no_ready_replica"]).inc();
            let mut response = openai_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "no engine replica is ready yet; retry shortly",
            );
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return Err(response);
        };
        let replica = lease.backend().id.to_string();
        let gauge = state.metrics.outstanding.with_label_values(&[&replica]);
        gauge.inc();
        let mut upstream =
            state.client.request(parts.method.clone(), format!("{}{}", lease.backend().base_url, path));
        for (name, value) in end_to_end(&parts.headers) {
            upstream = upstream.header(name, value);
        }
        let sent = tokio::time::timeout(state.timeouts.answer, upstream.body(body.clone()).send()).await;
        let Ok(sent) = sent else {
            gauge.dec();
            tracing::warn!(replica = %replica, timeout_s = state.timeouts.answer.as_secs_f64(), "a replica did not answer in time");
            state.metrics.unavailable.with_label_values(&["timeout"]).inc();
            return Err(openai_error(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                &format!("replica {replica} did not answer within {} s", state.timeouts.answer.as_secs_f64()),
            ));
        };
        match sent {
            Ok(answer) => return Ok((lease, gauge, answer)),
            Err(e) => {
                gauge.dec();
                tracing::warn!(replica = %replica, error = %e, "a replica did not answer");
                // Not connected: the replica never saw the request, so another may take it.
                if e.is_connect() {
                    tried.push(lease.backend().id);
                    continue;
                }
                state.metrics.unavailable.with_label_values(&["upstream"]).inc();
                return Err(openai_error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    &format!("replica {replica}: {e}"),
                ));
            }
        }
    }
}

async fn pass_through(State(state): State<RouterState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // Requests are small JSON documents: holding one lets a request that could not reach a
    // replica (it just crashed) go to another. Responses are streamed, never held.
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return openai_error(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", &e.to_string());
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let (lease, gauge, answer) = match send(&state, &parts, &path, &body).await {
        Ok(sent) => sent,
        Err(refused) => return refused,
    };
    let replica = lease.backend().id.to_string();
    let status = answer.status();
    state.metrics.requests.with_label_values(&[&replica, status.as_str()]).inc();
    let mut response = Response::builder().status(status.as_u16());
    for (name, value) in end_to_end(answer.headers()) {
        response = response.header(name, value);
    }
    let sse = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    // The lease and the gauge live as long as the body stream: the replica counts as busy
    // until the last SSE chunk has gone out.
    let guard = (lease, GaugeGuard(gauge));
    let chunks = answer.bytes_stream().map(|c| c.map_err(|e| e.to_string()));
    let stream = guarded(chunks, state.timeouts.idle, sse, replica, state.metrics.unavailable.clone()).map(
        move |chunk| {
            let _held = &guard;
            chunk
        },
    );
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| openai_error(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", &e.to_string()))
}

/// `chunks` of a replica's response, cut when the replica goes silent for `idle` or its stream
/// breaks: an SSE stream then ends with an OpenAI error event and `data: [DONE]` (so a client
/// knows it was cut, not finished); another body ends with the error, which the client sees
/// as a broken response rather than a short one.
fn guarded<S>(
    chunks: S,
    idle: Duration,
    sse: bool,
    replica: String,
    errors: IntCounterVec,
) -> impl futures::Stream<Item = Result<axum::body::Bytes, std::io::Error>> + Send + 'static
where
    S: futures::Stream<Item = Result<axum::body::Bytes, String>> + Send + 'static,
{
    let chunks = Box::pin(chunks);
    futures::stream::unfold(Some(chunks), move |state| {
        let (replica, errors) = (replica.clone(), errors.clone());
        async move {
            let mut chunks = state?;
            let failure = match tokio::time::timeout(idle, chunks.next()).await {
                Ok(Some(Ok(bytes))) => return Some((Ok(bytes), Some(chunks))),
                Ok(None) => return None,
                Ok(Some(Err(e))) => {
                    errors.with_label_values(&["stream_broken"]).inc();
                    format!("replica {replica} failed while streaming: {e}")
                }
                Err(_) => {
                    errors.with_label_values(&["timeout"]).inc();
                    format!("replica {replica} sent nothing for {} s", idle.as_secs_f64())
                }
            };
            tracing::warn!(%replica, error = %failure, "cutting a response");
            if sse {
                let event = serde_json::json!({
                    "error": {"message": failure, "type": "upstream_error", "param": null, "code": "upstream_failed"}
                });
                let tail = format!("data: {event}\n\ndata: [DONE]\n\n");
                Some((Ok(axum::body::Bytes::from(tail)), None))
            } else {
                Some((Err(std::io::Error::other(failure)), None))
            }
        }
    })
}

/// Lowers a gauge when dropped.
struct GaugeGuard(IntGauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: u32) -> (Arc<Pool>, Vec<Arc<Backend>>) {
        let pool = Arc::new(Pool::default());
        let backends: Vec<_> =
            (0..n).map(|i| Backend::new(i, format!("http://127.0.0.1:{}", 9000 + i))).collect();
        for b in &backends {
            pool.add(b.clone());
        }
        (pool, backends)
    }

    /// A replica on a raw socket that answers every request with `head`, then `body`, then
    /// closes the connection or (with `hang`) keeps it open, silent.
    async fn replica(head: &'static str, body: &'static str, hang: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(body.as_bytes()).await;
                    if hang {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                });
            }
        });
        url
    }

    /// The router over one replica at `url`, on a free port; returns its base URL.
    async fn routed(url: String, timeouts: Timeouts) -> String {
        let pool = Arc::new(Pool::default());
        pool.add(Backend::new(0, url));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            axum::serve(listener, router(RouterState::with_timeouts(pool, timeouts))).await
        });
        base
    }

    const SSE_HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    const FIRST_EVENT: &str = "1a\r\ndata: {\"choices\": \"a\"}\n\n\r\n";

    async fn body_of(base: &str) -> (u16, String) {
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .body("{}")
            .send()
            .await
            .expect("the router answers");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_else(|e| format!("<broken: {e}>")))
    }

    #[tokio::test]
    async fn a_replica_that_dies_mid_stream_ends_it_with_an_error_event_and_done() {
        // One event, then the socket closes before the chunked body's end.
        let base = routed(replica(SSE_HEAD, FIRST_EVENT, false).await, Timeouts::default()).await;
        let (status, text) = body_of(&base).await;
        assert_eq!(status, 200);
        assert!(text.starts_with("data: {\"choices\": \"a\"}\n\n"), "{text}");
        assert!(
            text.contains("\"code\":\"upstream_failed\"") && text.contains("failed while streaming"),
            "{text}"
        );
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }

    #[tokio::test]
    async fn a_silent_replica_times_out_before_and_during_its_answer() {
        let short = Timeouts { answer: Duration::from_millis(500), idle: Duration::from_millis(500) };
        // No answer at all: a 504 in OpenAI's shape.
        let base = routed(replica("", "", true).await, short).await;
        let started = std::time::Instant::now();
        let (status, text) = body_of(&base).await;
        assert_eq!(status, 504, "{text}");
        assert!(text.contains("did not answer within 0.5 s"), "{text}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // A stream that starts and goes silent: cut after the idle timeout, with the end marker.
        let base = routed(replica(SSE_HEAD, FIRST_EVENT, true).await, short).await;
        let started = std::time::Instant::now();
        let (status, text) = body_of(&base).await;
        assert_eq!(status, 200);
        assert!(text.contains("sent nothing for 0.5 s") && text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn picks_the_replica_with_fewest_outstanding_requests() {
        let (pool, b) = pool(3);
        let held: Vec<InFlight> = (0..3).map(|_| pool.pick().expect("ready")).collect();
        // One each, whatever the round-robin start.
        assert!(b.iter().all(|b| b.outstanding() == 1));
        let extra = pool.pick().expect("ready");
        let busy = extra.backend().id;
        assert_eq!(extra.backend().outstanding(), 2);
        let freed = held.iter().position(|l| l.backend().id != busy).expect("another replica");
        let freed_id = held[freed].backend().id;
        let mut held = held;
        drop(held.remove(freed));
        let next = pool.pick().expect("ready");
        assert_eq!(next.backend().id, freed_id, "the idle replica is chosen");
    }

    #[test]
    fn a_lease_ends_when_dropped_and_ties_rotate() {
        let (pool, b) = pool(2);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let lease = pool.pick().expect("ready");
            seen.insert(lease.backend().id);
        }
        assert_eq!(seen.len(), 2, "idle replicas share the load");
        assert!(b.iter().all(|b| b.outstanding() == 0));
    }

    #[test]
    fn a_removed_replica_gets_no_new_requests_and_none_ready_is_none() {
        let (pool, b) = pool(2);
        let held = pool.pick().expect("ready");
        let drained = held.backend().id;
        pool.remove(drained);
        for _ in 0..5 {
            assert_ne!(pool.pick().expect("ready").backend().id, drained);
        }
        assert_eq!(b[drained as usize].outstanding(), 1, "its in-flight request still counts");
        drop(held);
        assert_eq!(b[drained as usize].outstanding(), 0);
        pool.remove(1 - drained);
        assert!(pool.pick().is_none());
    }
}
