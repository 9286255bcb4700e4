//! The closed loop in a cluster, every part real: kube-apiserver, etcd, the controller manager
//! and the scheduler; the operator installed by `helm install` of `charts/pacer`, running as a
//! pod under its ServiceAccount; engine pods serving the real model; Prometheus discovering and
//! scraping the pods through the API server with `config/prometheus/prometheus.yaml`. Pods run
//! as processes under the test node agent (`pacer-tests`' `NodeAgent`), and the load reaches
//! them the way a Service does: through the ready endpoints of its EndpointSlices, least
//! outstanding first.
//!
//! The scenario: `config/local.yaml` (windows shortened as in local mode's test) under a step
//! of load — up, hold, down — then a tier rollout under light load, then an engine process
//! killed. The batch sizes the operator sets must reach the engines live (their info gauge, as
//! Prometheus scraped it). Its timeline (SVG, PNG and JSON) goes to `PACER_CLOSED_LOOP_OUT`, else a temporary
//! directory; `scripts/closed-loop.sh` runs it and keeps the picture.

#![allow(clippy::unwrap_used)]

mod common;

use common::{OPERATOR, apply_yaml, helm, model, repo_file, text};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use pacer_bench::metrics::RequestRecord;
use pacer_crds::InferenceService;
use pacer_local::load::{self, Profile, Records};
use pacer_local::report::client_windows;
use pacer_local::router::{self, Backend, Pool, RouterState};
use pacer_tests::{
    AgentConfig, Cluster, NodeAgent, POD_NETWORK_RELABELING, Prometheus, Workloads, engine_bin, eventually,
    loopback_of,
};
use serde::Serialize;
use serde_json::json;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "serving";
const NAME: &str = "smollm2-local";

/// The InferenceService of local mode, with the short windows of local mode's test so the loop
/// acts within the scenario.
fn spec_yaml() -> String {
    std::fs::read_to_string(repo_file("config/local.yaml"))
        .expect("config/local.yaml")
        .replace("window: 1m", "window: 30s")
        .replace("evaluationInterval: 10s", "evaluationInterval: 5s")
        .replace("scaleUpStabilization: 20s", "scaleUpStabilization: 5s")
        .replace("scaleDownStabilization: 40s", "scaleDownStabilization: 10s")
}

/// Polls `check` every `every` until it returns `Some`; `None` after `secs` (the caller says
/// what failed, with the logs that explain it).
async fn within<T, Fut: Future<Output = Option<T>>>(
    secs: u64,
    every: Duration,
    mut check: impl FnMut() -> Fut,
) -> Option<T> {
    let polling = async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(every).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(secs), polling).await.ok()
}

/// What the InferenceService said at one moment.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    t: f64,
    replicas: i32,
    ready: i32,
    tier: String,
    max_batch_size: u32,
    ttft_ms: Option<f64>,
    itl_ms: Option<f64>,
    sla_met: String,
    summary: String,
}

fn sample(isvc: &InferenceService, t: f64) -> Sample {
    let status = isvc.status.clone().unwrap_or_default();
    let observed = status.observed.clone().unwrap_or_default();
    let sla_met = status
        .conditions
        .iter()
        .find(|c| c.type_ == pacer_crds::conditions::SLA_MET)
        .map_or("Unknown".to_string(), |c| c.status.clone());
    let summary =
        status.summary.as_ref().map_or(String::new(), |s| format!("{} {} {}", s.replicas, s.ttft, s.itl));
    Sample {
        t,
        replicas: status.replicas.unwrap_or(0),
        ready: status.ready_replicas.unwrap_or(0),
        tier: status.tier.unwrap_or_default(),
        max_batch_size: status.max_batch_size.unwrap_or(0),
        ttft_ms: observed.ttft_ms,
        itl_ms: observed.itl_ms,
        sla_met,
        summary,
    }
}

/// Keeps `pool` equal to the ready endpoints of the Service's EndpointSlices, as kube-proxy
/// would: a pod that is deleted or fails its readiness probe gets no new request.
async fn follow_endpoints(client: Client, pool: Arc<Pool>) {
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let params = ListParams::default().labels(&format!("kubernetes.io/service-name={NAME}"));
    let mut current: Vec<u32> = Vec::new();
    loop {
        if let Ok(list) = slices.list(&params).await {
            let mut ready = Vec::new();
            for slice in &list.items {
                let port = slice.ports.iter().flatten().find_map(|p| p.port).unwrap_or(8000);
                for endpoint in &slice.endpoints {
                    if endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(true) {
                        continue;
                    }
                    for address in &endpoint.addresses {
                        let ip: std::net::Ipv4Addr = address.parse().unwrap();
                        let id = u32::from(ip);
                        ready.push(id);
                        pool.add(Backend::new(id, format!("http://{}:{port}", loopback_of(address))));
                    }
                }
            }
            for gone in current.iter().filter(|id| !ready.contains(id)) {
                pool.remove(*gone);
            }
            current = ready;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Server-side printer columns, as `kubectl get inferenceservice` shows them.
async fn printer_row(client: &Client) -> Vec<String> {
    let req = http::Request::get(format!(
        "/apis/serving.pacer.dev/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: serde_json::Value = client.request(req).await.unwrap();
    table["rows"][0]["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sla_loop_holds_a_step_in_a_cluster_with_no_request_lost() {
    let out = std::env::var_os("PACER_CLOSED_LOOP_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("pacer-closed-loop-{}", std::process::id())));
    std::fs::create_dir_all(&out).unwrap();
    let cluster = Cluster::start(Workloads::Pods { nodes: 0 }).await;
    let admin = cluster.admin().await;
    let model = model();
    let agent = NodeAgent::start(
        admin.clone(),
        AgentConfig {
            node: "pacer-node".into(),
            binaries: vec![
                ("pacer-engine".into(), engine_bin()),
                ("pacer-operator".into(), PathBuf::from(OPERATOR)),
            ],
            claims: [("models".to_string(), model.parent().unwrap().to_path_buf())].into(),
            server: cluster.server.clone(),
            ca_file: cluster.ca_file(),
            dir: cluster.dir().join("agent"),
        },
    )
    .await;
    let prometheus = Prometheus::start_kubernetes(
        Duration::from_secs(2),
        &cluster.admin_kubeconfig(),
        Some(POD_NETWORK_RELABELING),
    )
    .await;

    // The operator, by helm, pointed at that Prometheus; one replica leaves the CPU to engines.
    let kubeconfig = cluster.admin_kubeconfig();
    let chart = repo_file("charts/pacer");
    let prometheus_url = format!("prometheus.url={}", prometheus.url);
    let install = helm(&[
        "install",
        "pacer",
        chart.to_str().unwrap(),
        "-n",
        "pacer-system",
        "--create-namespace",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--set",
        "replicaCount=1",
        "--set",
        &prometheus_url,
    ]);
    assert!(install.status.success(), "helm install:\n{}", text(&install));
    let system_pods: Api<Pod> = Api::namespaced(admin.clone(), "pacer-system");
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    let operator_pod = within(120, Duration::from_millis(250), || async {
        let pods = system_pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        pods.into_iter().find(|p| ready(p))
    })
    .await
    .unwrap_or_else(|| panic!("the operator pod never got Ready:\n{}", agent.log_tails(20)));

    // The model on a PersistentVolume, claimed as `models` (the agent serves that claim from
    // the host folder of the model file).
    apply_yaml(
        &admin,
        None,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n\
             apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: models}}\n\
             spec: {{capacity: {{storage: 1Gi}}, accessModes: [ReadOnlyMany], storageClassName: '', hostPath: {{path: {}}}, claimRef: {{namespace: {NS}, name: models}}}}\n",
            model.parent().unwrap().display()
        ),
    )
    .await;
    apply_yaml(
        &admin,
        Some(NS),
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: models}\n\
         spec: {accessModes: [ReadOnlyMany], storageClassName: '', volumeName: models, resources: {requests: {storage: 1Gi}}}\n",
    )
    .await;
    apply_yaml(&admin, Some(NS), &spec_yaml()).await;
    let isvcs: Api<InferenceService> = Api::namespaced(admin.clone(), NS);
    let operator_log = || {
        std::fs::read_to_string(agent.log_path("pacer-system", &operator_pod.name_any())).unwrap_or_default()
    };
    let replicas_are = |field: fn(&pacer_crds::InferenceServiceStatus) -> Option<i32>, n: i32| {
        let isvcs = isvcs.clone();
        move || {
            let isvcs = isvcs.clone();
            async move {
                isvcs.get(NAME).await.ok()?.status.as_ref().and_then(field).filter(|r| *r == n).map(|_| ())
            }
        }
    };
    let ready_one = within(120, Duration::from_millis(500), replicas_are(|s| s.ready_replicas, 1)).await;
    assert!(ready_one.is_some(), "the engine never got ready:\n{}", agent.log_tails(20));
    eventually(60, "Prometheus to scrape the engine pod", || {
        let prometheus = &prometheus;
        async move {
            let up = prometheus
                .query(
                    &format!("up{{job=\"pacer-engines\",namespace=\"{NS}\",inferenceservice=\"{NAME}\"}}"),
                    None,
                )
                .await;
            up.iter().any(|(_, v)| *v == 1.0).then_some(())
        }
    })
    .await;

    // The Service, as the load sees it.
    let pool = Arc::new(Pool::default());
    let watcher = tokio::spawn(follow_endpoints(admin.clone(), pool.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service_url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router::router(RouterState::new(pool))).await;
    });

    // The recorder: the InferenceService every 2 s, the printer row now and then.
    let epoch = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let rows = Arc::new(Mutex::new(Vec::<(f64, Vec<String>)>::new()));
    let recorder = tokio::spawn({
        let (isvcs, samples, rows, admin) = (isvcs.clone(), samples.clone(), rows.clone(), admin.clone());
        async move {
            let mut n = 0u32;
            loop {
                if let Ok(isvc) = isvcs.get(NAME).await {
                    samples.lock().unwrap().push(sample(&isvc, epoch.elapsed().as_secs_f64()));
                }
                if n.is_multiple_of(5) {
                    let row = printer_row(&admin).await;
                    rows.lock().unwrap().push((epoch.elapsed().as_secs_f64(), row));
                }
                n += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    });

    // 1. The step: 1/s, 4/s for 45 s, then 1/s (one replica saturates near 2.8/s).
    let step = Profile::step(1.0, 4.0, [10.0, 45.0, 95.0]);
    let records = Records::default();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    load::drive(service_url.clone(), "smollm2".into(), step.clone(), records.clone(), stop.clone()).await;
    let step_records = records.snapshot();
    // Back to one replica once the light load has lasted (stabilization, then headroom).
    let back = within(120, Duration::from_secs(1), replicas_are(|s| s.replicas, 1)).await;
    let step_end = epoch.elapsed().as_secs_f64();

    // 2. A tier rollout under light load: q8_0 becomes the only allowed tier.
    let rollout_records = Records::default();
    let rollout_start = epoch.elapsed().as_secs_f64();
    let light = Profile { phases: vec![load::Phase { rate: 1.0, seconds: 60.0 }], ..step.clone() };
    let drive = tokio::spawn(load::drive(
        service_url.clone(),
        "smollm2".into(),
        light,
        rollout_records.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let patch = json!({"spec": {"quantization": {"allowedTiers": ["q8_0"], "preferredTier": "q8_0"}}});
    isvcs.patch(NAME, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    drive.await.unwrap();
    let rolled = eventually(90, "the tier rollout to finish", || {
        let isvcs = isvcs.clone();
        async move {
            let s = isvcs.get(NAME).await.ok()?.status?;
            (s.tier.as_deref() == Some("q8_0") && s.ready_replicas == Some(1) && s.replicas == Some(1))
                .then_some(s)
        }
    })
    .await;
    let rollout_end = epoch.elapsed().as_secs_f64();

    // 3. A crash: the engine process is killed; the pod restarts it.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let engine_pod = pods
        .list(&ListParams::default().labels("serving.pacer.dev/inferenceservice"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| ready(p) && p.metadata.deletion_timestamp.is_none())
        .expect("a ready engine pod");
    assert!(agent.crash(NS, &engine_pod.name_any()), "no process to kill");
    // Seen as a failure: the pod turns unready at once (the Service stops sending to it).
    eventually(15, "the crashed pod to turn unready", || {
        let pods = pods.clone();
        let name = engine_pod.name_any();
        async move { pods.get(&name).await.ok().filter(|p| !ready(p)).map(|_| ()) }
    })
    .await;
    let recovered = eventually(120, "the crashed engine to restart and be Ready", || {
        let pods = pods.clone();
        let name = engine_pod.name_any();
        async move {
            let pod = pods.get(&name).await.ok()?;
            let restarts = pod.status.as_ref()?.container_statuses.as_ref()?.first()?.restart_count;
            (restarts >= 1 && ready(&pod)).then_some(restarts)
        }
    })
    .await;
    eventually(60, "the InferenceService to count the restarted replica ready", || {
        let isvcs = isvcs.clone();
        async move { (isvcs.get(NAME).await.ok()?.status?.ready_replicas == Some(1)).then_some(()) }
    })
    .await;
    let end = epoch.elapsed().as_secs_f64();
    recorder.abort();
    watcher.abort();
    server.abort();

    // The record: samples, printer rows, client windows, Events; then the picture.
    let samples = samples.lock().unwrap().clone();
    let rows = rows.lock().unwrap().clone();
    let events: Api<Event> = Api::namespaced(admin.clone(), NS);
    let events: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("InferenceService"))
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect();
    let windows = client_windows(&step_records, 10.0, 1.0, 0.1);
    let rollout_records = rollout_records.snapshot();
    let count = |records: &[RequestRecord]| json!({"sent": records.len(), "failed": records.iter().filter(|r| !r.ok()).count()});
    let timeline = json!({
        "requests": {"step": count(&step_records), "rollout": count(&rollout_records)},
        "phases": {"step_end": step_end, "rollout_end": rollout_end, "end": end},
        "samples": samples, "printer_rows": rows, "events": events,
        "client_windows_10s": windows,
    });
    std::fs::write(out.join("closed-loop.json"), serde_json::to_vec_pretty(&timeline).unwrap()).unwrap();
    let all: Vec<RequestRecord> = step_records
        .iter()
        .cloned()
        .chain(rollout_records.iter().cloned().map(|mut r| {
            // The rollout's load started its own clock at step_end + (time to scale in).
            let offset = rollout_start;
            r.scheduled += offset;
            r.sent += offset;
            r.closed += offset;
            r.content_events.iter_mut().for_each(|t| *t += offset);
            r
        }))
        .collect();
    picture(&out.join("closed-loop.svg"), &samples, &all, step_end, rollout_end);
    let png = pacer_bench::plots::png_from_svg(&out.join("closed-loop.svg")).unwrap();
    assert!(png.is_file());
    let summary: String = samples
        .iter()
        .map(|s| {
            format!(
                "t={:.0} replicas={}/{} tier={} batch={} ttft={:?} itl={:?} SLAMet={}\n",
                s.t, s.ready, s.replicas, s.tier, s.max_batch_size, s.ttft_ms, s.itl_ms, s.sla_met
            )
        })
        .collect();
    eprintln!("{summary}\nevents:\n{}\nout: {}", events.join("\n"), out.display());

    // The verdicts.
    assert!(back.is_some(), "replicas did not come back to 1 after the step:\n{summary}");
    let up =
        samples.iter().position(|s| s.replicas == 2).unwrap_or_else(|| panic!("never scaled up:\n{summary}"));
    // SLAMet returns to True after the step up. The planner's promise (docs/planner.md): for
    // one SLA window after a scale-up the window still holds latencies from before it, so
    // allow two windows (30 s each) and two evaluation intervals (5 s) once both are ready.
    let ready_at = samples[up..].iter().find(|s| s.ready == 2).map(|s| s.t);
    let ready_at = ready_at.unwrap_or_else(|| panic!("the second replica never got ready:\n{summary}"));
    assert!(
        samples
            .iter()
            .any(|s| s.t > ready_at && s.t <= ready_at + 2.0 * 30.0 + 2.0 * 5.0 && s.sla_met == "True"),
        "SLAMet not True again within two windows of the scale-up:\n{summary}"
    );
    // Few moves: one scale-up and one scale-in (a third would be a flap), and the batch lever
    // down and back at most once more each.
    let step_samples: Vec<&Sample> = samples.iter().filter(|s| s.t <= step_end).collect();
    let moves = |changed: fn(&Sample, &Sample) -> bool| {
        step_samples.windows(2).filter(|w| changed(w[0], w[1])).count()
    };
    let replica_moves = moves(|a, b| a.replicas != b.replicas);
    let batch_moves = moves(|a, b| a.max_batch_size != b.max_batch_size);
    assert!(
        replica_moves <= 3 && replica_moves + batch_moves <= 6,
        "{replica_moves} replica and {batch_moves} batch changes:\n{summary}"
    );
    // Precision stays at (and so comes back to) the preferred tier through the step: replicas
    // and batch carry it, and nothing degrades.
    assert!(
        step_samples.iter().all(|s| s.tier == "native"),
        "the tier left native during the step:\n{summary}"
    );
    // Every batch size the operator set reached the engines without a restart (ConfigMap →
    // the agent's atomic swap → the engine's settings watch): their own info gauge said so, as
    // Prometheus scraped it.
    let mut batches: Vec<u32> = step_samples.iter().map(|s| s.max_batch_size).collect();
    batches.dedup();
    for b in batches {
        let q = format!(
            "max_over_time(pacer_engine_info{{namespace=\"{NS}\",inferenceservice=\"{NAME}\",max_batch_size=\"{b}\"}}[15m])"
        );
        let seen = prometheus.query(&q, None).await;
        assert!(
            seen.iter().any(|(_, v)| *v == 1.0),
            "no engine reported max_batch_size {b}: {q} -> {seen:?}\n{summary}"
        );
    }
    // kubectl's columns showed the observed P95s while there was load.
    assert!(
        rows.iter().any(|(t, row)| *t < step_end && row.get(4).is_some_and(|c| !c.starts_with('-'))),
        "the TTFT column never showed an observed P95: {rows:?}"
    );
    let failed = |records: &[RequestRecord]| {
        records.iter().filter(|r| !r.ok()).map(|r| r.error.clone().unwrap_or_default()).collect::<Vec<_>>()
    };
    let step_failed = failed(&step_records);
    assert!(
        step_failed.is_empty(),
        "{} of {} requests failed across the scale-up and scale-in: {:?}",
        step_failed.len(),
        step_records.len(),
        step_failed.first()
    );
    assert!(step_records.len() > 200, "{} requests", step_records.len());
    let rollout_failed = failed(&rollout_records);
    assert!(
        rollout_failed.is_empty(),
        "{} of {} requests failed across the tier rollout: {:?}",
        rollout_failed.len(),
        rollout_records.len(),
        rollout_failed.first()
    );
    assert_eq!(rolled.tier.as_deref(), Some("q8_0"));
    assert!(recovered >= 1);
    assert!(!operator_log().is_empty());
}

/// The timeline: the operator's observed P95 TTFT and the clients' (10 s windows) against the
/// target, and the replicas desired and ready, with the phases marked.
fn picture(
    path: &std::path::Path,
    samples: &[Sample],
    records: &[RequestRecord],
    step_end: f64,
    rollout_end: f64,
) {
    use plotters::prelude::*;
    let end = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let (top, bottom) = root.split_vertically(340);
    let windows = client_windows(records, 10.0, 1.0, 0.1);
    let ttft_max = samples
        .iter()
        .filter_map(|s| s.ttft_ms)
        .chain(windows.iter().filter_map(|w| w.ttft_p95.map(|v| v * 1000.0)))
        .fold(1500.0_f64, f64::max);
    let mut chart = ChartBuilder::on(&top)
        .caption("Closed loop in a cluster: P95 TTFT (ms)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(25)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..end, 0.0..ttft_max * 1.05)
        .unwrap();
    chart.configure_mesh().x_desc("seconds").draw().unwrap();
    chart
        .draw_series(LineSeries::new([(0.0, 1000.0), (end, 1000.0)], RED.stroke_width(1)))
        .unwrap()
        .label("target 1000 ms")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], RED));
    chart
        .draw_series(LineSeries::new(
            samples.iter().filter_map(|s| Some((s.t, s.ttft_ms?))),
            BLUE.stroke_width(2),
        ))
        .unwrap()
        .label("operator's P95 (Prometheus, 30 s window)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLUE));
    chart
        .draw_series(
            windows
                .iter()
                .filter_map(|w| Some(Circle::new((w.from + 5.0, w.ttft_p95? * 1000.0), 3, GREEN.filled()))),
        )
        .unwrap()
        .label("clients' P95 per 10 s")
        .legend(|(x, y)| Circle::new((x + 7, y), 3, GREEN.filled()));
    for at in [step_end, rollout_end] {
        chart.draw_series(LineSeries::new([(at, 0.0), (at, ttft_max)], BLACK.mix(0.3))).unwrap();
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().unwrap();
    let mut replicas = ChartBuilder::on(&bottom)
        .caption(
            "replicas (desired, ready); the lines mark the end of the step and of the tier rollout",
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(25)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..end, 0.0..3.0)
        .unwrap();
    replicas.configure_mesh().x_desc("seconds").draw().unwrap();
    replicas
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t, f64::from(s.replicas))),
            BLUE.stroke_width(2),
        ))
        .unwrap()
        .label("desired")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLUE));
    replicas
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t, f64::from(s.ready))),
            GREEN.stroke_width(2),
        ))
        .unwrap()
        .label("ready")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], GREEN));
    replicas
        .draw_series(
            samples.iter().filter(|s| s.sla_met == "False").map(|s| Circle::new((s.t, 2.8), 2, RED.filled())),
        )
        .unwrap()
        .label("SLAMet False")
        .legend(|(x, y)| Circle::new((x + 7, y), 2, RED.filled()));
    for at in [step_end, rollout_end] {
        replicas.draw_series(LineSeries::new([(at, 0.0), (at, 3.0)], BLACK.mix(0.3))).unwrap();
    }
    replicas.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().unwrap();
    root.present().unwrap();
}
