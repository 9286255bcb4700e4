//! The SLA loop end to end below the cluster's pods: two real engine processes serving the real
//! model, a real Prometheus scraping them with the labels a Kubernetes pod scrape gives, and the
//! real operator (with `--prometheus-url`) reconciling InferenceServices in the test cluster
//! that those series belong to. Under load with targets the engines cannot meet, the operator
//! raises replicas in Enforce mode and only recommends in Advisory mode; with Prometheus
//! stopped it reports `MetricsAvailable=False` and moves nothing.

use crate::common::{TestNs, cluster};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use pacer_crds::{InferenceService, conditions};
use pacer_tests::eventually;
use pacer_tests::{EngineProcess, Prometheus, ScrapeTarget};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn condition(isvc: &InferenceService, type_: &str) -> Option<(String, String, String)> {
    let c = isvc.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// An InferenceService whose TTFT target no CPU engine meets (1 ms; ITL is loose so TTFT
/// binds), evaluated every 5 s over
/// a 30 s window, acting after 5 s of violation.
fn tight(name: &str, mode: &str) -> serde_json::Value {
    json!({
        "apiVersion": "serving.pacer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": {"url": {
                "url": "https://models.example.com/smol.gguf",
                "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            }}},
            "sla": {"ttftMs": 1, "itlMs": 1000, "window": "30s"},
            "replicas": {"min": 1, "max": 3},
            "policy": {
                "mode": mode,
                "evaluationInterval": "5s",
                "scaleUpStabilization": "5s",
                "scaleDownStabilization": "10m",
            },
        },
    })
}

/// Sends short chat requests to `engines` round-robin, `concurrency` at a time, until `stop` is
/// set or 240 s pass (bounded: loopback only, at most 2000 requests).
fn load(engines: Vec<String>, concurrency: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(240);
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|w| {
                let (http, engines, stop, sent) = (http.clone(), engines.clone(), stop.clone(), sent.clone());
                tokio::spawn(async move {
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed)
                        && Instant::now() < deadline
                        && sent.fetch_add(1, Ordering::Relaxed) < 2000
                    {
                        let url = format!("{}/v1/chat/completions", engines[i % engines.len()]);
                        let body = json!({
                            "model": "SmolLM2-135M-Instruct.Q4_1",
                            "messages": [{"role": "user", "content": format!("Count to {i}.")}],
                            "max_tokens": 12,
                        });
                        let _ = http.post(url).json(&body).send().await.and_then(|r| r.error_for_status());
                        i += concurrency;
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
        sent.load(Ordering::Relaxed)
    })
}

async fn deployment_replicas(ns: &TestNs, name: &str) -> Option<i32> {
    ns.api::<Deployment>().get_opt(name).await.ok().flatten()?.spec?.replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_holds_the_sla_on_real_prometheus_series() {
    let ns = TestNs::new("planner").await;
    let dir = cluster().dir();
    let engines = [
        EngineProcess::start("planner-a", &["--served-model-name=SmolLM2-135M-Instruct.Q4_1"], dir).await,
        EngineProcess::start("planner-b", &["--served-model-name=SmolLM2-135M-Instruct.Q4_1"], dir).await,
    ];
    // The same engines' series belong to two InferenceServices, one per policy mode.
    let mut targets = Vec::new();
    for (name, suffix) in [("enforced", "a"), ("advised", "b")] {
        for (i, e) in engines.iter().enumerate() {
            targets.push(ScrapeTarget::new(&e.address, &ns.name, name, &format!("{name}-{suffix}{i}")));
        }
    }
    let mut prometheus = Prometheus::start(Duration::from_secs(1), &targets).await;
    prometheus.wait_targets_up(targets.len(), 60).await;

    ns.create(tight("enforced", "Enforce")).await;
    ns.create(tight("advised", "Advisory")).await;
    let op = ns.operator_with(
        "planner",
        &[format!("--prometheus-url={}", prometheus.url), "--metrics-interval=2".into()],
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load_task = load(engines.iter().map(EngineProcess::url).collect(), 4, stop.clone());

    // Enforce: violated → more replicas, said in status, an Event and the operator's metrics.
    let api = ns.isvcs();
    let scale_up = async {
        loop {
            if let Ok(isvc) = api.get("enforced").await
                && let Some(last) = isvc.status.as_ref().and_then(|s| s.last_decision.clone())
                && last.lever == "replicas"
                && last.direction == "up"
                && last.applied
            {
                return isvc;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let enforced = tokio::time::timeout(Duration::from_secs(150), scale_up)
        .await
        .unwrap_or_else(|_| panic!("no scale-up within 150 s; operator log:\n{}", op.log_text()));
    let status = enforced.status.clone().expect("status");
    let observed = status.observed.clone().expect("observed SLA");
    assert!(observed.ttft_ms.is_some_and(|t| t > 1.0), "{observed:?}");
    assert!(observed.ttft_samples.is_some_and(|n| n >= 20.0), "{observed:?}");
    assert_eq!(condition(&enforced, conditions::SLA_MET).map(|c| c.0), Some("False".into()));
    assert_eq!(condition(&enforced, conditions::METRICS_AVAILABLE).map(|c| c.0), Some("True".into()));
    assert_eq!(status.summary.as_ref().map(|s| s.sla.as_str()), Some("Violated"));
    let scaled = status.replicas.expect("replicas");
    assert!(scaled >= 2, "{status:?}");
    eventually(30, "the Deployment to follow the decision", || async {
        (deployment_replicas(&ns, "enforced").await? == scaled).then_some(())
    })
    .await;
    // The operator writes the status before it publishes the decision's Event and counts it,
    // so both may trail the status this test saw by a moment.
    let decided_event =
        |e: &Event| e.reason.as_deref() == Some("TTFTViolated") && e.action.as_deref() == Some("Decide");
    let mut events: Vec<Event> = Vec::new();
    for _ in 0..100 {
        events = ns.api::<Event>().list(&ListParams::default()).await.expect("events").items;
        if events.iter().any(decided_event) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        events.iter().any(decided_event),
        "an Event for the decision within 10 s: {:?}",
        events.iter().map(|e| (&e.reason, &e.note)).collect::<Vec<_>>()
    );
    let decided = op.metric("pacer_operator_decisions_total", "lever=\"replicas\"").await.unwrap_or(0.0);
    assert!(decided >= 1.0, "decisions_total: {decided}");
    // The per-service gauges the dashboard and the alerts read (labels in the exporter's
    // alphabetical order; `metric` sums the matching lines, so an absent series reads 0).
    let service = format!("inferenceservice=\"enforced\",namespace=\"{}\"", ns.name);
    let target = |dimension: &str| format!("dimension=\"{dimension}\",{service}");
    assert_eq!(op.metric("pacer_operator_sla_target_seconds", &target("ttft")).await, Some(0.001));
    assert_eq!(op.metric("pacer_operator_sla_target_seconds", &target("itl")).await, Some(1.0));
    assert_eq!(op.metric("pacer_operator_sla_target_seconds", &target("e2e")).await, Some(0.0), "no e2eMs");
    assert_eq!(op.metric("pacer_operator_below_preferred_tier", &service).await, Some(0.0));
    let limited = op.metric("pacer_operator_scaling_limited", &service).await;
    assert!(limited.is_some_and(|v| v == 0.0 || v == 1.0), "{limited:?}");

    // Advisory: the same violation is recommended, not applied.
    let advised = eventually(60, "a recommendation for `advised`", || {
        let api = api.clone();
        async move {
            let isvc = api.get("advised").await.ok()?;
            let last = isvc.status.as_ref()?.last_decision.clone()?;
            (last.lever == "replicas" && !last.applied).then_some(isvc)
        }
    })
    .await;
    assert_eq!(advised.status.as_ref().and_then(|s| s.replicas), Some(1));
    assert_eq!(deployment_replicas(&ns, "advised").await, Some(1));

    // Prometheus gone: the planner says so and moves nothing.
    stop.store(true, Ordering::Relaxed);
    let sent = load_task.await.expect("load");
    assert!(sent >= 20, "the load sent {sent} requests");
    let before = api.get("enforced").await.expect("enforced");
    let replicas_before = before.status.as_ref().and_then(|s| s.replicas);
    prometheus.stop();
    let blind = eventually(60, "MetricsAvailable=False after Prometheus stops", || {
        let api = api.clone();
        async move {
            let isvc = api.get("enforced").await.ok()?;
            let (status, _, _) = condition(&isvc, conditions::METRICS_AVAILABLE)?;
            (status == "False").then_some(isvc)
        }
    })
    .await;
    let (_, reason, message) = condition(&blind, conditions::METRICS_AVAILABLE).expect("condition");
    assert_eq!(reason, "MetricsMissing", "{message}");
    assert_eq!(
        blind.status.as_ref().and_then(|s| s.summary.as_ref()).map(|s| s.sla.as_str()),
        Some("Unknown")
    );
    // Several evaluation intervals later, still nothing moved.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = api.get("enforced").await.expect("enforced");
    assert_eq!(after.status.as_ref().and_then(|s| s.replicas), replicas_before);
    assert_eq!(deployment_replicas(&ns, "enforced").await, replicas_before);
    let errors = op.metric("pacer_operator_metrics_source_errors_total", "").await.unwrap_or(0.0);
    assert!(errors >= 1.0, "source errors are counted: {errors}");
}
