//! [`PrometheusSource`]: the planner's metrics from a Prometheus HTTP API (Prometheus itself,
//! or anything that serves `/api/v1/query`: Thanos, Mimir, VictoriaMetrics), and the
//! `--prometheus-*` flags that configure it.
//!
//! One tick evaluates every query of [`queries::plan`] at one instant, concurrently. Any failed
//! query makes every service [`Freshness::Missing`](crate::planner::Freshness::Missing): the
//! planner holds instead of acting on a partial picture.

use super::queries::{self, Answers, Measure};
use super::{MetricsError, MetricsReading, MetricsSource, ServiceKey, WindowRequest};
use futures::future::BoxFuture;
use prometheus_http_query::Client;
use prometheus_http_query::response::Data;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The flags of the Prometheus source, for `pacer-operator run` (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct PrometheusArgs {
    /// Base URL of the Prometheus HTTP API the planner reads, e.g.
    /// `http://prometheus-operated.monitoring:9090`. Without it the planner has no metrics
    /// source: every service reads as missing metrics and nothing is changed.
    #[arg(long, env = "PACER_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// File holding a bearer token to send to Prometheus (e.g. a projected service-account
    /// token). Re-read on every evaluation, so a rotated token is picked up.
    #[arg(long, env = "PACER_PROMETHEUS_TOKEN_FILE")]
    pub prometheus_token_file: Option<PathBuf>,
    /// Send the bearer token even to an `http://` URL, where anyone on the path can read and
    /// replay it. Without this flag a token with a plain-HTTP URL is refused at start.
    #[arg(long, env = "PACER_PROMETHEUS_ALLOW_INSECURE_TOKEN")]
    pub prometheus_allow_insecure_token: bool,
    /// PEM file with the CA certificates that sign Prometheus' serving certificate; when given,
    /// only these are trusted [default: the system's trust store].
    #[arg(long, env = "PACER_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Time one query may take (`10s`, `1m`); it is also sent to Prometheus as the query timeout.
    #[arg(long, env = "PACER_PROMETHEUS_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub prometheus_timeout: Duration,
    /// Age of a service's newest sample beyond which its metrics are stale and the planner
    /// holds (a few scrape intervals).
    #[arg(long, env = "PACER_METRICS_STALENESS", default_value = "60s", value_parser = parse_duration)]
    pub metrics_staleness: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    pacer_crds::parse_duration(text)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?} is not a duration such as 10s, 2m or 1h"))
}

/// How to reach Prometheus and when its data is stale.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusConfig {
    /// Base URL of the HTTP API.
    pub url: String,
    /// Bearer token file, re-read on every tick.
    pub token_file: Option<PathBuf>,
    /// CA bundle to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// Per-query timeout.
    pub timeout: Duration,
    /// Age of the newest sample beyond which a service is stale.
    pub staleness: Duration,
    /// Whether a token may go over plain HTTP (see `--prometheus-allow-insecure-token`).
    pub allow_insecure_token: bool,
}

impl PrometheusConfig {
    /// A config for `url` with the flags' defaults (10 s timeout, 60 s staleness).
    pub fn new(url: impl Into<String>) -> PrometheusConfig {
        PrometheusConfig {
            url: url.into(),
            token_file: None,
            ca_file: None,
            timeout: Duration::from_secs(10),
            staleness: Duration::from_secs(60),
            allow_insecure_token: false,
        }
    }
}

/// Reads the planner's metrics from Prometheus with PromQL.
pub struct PrometheusSource {
    client: Client,
    config: PrometheusConfig,
}

impl std::fmt::Debug for PrometheusSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusSource").field("config", &self.config).finish_non_exhaustive()
    }
}

impl PrometheusSource {
    /// A source for `config`; fails on a malformed URL or an unreadable CA file. Nothing is
    /// sent until the first tick.
    pub fn new(config: PrometheusConfig) -> Result<PrometheusSource, MetricsError> {
        let plain_http = config.url.trim_start().to_ascii_lowercase().starts_with("http://");
        if config.token_file.is_some() && plain_http && !config.allow_insecure_token {
            return Err(MetricsError::Config(format!(
                "refusing to send the bearer token to {} over plain HTTP, where it can be read and replayed: \
                 use an https:// URL, or pass --prometheus-allow-insecure-token if the path is trusted",
                config.url
            )));
        }
        let mut builder = reqwest::Client::builder().timeout(config.timeout);
        if let Some(ca) = &config.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| MetricsError::Config(format!("reading CA file {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| MetricsError::Config(format!("CA file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(MetricsError::Config(format!("CA file {} holds no certificate", ca.display())));
            }
            builder = builder.tls_certs_only(certs);
        }
        let http = builder.build().map_err(|e| MetricsError::Config(e.to_string()))?;
        let client = Client::from(http, &config.url)
            .map_err(|e| MetricsError::Config(format!("Prometheus URL {:?}: {e}", config.url)))?;
        Ok(PrometheusSource { client, config })
    }

    /// The source the flags describe; `None` when no `--prometheus-url` was given.
    pub fn from_args(args: &PrometheusArgs) -> Result<Option<PrometheusSource>, MetricsError> {
        let PrometheusArgs {
            prometheus_url,
            prometheus_token_file,
            prometheus_allow_insecure_token,
            prometheus_ca_file,
            prometheus_timeout,
            metrics_staleness,
        } = args;
        let Some(url) = prometheus_url else { return Ok(None) };
        PrometheusSource::new(PrometheusConfig {
            url: url.clone(),
            token_file: prometheus_token_file.clone(),
            ca_file: prometheus_ca_file.clone(),
            timeout: *prometheus_timeout,
            staleness: *metrics_staleness,
            allow_insecure_token: *prometheus_allow_insecure_token,
        })
        .map(Some)
    }

    /// The configuration in force.
    pub fn config(&self) -> &PrometheusConfig {
        &self.config
    }

    /// Observes `requests` with every query evaluated at `at` (unix seconds).
    pub async fn observe_at(&self, requests: &[WindowRequest], at: f64) -> MetricsReading {
        match self.answers(requests, at).await {
            Ok(answers) => MetricsReading {
                at,
                services: queries::assemble(requests, &answers, at, self.config.staleness.as_secs_f64()),
                error: None,
            },
            Err(error) => {
                let reason = format!("metrics source failed: {error}");
                MetricsReading { at, services: queries::all_missing(requests, &reason), error: Some(error) }
            }
        }
    }

    async fn answers(&self, requests: &[WindowRequest], at: f64) -> Result<Answers, MetricsError> {
        let token = self.token().await?;
        let plan = queries::plan(requests);
        let results = futures::future::join_all(
            plan.iter().map(|query| self.by_service(&query.promql, at, token.as_deref())),
        )
        .await;
        let mut answers: Answers = BTreeMap::new();
        for (query, result) in plan.iter().zip(results) {
            let measure: Measure = query.measure;
            answers.insert(measure, result?);
        }
        Ok(answers)
    }

    /// The bearer token, read afresh (a rotated token takes effect at the next tick).
    async fn token(&self) -> Result<Option<String>, MetricsError> {
        let Some(path) = &self.config.token_file else { return Ok(None) };
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|source| MetricsError::Token { path: path.display().to_string(), source })?;
        Ok(Some(text.trim().to_string()))
    }

    /// Evaluates `promql` at `at` and keys each series of the answer by its `namespace` and
    /// `inferenceservice` labels (series without them are not a service's, and are skipped).
    pub async fn by_service(
        &self,
        promql: &str,
        at: f64,
        token: Option<&str>,
    ) -> Result<BTreeMap<ServiceKey, f64>, MetricsError> {
        let mut query = self
            .client
            .query(promql)
            .query("time", format!("{at:.3}"))
            .timeout(i64::try_from(self.config.timeout.as_millis()).unwrap_or(i64::MAX));
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| MetricsError::Config("the bearer token is not a valid header value".into()))?;
            value.set_sensitive(true);
            query = query.header(reqwest::header::AUTHORIZATION, value);
        }
        let result =
            query.get().await.map_err(|source| MetricsError::Query { query: promql.to_string(), source })?;
        let vector = match result.data() {
            Data::Vector(v) => v,
            Data::Matrix(_) => {
                return Err(MetricsError::UnexpectedResult {
                    query: promql.to_string(),
                    kind: "range vector",
                });
            }
            Data::Scalar(_) => {
                return Err(MetricsError::UnexpectedResult { query: promql.to_string(), kind: "scalar" });
            }
        };
        Ok(vector
            .iter()
            .filter_map(|series| {
                let labels = series.metric();
                let key = ServiceKey::new(labels.get("namespace")?, labels.get("inferenceservice")?);
                Some((key, series.sample().value()))
            })
            .collect())
    }
}

impl MetricsSource for PrometheusSource {
    fn observe<'a>(&'a self, requests: &'a [WindowRequest]) -> BoxFuture<'a, MetricsReading> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        Box::pin(self.observe_at(requests, now))
    }

    fn describe(&self) -> String {
        format!("Prometheus at {}", self.config.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A loopback port nothing listens on (bound, then released).
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        prometheus: PrometheusArgs,
    }

    #[test]
    fn flags_parse_with_defaults_and_build_a_source() {
        let cli = Cli::try_parse_from(["x"]).expect("no flags");
        assert_eq!(cli.prometheus.prometheus_url, None);
        assert_eq!(cli.prometheus.prometheus_timeout, Duration::from_secs(10));
        assert_eq!(cli.prometheus.metrics_staleness, Duration::from_secs(60));
        assert!(PrometheusSource::from_args(&cli.prometheus).expect("no source").is_none());

        let cli = Cli::try_parse_from([
            "x",
            "--prometheus-url=http://prometheus.monitoring:9090",
            "--prometheus-timeout=2s",
            "--metrics-staleness=1m",
        ])
        .expect("flags");
        let source = PrometheusSource::from_args(&cli.prometheus).expect("source").expect("configured");
        assert_eq!(source.config().timeout, Duration::from_secs(2));
        assert_eq!(source.config().staleness, Duration::from_secs(60));
        assert_eq!(source.describe(), "Prometheus at http://prometheus.monitoring:9090");

        assert!(Cli::try_parse_from(["x", "--prometheus-timeout=soon"]).is_err());
        assert!(Cli::try_parse_from(["x", "--metrics-staleness=0s"]).is_err());
    }

    #[test]
    fn a_bad_ca_file_or_url_is_a_config_error() {
        let mut config = PrometheusConfig::new("http://127.0.0.1:9");
        config.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        let err = PrometheusSource::new(config).expect_err("unreadable CA");
        assert_eq!(err.metric_label(), "config");
        let err = PrometheusSource::new(PrometheusConfig::new("not a url")).expect_err("bad URL");
        assert_eq!(err.metric_label(), "config");
    }

    #[tokio::test]
    async fn an_unreachable_prometheus_leaves_every_service_missing() {
        let mut config = PrometheusConfig::new(format!("http://127.0.0.1:{}", closed_port()));
        config.timeout = Duration::from_secs(2);
        let source = PrometheusSource::new(config).expect("source");
        let requests = [WindowRequest {
            service: ServiceKey::new("ns", "svc"),
            quantile: 0.95,
            window: 300.0,
            rate_window: 60.0,
        }];
        let seen = source.observe(&requests).await;
        assert_eq!(seen.error.as_ref().map(MetricsError::metric_label), Some("unreachable"));
        assert!(matches!(
            &seen.services[&requests[0].service].0,
            crate::planner::Freshness::Missing { reason } if reason.contains("metrics source failed")
        ));
    }

    /// A Prometheus API on loopback that answers every query with `status` and `body`.
    async fn answering(status: u16, body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback(move || async move {
            let status = http::StatusCode::from_u16(status).expect("status");
            (status, [(http::header::CONTENT_TYPE, "application/json")], body)
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    #[tokio::test]
    async fn broken_answers_are_errors_and_leave_every_service_missing() {
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"namespace":"ns","inferenceservice":"svc"},"values":[[1000,"5"]]}]}}"#;
        let huge = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"namespace":"ns","inferenceservice":"svc"},"value":[1000,"1e300"]}]}}"#;
        let requests = [WindowRequest {
            service: ServiceKey::new("ns", "svc"),
            quantile: 0.95,
            window: 300.0,
            rate_window: 60.0,
        }];
        for (status, body, what) in [
            (503, r#"{"status":"error","errorType":"unavailable","error":"overloaded"}"#, "a 5xx"),
            (500, "<html>upstream proxy error</html>", "a 5xx page"),
            (200, r#"{"status":"success","data":{"resultType":"vector","result":[{"#, "malformed JSON"),
            (200, "not json at all", "not JSON"),
            (200, matrix, "a matrix where a vector is expected"),
            (200, huge, "a huge value in every answer"),
        ] {
            let source =
                PrometheusSource::new(PrometheusConfig::new(answering(status, body).await)).expect("source");
            let seen = source.observe_at(&requests, 1000.0).await;
            let (freshness, metrics) = &seen.services[&requests[0].service];
            assert!(matches!(freshness, crate::planner::Freshness::Missing { .. }), "{what}: {freshness:?}");
            assert_eq!(*metrics, crate::metrics_source::ServiceMetrics::missing(), "{what}");
            if what != "a huge value in every answer" {
                assert!(seen.error.is_some(), "{what}: no error reported");
            }
        }
    }

    #[test]
    fn a_token_is_never_sent_over_plain_http_unless_allowed() {
        let mut config = PrometheusConfig::new("http://prometheus.monitoring:9090");
        config.token_file = Some(PathBuf::from("/var/run/secrets/pacer/prometheus/token"));
        let refused = PrometheusSource::new(config.clone()).expect_err("a token over http");
        assert!(refused.to_string().contains("over plain HTTP"), "{refused}");
        assert!(refused.to_string().contains("--prometheus-allow-insecure-token"), "{refused}");
        let mut upper = config.clone();
        upper.url = "HTTP://prometheus.monitoring:9090".into();
        assert!(PrometheusSource::new(upper).is_err(), "the scheme is case-insensitive");
        let mut allowed = config.clone();
        allowed.allow_insecure_token = true;
        assert!(PrometheusSource::new(allowed).is_ok());
        let mut tls = config.clone();
        tls.url = "https://prometheus.monitoring:9090".into();
        assert!(PrometheusSource::new(tls).is_ok());
        // Without a token, plain HTTP sends nothing secret.
        assert!(PrometheusSource::new(PrometheusConfig::new("http://prometheus:9090")).is_ok());
    }

    #[tokio::test]
    async fn an_unreadable_token_file_is_a_token_error() {
        let mut config = PrometheusConfig::new("http://127.0.0.1:9");
        config.token_file = Some(PathBuf::from("/nonexistent/token"));
        config.allow_insecure_token = true;
        let source = PrometheusSource::new(config).expect("source");
        let requests = [WindowRequest {
            service: ServiceKey::new("ns", "a"),
            quantile: 0.9,
            window: 60.0,
            rate_window: 60.0,
        }];
        let seen = source.observe(&requests).await;
        assert_eq!(seen.error.as_ref().map(MetricsError::metric_label), Some("token"));
        assert_eq!(seen.services.len(), 1);
    }
}
