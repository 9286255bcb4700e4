//! The metrics poller: one task asks the metrics source, once per tick, about every InferenceService
//! the controller knows, and keeps the answer for reconciles to read. Reconciles never query
//! the source themselves, so the number of queries per tick does not grow with the number of
//! InferenceServices (one per metric per distinct percentile and window).

use crate::metrics_source::{MetricsReading, MetricsSource, ServiceKey, WindowRequest};
use crate::planner::{Freshness, ServiceMetrics};
use crate::telemetry::Metrics;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use pacer_crds::{InferenceService, parse_duration};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Runs the metrics source on a tick and keeps its latest answer.
pub struct MetricsPoller {
    source: Arc<dyn MetricsSource>,
    tick: Duration,
    latest: RwLock<Option<Arc<MetricsReading>>>,
}

impl MetricsPoller {
    /// A poller of `source` that asks it every `tick`.
    pub fn new(source: Arc<dyn MetricsSource>, tick: Duration) -> Arc<MetricsPoller> {
        Arc::new(MetricsPoller { source, tick, latest: RwLock::new(None) })
    }

    /// How often the source is asked.
    pub fn tick_interval(&self) -> Duration {
        self.tick
    }

    /// What the source is, for logs.
    pub fn describe(&self) -> String {
        self.source.describe()
    }

    /// The requests for every InferenceService in `isvcs`.
    pub fn requests(isvcs: &[Arc<InferenceService>]) -> Vec<WindowRequest> {
        isvcs
            .iter()
            .filter_map(|isvc| {
                parse_duration(&isvc.spec.sla.window)?;
                let spec = isvc.spec.planner_spec();
                Some(WindowRequest {
                    service: ServiceKey::new(isvc.namespace()?, isvc.name_any()),
                    quantile: spec.quantile(),
                    window: spec.window,
                    rate_window: spec.rate_window(),
                })
            })
            .collect()
    }

    /// One tick: observe every service in `stores` (one per watched namespace) and keep the
    /// answer.
    pub async fn tick(&self, stores: &[Store<InferenceService>], metrics: &Metrics) {
        let isvcs: Vec<_> = stores.iter().flat_map(Store::state).collect();
        let requests = MetricsPoller::requests(&isvcs);
        let observations = self.source.observe(&requests).await;
        if let Some(e) = &observations.error {
            tracing::warn!(error = %e, source = %self.source.describe(), "observing the SLA metrics failed; the planner holds");
            metrics.observe_errors.with_label_values(&[e.metric_label()]).inc();
        }
        if let Ok(mut latest) = self.latest.write() {
            *latest = Some(Arc::new(observations));
        }
    }

    /// Ticks until `stop` resolves.
    pub async fn run(self: Arc<Self>, stores: Vec<Store<InferenceService>>, metrics: Arc<Metrics>) {
        let mut interval = tokio::time::interval(self.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.tick(&stores, &metrics).await;
        }
    }

    /// The latest metrics of `service` as seen at `now` (unix seconds): missing before the first
    /// tick, stale when the last tick is older than three ticks (the poller is stuck).
    pub fn metrics_of(&self, service: &ServiceKey, now: f64) -> (f64, Freshness, ServiceMetrics) {
        let latest = self.latest.read().ok().and_then(|l| l.clone());
        let Some(obs) = latest else {
            let reason = "the metrics source has not answered yet".to_string();
            return (now, Freshness::Missing { reason }, ServiceMetrics::missing());
        };
        let age = now - obs.at;
        let (freshness, metrics) = obs.services.get(service).cloned().unwrap_or_else(|| {
            let reason = format!("{} has no series for {service} yet", self.source.describe());
            (Freshness::Missing { reason }, ServiceMetrics::missing())
        });
        if age > 3.0 * self.tick.as_secs_f64() && freshness == Freshness::Fresh {
            return (obs.at, Freshness::Stale { age }, metrics);
        }
        (obs.at, freshness, metrics)
    }
}
