//! Where the planner's observations come from: per InferenceService windowed percentiles,
//! rates and scheduler state, with their freshness, read from the engines' metrics.
//!
//! - [`MetricsSource`]: the boundary the planner's driver calls once per tick.
//! - [`prometheus`]: [`PrometheusSource`], PromQL over Prometheus' HTTP API, and its flags.
//! - [`queries`]: the PromQL and the mapping of answers to [`ServiceMetrics`] (pure).
//! - [`histogram`]: text exposition parsing and `histogram_quantile` from bucket deltas (pure),
//!   for local mode's scraper and for tests.
//!
//! The engine's metric names are vLLM's (`vllm:time_to_first_token_seconds`, ...; see
//! `METRICS.md`), so the same queries hold for pods of a real vLLM: only the
//! `serving.pacer.dev/inferenceservice` pod label, relabelled to `inferenceservice`, is needed.

pub use pacer_planner::histogram;
pub mod prometheus;
pub mod queries;

pub use prometheus::{PrometheusArgs, PrometheusConfig, PrometheusSource};

use crate::planner::{Freshness, ServiceMetrics};
use futures::future::BoxFuture;
use std::collections::BTreeMap;

/// An InferenceService, as the `namespace` and `inferenceservice` labels of its series name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceKey {
    /// The service `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one service needs observed: its SLA percentile over its SLA window, and rates over a
/// rate window. Services that share these values share queries.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRequest {
    /// The service.
    pub service: ServiceKey,
    /// The SLA percentile as a quantile, 0..1 (0.95 for P95).
    pub quantile: f64,
    /// The SLA window percentiles and sample counts are computed over, seconds.
    pub window: f64,
    /// The window request and token rates are computed over, seconds.
    pub rate_window: f64,
}

/// What one tick observed.
#[derive(Debug)]
pub struct Observations {
    /// When the metrics were evaluated, unix seconds.
    pub at: f64,
    /// Every requested service: its freshness and metrics. A service the source has no series
    /// for, or every service when the source failed, is [`Freshness::Missing`], so the planner
    /// holds rather than acting on zeros.
    pub services: BTreeMap<ServiceKey, (Freshness, ServiceMetrics)>,
    /// Why the source failed this tick, if it did (to log and count by
    /// [`MetricsError::metric_label`]).
    pub error: Option<MetricsError>,
}

/// A metrics source. Object-safe, so the operator can hold an `Arc<dyn MetricsSource>`.
pub trait MetricsSource: Send + Sync {
    /// Observes every requested service. Never fails as a whole: a failure is reported in
    /// [`Observations::error`] with every service [`Freshness::Missing`].
    fn observe<'a>(&'a self, requests: &'a [WindowRequest]) -> BoxFuture<'a, Observations>;

    /// Names the source for logs and conditions (`prometheus at https://...`).
    fn describe(&self) -> String;
}

/// Why observing failed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A query could not be sent or its answer not read (Prometheus down, timeout, TLS).
    #[error("querying Prometheus ({query}): {source}")]
    Query {
        /// The PromQL.
        query: String,
        /// The client's error.
        #[source]
        source: prometheus_http_query::Error,
    },
    /// Prometheus answered, but not with an instant vector.
    #[error("Prometheus answered {query} with a {kind}, not an instant vector")]
    UnexpectedResult {
        /// The PromQL.
        query: String,
        /// What it answered with.
        kind: &'static str,
    },
    /// The bearer token file could not be read.
    #[error("reading the Prometheus bearer token {path}: {source}")]
    Token {
        /// The file.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The source could not be set up (bad URL, unreadable CA file, invalid token).
    #[error("Prometheus client: {0}")]
    Config(String),
}

impl MetricsError {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            MetricsError::Query { source: prometheus_http_query::Error::Prometheus(_), .. } => "promql",
            MetricsError::Query { .. } => "unreachable",
            MetricsError::UnexpectedResult { .. } => "unexpected_result",
            MetricsError::Token { .. } => "token",
            MetricsError::Config(_) => "config",
        }
    }
}
