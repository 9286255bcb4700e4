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
//! `docs/metrics.md`), so the same queries hold for pods of a real vLLM: only the
//! `serving.pacer.dev/inferenceservice` pod label, relabelled to `inferenceservice`, is needed.

pub use pacer_planner::histogram;
pub mod prometheus;
pub mod queries;

pub use prometheus::{PrometheusArgs, PrometheusConfig, PrometheusSource};

pub use crate::planner::observation::{ServiceKey, WindowRequest};
use crate::planner::{Freshness, ServiceMetrics};
use futures::future::BoxFuture;
use std::collections::BTreeMap;

/// What one tick observed.
#[derive(Debug)]
pub struct MetricsReading {
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
    /// [`MetricsReading::error`] with every service [`Freshness::Missing`].
    fn observe<'a>(&'a self, requests: &'a [WindowRequest]) -> BoxFuture<'a, MetricsReading>;

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
