//! Local mode's router: one loopback port in front of the engine replicas. It passes every
//! request through unchanged (OpenAI-compatible, SSE streamed chunk by chunk, bodies never
//! buffered) to the ready replica with the fewest outstanding requests, answers 503 with an
//! OpenAI error body when none is ready, and serves its own `/metrics` and `/health`.
//!
//! A draining replica is taken out of the choice at once; its outstanding count tells the
//! supervisor when it may be stopped.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    pub fn pick(&self) -> Option<Lease> {
        self.pick_except(&[])
    }

    /// [`Pool::pick`] among the replicas not in `tried`.
    pub fn pick_except(&self, tried: &[u32]) -> Option<Lease> {
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
        Some(Lease { backend: chosen })
    }
}

/// A request's hold on a replica: lowers its outstanding count when dropped, which is when the
/// response body has been streamed to the end (or the client went away).
#[derive(Debug)]
pub struct Lease {
    backend: Arc<Backend>,
}

impl Lease {
    /// The replica.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for Lease {
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
            Opts::new("pacer_router_requests_total", "Requests passed to a replica, by replica and status."),
            &["replica", "status"],
        )
        .expect("valid metric");
        let outstanding = IntGaugeVec::new(
            Opts::new("pacer_router_outstanding_requests", "Requests in flight, by replica."),
            &["replica"],
        )
        .expect("valid metric");
        let unavailable = IntCounterVec::new(
            Opts::new(
                "pacer_router_errors_total",
                "Requests the router answered itself: no_ready_replica (503) or upstream (502).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let ready = IntGauge::new("pacer_router_ready_replicas", "Replicas requests may go to.")
            .expect("valid metric");
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

/// What the router's handlers share.
#[derive(Clone)]
pub struct RouterState {
    /// The replicas.
    pub pool: Arc<Pool>,
    client: reqwest::Client,
    metrics: RouterMetrics,
}

impl RouterState {
    /// A router over `pool`.
    pub fn new(pool: Arc<Pool>) -> RouterState {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        RouterState { pool, client, metrics: RouterMetrics::new() }
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
    let mut tried = Vec::new();
    let (lease, gauge, answer) = loop {
        let Some(lease) = state.pool.pick_except(&tried) else {
            state.metrics.unavailable.with_label_values(&["no_ready_replica"]).inc();
            let mut response = openai_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "no engine replica is ready yet; retry shortly",
            );
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return response;
        };
        let replica = lease.backend().id.to_string();
        let gauge = state.metrics.outstanding.with_label_values(&[&replica]);
        gauge.inc();
        let mut upstream =
            state.client.request(parts.method.clone(), format!("{}{}", lease.backend().base_url, path));
        for (name, value) in end_to_end(&parts.headers) {
            upstream = upstream.header(name, value);
        }
        match upstream.body(body.clone()).send().await {
            Ok(answer) => break (lease, gauge, answer),
            Err(e) => {
                gauge.dec();
                tracing::warn!(replica = %replica, error = %e, "a replica did not answer");
                // Not connected: the replica never saw the request, so another may take it.
                if e.is_connect() {
                    tried.push(lease.backend().id);
                    continue;
                }
                state.metrics.unavailable.with_label_values(&["upstream"]).inc();
                return openai_error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    &format!("replica {replica}: {e}"),
                );
            }
        }
    };
    let replica = lease.backend().id.to_string();
    let status = answer.status();
    state.metrics.requests.with_label_values(&[&replica, status.as_str()]).inc();
    let mut response = Response::builder().status(status.as_u16());
    for (name, value) in end_to_end(answer.headers()) {
        response = response.header(name, value);
    }
    // The lease and the gauge live as long as the body stream: the replica counts as busy
    // until the last SSE chunk has gone out.
    let guard = (lease, GaugeGuard(gauge));
    let stream = answer.bytes_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| openai_error(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", &e.to_string()))
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

    #[test]
    fn picks_the_replica_with_fewest_outstanding_requests() {
        let (pool, b) = pool(3);
        let held: Vec<Lease> = (0..3).map(|_| pool.pick().expect("ready")).collect();
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
