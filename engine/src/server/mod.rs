//! `pacer-engine serve`: the OpenAI-compatible HTTP server (axum) in front of the
//! continuous-batching scheduler, with Prometheus metrics, health and readiness, live batch
//! settings, and a graceful drain on SIGTERM.

mod error;
mod logprobs;
mod openai;
mod prepare;
mod routes;

pub use error::ApiError;

use crate::LoadedModel;
use crate::metrics::EngineMetrics;
use crate::scheduler::{self, BatchSettings, SchedulerHandle};
use axum::Router;
use axum::routing::{get, post};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Everything `serve` needs besides the model.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Name clients use in `model`.
    pub served_name: String,
    /// Bearer token required on the API routes, if set.
    pub api_key: Option<String>,
    /// Initial batch settings.
    pub settings: BatchSettings,
    /// File to watch for batch settings.
    pub settings_file: Option<PathBuf>,
    /// Waiting requests beyond which new ones get 429.
    pub max_waiting: usize,
    /// KV-cache capacity in tokens.
    pub kv_cache_tokens: usize,
    /// Reuse the KV blocks of prompt prefixes earlier requests computed.
    pub prefix_caching: bool,
    /// Longest wait for in-flight requests on SIGTERM.
    pub drain_timeout: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Longest wait for a request's headers on a connection (a client that never finishes
    /// them has its connection closed).
    pub header_timeout: Duration,
    /// Longest wait for a request's body once its headers arrived (408 after).
    pub body_timeout: Duration,
    /// Most connections open at once; more are closed as they arrive.
    pub max_connections: usize,
    /// Log prompt token ids (off by default: prompts may hold personal data).
    pub log_prompts: bool,
    /// Most request-body bytes buffered at once across all connections: a body that would
    /// pass it gets a 503 with `Retry-After` instead of memory.
    pub max_buffered_bytes: usize,
    /// A forward step running longer than this makes `/health` fail (a hung device).
    pub stall_timeout: Duration,
}

/// Shared by all handlers.
#[derive(Debug)]
pub struct AppState {
    model: Arc<LoadedModel>,
    scheduler: SchedulerHandle,
    metrics: EngineMetrics,
    served_name: String,
    api_key: Option<String>,
    log_prompts: bool,
    started: u64,
    ids: AtomicU64,
    /// Turns true at the drain deadline: responses still open end then.
    closing: tokio::sync::watch::Receiver<bool>,
    /// Requests being parsed and tokenized off the runtime (see [`PREPARING`]).
    preparing: tokio::sync::Semaphore,
    /// Long bodies being prepared (see [`LONG_BODY_BYTES`]).
    preparing_long: tokio::sync::Semaphore,
    /// See [`ServeConfig::max_body_bytes`].
    max_body_bytes: usize,
    /// See [`ServeConfig::body_timeout`].
    body_timeout: Duration,
    /// The KV cache's capacity in tokens (`kv_cache_tokens` rounded up to whole blocks).
    kv_tokens: usize,
    /// Request-body bytes that may still be buffered, in KiB (see
    /// [`ServeConfig::max_buffered_bytes`]).
    buffered: Arc<tokio::sync::Semaphore>,
    /// See [`ServeConfig::stall_timeout`].
    stall_timeout: Duration,
}

/// `bytes` in whole KiB, the unit of [`AppState::buffered`] (a semaphore counts at most
/// `u32::MAX` permits per acquire).
fn buffer_kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).clamp(1, u32::MAX as usize)
}

/// How many requests are parsed and tokenized at once, on the blocking pool: enough to overlap
/// a long prompt with short ones, few enough that a burst of long prompts cannot take every
/// core from the model.
pub const PREPARING: usize = 2;

/// A body over this many bytes is prepared in the long lane: one at a time, so long texts
/// hold at most one of the [`PREPARING`] slots.
pub const LONG_BODY_BYTES: usize = 64 * 1024;

impl AppState {
    fn next_id(&self, chat: bool) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let prefix = if chat { "chatcmpl" } else { "cmpl" };
        format!("{prefix}-{:x}{n:06x}", self.started)
    }
}

/// A running server: its router and the handle used to drain it.
#[derive(Debug, Clone)]
pub struct Server {
    /// The axum router with every route.
    pub router: Router,
    /// The scheduler behind it.
    pub scheduler: SchedulerHandle,
    /// Set at the drain deadline (see [`serve`]).
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// See [`ServeConfig::header_timeout`].
    header_timeout: Duration,
    /// See [`ServeConfig::max_connections`].
    max_connections: usize,
    /// `/health`, `/ready` and `/metrics` alone, for the probe port (see [`serve_with_probes`]).
    probes: Router,
}

/// The settings to start with: the settings file's, over the command line's, when the file
/// exists and is valid. A new pod thus starts with the live settings (the operator passes batch
/// settings only through that file), not with the defaults until the first poll.
fn initial_settings(config: &ServeConfig) -> BatchSettings {
    let Some(path) = &config.settings_file else { return config.settings };
    match std::fs::read_to_string(path) {
        Ok(text) => BatchSettings::parse_over(config.settings, &text).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "ignoring invalid settings file at start");
            config.settings
        }),
        Err(_) => config.settings,
    }
}

/// Starts the scheduler for `model` and builds the router. The settings-file watcher, if
/// configured, runs on the current tokio runtime.
pub fn build(model: Arc<LoadedModel>, config: &ServeConfig) -> std::io::Result<Server> {
    config.settings.validate().map_err(std::io::Error::other)?;
    let settings = initial_settings(config);
    let metrics = EngineMetrics::new(&config.served_name);
    let scheduler = scheduler::start(
        model.clone(),
        settings,
        config.kv_cache_tokens,
        config.prefix_caching,
        config.max_waiting,
        metrics.clone(),
    )?;
    if let Some(path) = &config.settings_file {
        tokio::spawn(scheduler::watch_settings_file(
            path.clone(),
            settings,
            scheduler.clone(),
            Duration::from_millis(500),
        ));
    }
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(AppState {
        model,
        scheduler: scheduler.clone(),
        metrics,
        served_name: config.served_name.clone(),
        api_key: config.api_key.clone(),
        log_prompts: config.log_prompts,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ids: AtomicU64::new(0),
        closing: closing_rx,
        preparing: tokio::sync::Semaphore::new(PREPARING),
        preparing_long: tokio::sync::Semaphore::new(1),
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        kv_tokens: config.kv_cache_tokens.div_ceil(crate::model::BLOCK_TOKENS).max(1)
            * crate::model::BLOCK_TOKENS,
        buffered: Arc::new(tokio::sync::Semaphore::new(buffer_kib(config.max_buffered_bytes))),
        stall_timeout: config.stall_timeout,
    });
    let probes = Router::new()
        .route("/health", get(routes::health))
        .route("/ready", get(routes::ready))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .layer(axum::middleware::from_fn(routes::openai_errors))
        .with_state(state.clone());
    let router = Router::new()
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/models", get(routes::models))
        .route("/health", get(routes::health))
        .route("/ready", get(routes::ready))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        // A panic in a handler becomes a 500 for that request, not a dead server.
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        // Errors the HTTP layer makes itself (a body over the limit, a panic) get OpenAI's body.
        .layer(axum::middleware::from_fn(routes::openai_errors))
        .with_state(state);
    Ok(Server {
        router,
        scheduler,
        closing: Arc::new(closing),
        header_timeout: config.header_timeout,
        max_connections: config.max_connections.max(1),
        probes,
    })
}

/// Most connections open at once on the probe port: the kubelet's probes and a scrape or two
/// need a handful; the limit keeps a flood there from costing descriptors.
pub const PROBE_CONNECTIONS: usize = 32;

/// How long connections get, after the drain deadline, to flush the final events of the
/// responses cut there before the server returns and drops them.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Serves on `listener` until `shutdown` resolves, then drains: readiness goes false and new
/// requests get 503 at once, in-flight requests finish for at most `drain_timeout`. At that
/// deadline every response still open ends (a stream with an error event and `[DONE]`, a
/// waiting non-streamed request with a 503), connections are asked to close, and
/// [`CLOSE_GRACE`] later the function returns, dropping whatever connections are still open,
/// idle or half-sent: the process exits within `drain_timeout` plus about a second of the
/// signal.
///
/// While serving, a connection that does not finish a request's headers within
/// `header_timeout` is closed, and connections beyond `max_connections` are closed as they
/// arrive, so slow or hostile clients cannot pile up descriptors.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Server,
    drain_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_probes(listener, None, server, drain_timeout, shutdown).await
}

/// As [`serve`], and `/health`, `/ready` and `/metrics` also on `probes`, with a connection
/// limit of their own ([`PROBE_CONNECTIONS`]): a flood of connections to the API port then
/// neither fails the kubelet's probes (the pod is not restarted under attack) nor the scrapes
/// the planner reads. The probe port answers until the API port's drain ends.
pub async fn serve_with_probes(
    listener: tokio::net::TcpListener,
    probes: Option<tokio::net::TcpListener>,
    server: Server,
    drain_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let scheduler = server.scheduler.clone();
    let closing = server.closing.clone();
    let drained = async move {
        shutdown.await;
        scheduler.start_draining();
        let started = Instant::now();
        tracing::info!(
            waiting = scheduler.shared().waiting(),
            running = scheduler.shared().running(),
            "draining: no new requests; waiting for in-flight ones"
        );
        while scheduler.shared().waiting() + scheduler.shared().running() > 0
            && started.elapsed() < drain_timeout
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = scheduler.shared().waiting() + scheduler.shared().running();
        if left > 0 {
            tracing::warn!(left, "drain timeout reached; ending the responses still in flight");
        } else {
            tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "drained");
        }
        let _ = closing.send(true);
    };
    tokio::pin!(drained);
    let connections = Arc::new(tokio::sync::Semaphore::new(server.max_connections));
    // Tells every connection to finish its current response and close.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let probe_task = probes.map(|probes| {
        tokio::spawn(serve_probes(probes, server.probes.clone(), server.header_timeout, stop_rx.clone()))
    });
    loop {
        let accepted = tokio::select! {
            () = &mut drained => break,
            accepted = listener.accept() => accepted,
        };
        let Some((stream, peer, permit)) = admit(accepted, &connections, server.max_connections, "API").await
        else {
            continue;
        };
        tasks.spawn(connection(
            stream,
            peer,
            permit,
            server.router.clone(),
            server.header_timeout,
            stop_rx.clone(),
        ));
        // Reap finished connections so the set does not grow with the server's age.
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    if let Some(task) = probe_task {
        task.abort();
    }
    if tokio::time::timeout(CLOSE_GRACE, async { while tasks.join_next().await.is_some() {} }).await.is_err()
    {
        tracing::info!(open = tasks.len(), "closing the connections still open after the drain");
    }
    tasks.shutdown().await;
    Ok(())
}

/// Serves one accepted connection with `router` until it ends, or until `stop` turns true
/// (then it finishes its current response and closes); holds `permit` meanwhile.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
    router: Router,
    header_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let _permit = permit;
    let service = hyper_util::service::TowerToHyperService::new(router);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service).with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        () = async { let _ = stop.wait_for(|s| *s).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// An accepted connection with its slot of `connections` (`limit` of them), or `None` when
/// there is nothing to serve: an accept that failed (out of descriptors, a connection reset
/// while queued), after a short pause; or a connection over the limit, closed at once.
async fn admit(
    accepted: std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>,
    connections: &Arc<tokio::sync::Semaphore>,
    limit: usize,
    port: &'static str,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    let (stream, peer) = match accepted {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(port, error = %e, "accepting a connection failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            return None;
        }
    };
    let Ok(permit) = connections.clone().try_acquire_owned() else {
        tracing::warn!(port, %peer, limit, "connection limit reached; closing a new connection");
        return None;
    };
    Some((stream, peer, permit))
}

/// The probe port's accept loop (see [`serve_with_probes`]), until `stop` turns true.
async fn serve_probes(
    listener: tokio::net::TcpListener,
    router: Router,
    header_timeout: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(PROBE_CONNECTIONS));
    let mut tasks = tokio::task::JoinSet::new();
    let mut stopped = stop.clone();
    loop {
        let accepted = tokio::select! {
            _ = stopped.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let Some((stream, peer, permit)) = admit(accepted, &connections, PROBE_CONNECTIONS, "probe").await
        else {
            continue;
        };
        tasks.spawn(connection(stream, peer, permit, router.clone(), header_timeout, stop.clone()));
        while tasks.try_join_next().is_some() {}
    }
    tasks.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(settings_file: Option<PathBuf>) -> ServeConfig {
        ServeConfig {
            served_name: "m".into(),
            api_key: None,
            settings: BatchSettings::default(),
            settings_file,
            max_waiting: 1,
            kv_cache_tokens: 16,
            prefix_caching: true,
            drain_timeout: Duration::from_secs(1),
            max_body_bytes: 1,
            header_timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(1),
            max_connections: 1,
            log_prompts: false,
            max_buffered_bytes: 1,
            stall_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_new_engine_starts_with_the_settings_file() {
        let dir = std::env::temp_dir().join(format!("pacer-initial-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("settings.json");
        std::fs::write(&file, r#"{"max_batch_size": 5, "batch_wait_ms": 7}"#).expect("write");
        let s = initial_settings(&config(Some(file.clone())));
        assert_eq!((s.max_batch_size, s.batch_wait_ms), (5, 7));
        // An invalid or missing file leaves the command line's settings.
        std::fs::write(&file, r#"{"max_batch_size": 0}"#).expect("write");
        assert_eq!(initial_settings(&config(Some(file.clone()))), BatchSettings::default());
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(initial_settings(&config(Some(file))), BatchSettings::default());
        assert_eq!(initial_settings(&config(None)), BatchSettings::default());
    }
}
