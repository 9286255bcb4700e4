//! The operator's own metrics and its HTTP endpoints: `/metrics` (Prometheus text), `/healthz`
//! (the process serves) and `/readyz` (caches synced and either leading or standing by).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use kube::ResourceExt;
use pacer_crds::InferenceService;
use pacer_engine_api::metrics as names;
use pacer_planner::{Decision, Quantile, ServiceMetrics, SlaState};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Counters and histograms of reconciles, writes and leadership.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by result (`ok`, `error`, `invalid_spec`).
    pub reconciles: IntCounterVec,
    /// Reconcile errors by [`crate::Error::metric_label`].
    pub errors: IntCounterVec,
    /// Reconcile duration.
    pub duration: Histogram,
    /// Writes (server-side applies and status patches) by kind.
    pub writes: IntCounterVec,
    /// Requests to the API server by HTTP method (`WATCH` for watches) and resource.
    pub api_requests: IntCounterVec,
    /// 1 while this replica holds the leader Lease.
    pub leader: IntGauge,
    /// Planner decisions that moved (or recommended moving) a lever, by lever, direction, reason.
    pub decisions: IntCounterVec,
    /// Per InferenceService: 1 when the SLA is met, 0 when violated, -1 when unknown.
    pub sla_met: GaugeVec,
    /// Per InferenceService and dimension (`ttft`, `itl`, `e2e`): the observed percentile, seconds.
    pub observed: GaugeVec,
    /// Failed ticks of the metrics source, by error kind.
    pub observe_errors: IntCounterVec,
    /// Per InferenceService and dimension: the spec's SLA target, seconds (for dashboards).
    pub sla_target: GaugeVec,
    /// Per InferenceService: 1 while the planner is out of levers (`ScalingLimited=True`).
    pub scaling_limited: GaugeVec,
    /// Per InferenceService: 1 while it runs below its preferred tier (`Degraded=True`).
    pub below_preferred_tier: GaugeVec,
    /// Whether the process is ready (see the module docs).
    pub ready: AtomicBool,
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let reconciles =
            IntCounterVec::new(Opts::new(names::RECONCILES.name, names::RECONCILES.help), &["result"])
                .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new(names::RECONCILE_ERRORS.name, names::RECONCILE_ERRORS.help),
            &["kind"],
        )
        .expect("valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new(names::RECONCILE_DURATION.name, names::RECONCILE_DURATION.help).buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let writes = IntCounterVec::new(Opts::new(names::WRITES.name, names::WRITES.help), &["kind"])
            .expect("valid metric");
        let api_requests = IntCounterVec::new(
            Opts::new(names::API_REQUESTS.name, names::API_REQUESTS.help),
            &["method", "resource"],
        )
        .expect("valid metric");
        let leader = IntGauge::new(names::LEADER.name, names::LEADER.help).expect("valid metric");
        let decisions = IntCounterVec::new(
            Opts::new(names::DECISIONS.name, names::DECISIONS.help),
            &["lever", "direction", "reason"],
        )
        .expect("valid metric");
        let sla_met = GaugeVec::new(
            Opts::new(names::SLA_MET.name, names::SLA_MET.help),
            &["namespace", "inferenceservice"],
        )
        .expect("valid metric");
        let observed = GaugeVec::new(
            Opts::new(names::OBSERVED_LATENCY.name, names::OBSERVED_LATENCY.help),
            &["namespace", "inferenceservice", "dimension"],
        )
        .expect("valid metric");
        let observe_errors = IntCounterVec::new(
            Opts::new(names::METRICS_SOURCE_ERRORS.name, names::METRICS_SOURCE_ERRORS.help),
            &["kind"],
        )
        .expect("valid metric");
        let sla_target = GaugeVec::new(
            Opts::new(names::SLA_TARGET.name, names::SLA_TARGET.help),
            &["namespace", "inferenceservice", "dimension"],
        )
        .expect("valid metric");
        let scaling_limited = GaugeVec::new(
            Opts::new(names::SCALING_LIMITED.name, names::SCALING_LIMITED.help),
            &["namespace", "inferenceservice"],
        )
        .expect("valid metric");
        let below_preferred_tier = GaugeVec::new(
            Opts::new(names::BELOW_PREFERRED_TIER.name, names::BELOW_PREFERRED_TIER.help),
            &["namespace", "inferenceservice"],
        )
        .expect("valid metric");
        let register =
            |c: Box<dyn prometheus::core::Collector>| registry.register(c).expect("unique metric names");
        register(Box::new(reconciles.clone()));
        register(Box::new(errors.clone()));
        register(Box::new(duration.clone()));
        register(Box::new(writes.clone()));
        register(Box::new(api_requests.clone()));
        register(Box::new(leader.clone()));
        register(Box::new(decisions.clone()));
        register(Box::new(sla_met.clone()));
        register(Box::new(observed.clone()));
        register(Box::new(observe_errors.clone()));
        register(Box::new(sla_target.clone()));
        register(Box::new(scaling_limited.clone()));
        register(Box::new(below_preferred_tier.clone()));
        Arc::new(Metrics {
            registry,
            reconciles,
            errors,
            duration,
            writes,
            api_requests,
            leader,
            decisions,
            sla_met,
            observed,
            observe_errors,
            sla_target,
            scaling_limited,
            below_preferred_tier,
            ready: AtomicBool::new(false),
        })
    }

    /// Records one evaluation of `isvc`: its SLA state, its levers' limits, its targets and the
    /// percentiles the planner observed (no series where it observed none, rather than a stale
    /// value that looks current).
    pub fn record_evaluation(&self, isvc: &InferenceService, d: &Decision, observed: &ServiceMetrics) {
        let (ns, name) = (isvc.namespace().unwrap_or_default(), isvc.name_any());
        let sla_value = match d.sla {
            SlaState::Met => 1.0,
            SlaState::Violated => 0.0,
            SlaState::Unknown => -1.0,
        };
        self.sla_met.with_label_values(&[&ns, &name]).set(sla_value);
        let flag = |on: bool| if on { 1.0 } else { 0.0 };
        self.scaling_limited.with_label_values(&[&ns, &name]).set(flag(d.scaling_limited));
        let below = d.levers.tier != isvc.spec.quantization.preferred();
        self.below_preferred_tier.with_label_values(&[&ns, &name]).set(flag(below));
        let sla = &isvc.spec.sla;
        let targets = [("ttft", Some(sla.ttft_ms)), ("itl", Some(sla.itl_ms)), ("e2e", sla.e2e_ms)];
        for (dimension, ms) in targets {
            match ms {
                Some(ms) => {
                    self.sla_target.with_label_values(&[&ns, &name, dimension]).set(f64::from(ms) / 1e3)
                }
                None => {
                    let _ = self.sla_target.remove_label_values(&[&ns, &name, dimension]);
                }
            }
        }
        for (dimension, q) in [("ttft", &observed.ttft), ("itl", &observed.itl), ("e2e", &observed.e2e)] {
            match q {
                Quantile::Value { seconds, .. } => {
                    self.observed.with_label_values(&[&ns, &name, dimension]).set(*seconds)
                }
                _ => {
                    let _ = self.observed.remove_label_values(&[&ns, &name, dimension]);
                }
            }
        }
    }

    /// Counts every lever `d` moved (or recommended moving).
    pub fn count_changes(&self, d: &Decision) {
        for change in &d.changes {
            self.decisions
                .with_label_values(&[change.lever.as_str(), change.direction.as_str(), d.reason.as_str()])
                .inc();
        }
    }

    /// Drops every series of the InferenceService `ns/name` (it was deleted).
    pub fn forget_service(&self, ns: &str, name: &str) {
        let _ = self.sla_met.remove_label_values(&[ns, name]);
        let _ = self.scaling_limited.remove_label_values(&[ns, name]);
        let _ = self.below_preferred_tier.remove_label_values(&[ns, name]);
        for dimension in ["ttft", "itl", "e2e"] {
            let _ = self.observed.remove_label_values(&[ns, name, dimension]);
            let _ = self.sla_target.remove_label_values(&[ns, name, dimension]);
        }
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The method and resource of an API request, as `pacer_operator_api_requests_total` labels:
/// `GET /apis/apps/v1/namespaces/ml/deployments/smol` → (`GET`, `deployments`); a watch is `WATCH`.
pub fn request_labels(method: &str, path: &str, query: Option<&str>) -> (String, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...: the rest starts after the version.
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or(&[]);
    let rest = if rest.first() == Some(&"namespaces") && rest.len() > 2 { &rest[2..] } else { rest };
    let resource = rest.first().copied().unwrap_or("discovery").to_string();
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let method = if watch { "WATCH".to_string() } else { method.to_string() };
    (method, resource)
}

/// The router of `/metrics`, `/healthz` and `/readyz`.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(|State(m): State<Arc<Metrics>>| async move { m.render() }))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting").into_response()
                }
            }),
        )
        .with_state(metrics)
}

#[cfg(test)]
mod tests {
    use super::request_labels;

    #[test]
    fn requests_are_labelled_by_method_and_resource() {
        let l = |m, p, q| request_labels(m, p, q);
        assert_eq!(
            l("GET", "/apis/apps/v1/namespaces/ml/deployments/smol", None),
            ("GET".into(), "deployments".into())
        );
        assert_eq!(
            l("GET", "/api/v1/namespaces/ml/configmaps", Some("watch=true&labelSelector=x")),
            ("WATCH".into(), "configmaps".into())
        );
        assert_eq!(
            l("PATCH", "/apis/serving.pacer.dev/v1alpha1/namespaces/ml/inferenceservices/smol/status", None),
            ("PATCH".into(), "inferenceservices".into())
        );
        assert_eq!(
            l("GET", "/apis/serving.pacer.dev/v1alpha1/inferenceservices", None),
            ("GET".into(), "inferenceservices".into())
        );
        assert_eq!(l("GET", "/version", None), ("GET".into(), "discovery".into()));
    }
}
