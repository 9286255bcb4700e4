//! Scale benchmark: how many InferenceServices one operator brings up and keeps in steady state,
//! on a real control plane with kwok nodes (the same harness as the cluster tests).
//!
//!   cargo bench -p pacer-operator --bench scale -- 100 200
//!
//! For each count N it creates N InferenceServices in a fresh namespace, waits until all are
//! Ready, then watches a steady-state window of 3 evaluation intervals and reports: time to
//! converge, reconciles and writes while converging, mean reconcile time, reconciles per second
//! in steady state, API requests and writes per no-op reconcile (goal: zero writes), and the
//! operator's resident memory per managed service.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{TestNs, isvc_doc};
use indicatif::{ProgressBar, ProgressStyle};
use pacer_crds::conditions;
use pacer_tests::OperatorProcess;
use std::time::{Duration, Instant};

const EVALUATION_INTERVAL_S: u64 = 10;

fn main() {
    let counts: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let counts = if counts.is_empty() { vec![50, 100, 200] } else { counts };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!(
        "| services | converge s | reconciles (converge) | writes (converge) | mean reconcile ms | steady reconciles/s | API requests / no-op reconcile | writes / no-op reconcile | RSS MiB | KiB / service |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for n in counts {
        rt.block_on(run(n));
    }
}

/// A snapshot of the operator's counters.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    reconciles: f64,
    writes: f64,
    requests: f64,
    duration_sum: f64,
    duration_count: f64,
}

async fn counters(op: &OperatorProcess) -> Counters {
    let m = |name: &'static str, labels: &'static str| async move { op.metric(name, labels).await.unwrap_or(0.0) };
    // Requests that a reconcile makes: everything but watches and the leader Lease's renewals.
    let all = m("pacer_operator_api_requests_total", "").await;
    let watches = m("pacer_operator_api_requests_total", "method=\"WATCH\"").await;
    let leases = m("pacer_operator_api_requests_total", "resource=\"leases\"").await;
    Counters {
        reconciles: m("pacer_operator_reconciles_total", "result=\"ok\"").await,
        writes: m("pacer_operator_writes_total", "").await,
        requests: all - watches - leases,
        duration_sum: m("pacer_operator_reconcile_duration_seconds_sum", "").await,
        duration_count: m("pacer_operator_reconcile_duration_seconds_count", "").await,
    }
}

fn rss_kib(op: &OperatorProcess) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", op.pid())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

async fn run(n: usize) {
    let ns = TestNs::new("scale").await;
    let op = ns.operator("bench");
    pacer_tests::eventually(30, "the operator to lead", || async {
        (op.metric("pacer_operator_leader", "").await? == 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_kib(&op);
    let start = counters(&op).await;

    let bar = ProgressBar::new(n as u64).with_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_message("creating");
    let t0 = Instant::now();
    let api = ns.isvcs();
    for chunk in (0..n).collect::<Vec<_>>().chunks(16) {
        let creates = chunk.iter().map(|i| {
            let mut doc = isvc_doc(&format!("svc-{i:04}"));
            doc["spec"]["policy"] =
                serde_json::json!({"evaluationInterval": format!("{EVALUATION_INTERVAL_S}s")});
            // Small requests, so that the fake nodes' capacity never limits the count.
            doc["spec"]["engine"] =
                serde_json::json!({"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}});
            ns.create(doc)
        });
        futures::future::join_all(creates).await;
        bar.inc(chunk.len() as u64);
    }
    bar.set_position(0);
    bar.set_message("ready");
    loop {
        let list = api.list(&Default::default()).await.expect("list");
        let ready = list
            .items
            .iter()
            .filter(|i| {
                i.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| c.type_ == conditions::READY && c.status == "True")
                        && s.observed_generation == i.metadata.generation
                })
            })
            .count();
        bar.set_position(ready as u64);
        if ready == n {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "{ready}/{n} ready after 10 minutes");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converge = t0.elapsed();
    bar.finish_and_clear();
    // Let the last status updates of the Deployments (controller manager, kwok) arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let converged = counters(&op).await;

    let window = Duration::from_secs(3 * EVALUATION_INTERVAL_S);
    tokio::time::sleep(window).await;
    let steady = counters(&op).await;
    let rss_after = rss_kib(&op);

    let noop = steady.reconciles - converged.reconciles;
    let mean_ms = 1000.0 * (converged.duration_sum - start.duration_sum)
        / (converged.duration_count - start.duration_count).max(1.0);
    println!(
        "| {n} | {:.1} | {:.0} | {:.0} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} |",
        converge.as_secs_f64(),
        converged.reconciles - start.reconciles,
        converged.writes - start.writes,
        mean_ms,
        noop / window.as_secs_f64(),
        (steady.requests - converged.requests) / noop.max(1.0),
        (steady.writes - converged.writes) / noop.max(1.0),
        rss_after / 1024.0,
        (rss_after - rss_before) / n as f64,
    );
    drop(op);
    // Free the fake nodes for the next count.
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(ns.admin.clone());
    let _ = namespaces.delete(&ns.name, &Default::default()).await;
}
