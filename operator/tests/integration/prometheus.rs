//! The Prometheus metrics source against a real Prometheus (built by
//! `scripts/build-prometheus.sh`) scraping real `pacer-engine serve` processes on the real model,
//! and a recorded vLLM exposition, through file service discovery relabelled as a Kubernetes
//! pod scrape.
//!
//! Queries are evaluated at the newest scrape of the loaded target, whose first sample in the
//! window is the zero of a fresh process: PromQL then neither extrapolates `rate` nor
//! `increase`, so sample counts and rates are exact and comparable to what was sent.

#![allow(clippy::unwrap_used)]

use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::run::{RunPlan, run};
use pacer_operator::metrics_source::histogram::{Exposition, Histogram};
use pacer_operator::metrics_source::queries::{E2E, ITL, TTFT};
use pacer_operator::metrics_source::{
    MetricsSource, PrometheusConfig, PrometheusSource, ServiceKey, WindowRequest,
};
use pacer_operator::planner::{Freshness, Quantile, ServiceMetrics};
use pacer_tests::{EngineProcess, Prometheus, ScrapeTarget, StaticMetrics, eventually};
use std::sync::Arc;
use std::time::Duration;

const SCRAPE: Duration = Duration::from_secs(1);

/// The tests that drive real engines run one at a time: on a small machine two loads at once
/// stretch the scrapes the exact comparisons rely on.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn request(ns: &str, name: &str, window: f64) -> WindowRequest {
    WindowRequest { service: ServiceKey::new(ns, name), quantile: 0.95, window, rate_window: window }
}

fn source(prometheus: &Prometheus) -> PrometheusSource {
    let mut config = PrometheusConfig::new(&prometheus.url);
    config.timeout = Duration::from_secs(5);
    PrometheusSource::new(config).unwrap()
}

/// Waits until Prometheus answers `promql` with `want`.
async fn until_prometheus_says(prometheus: &Prometheus, promql: &str, want: f64) {
    eventually(30, &format!("{promql} == {want}"), || async {
        (prometheus.query_one(promql, None).await == Some(want)).then_some(())
    })
    .await;
}

/// Index of the bucket of `h` that holds `value`.
fn bucket_index(h: &Histogram, value: f64) -> usize {
    h.buckets.iter().position(|(le, _)| value <= *le).unwrap()
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{what}: {a} != {b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percentiles_counts_and_rates_of_real_engines() {
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = tempfile::tempdir().unwrap();
    let flags = ["--served-model-name=smol", "--tier=q4_0", "--max-batch-size=4", "--kv-cache-tokens=4096"];
    let (chat, idle) = tokio::join!(
        EngineProcess::start("chat-0", &flags, logs.path()),
        EngineProcess::start("idle-0", &flags, logs.path())
    );
    let mut prometheus = Prometheus::start(
        SCRAPE,
        &[
            ScrapeTarget::new(&chat.address, "team-a", "chat", "chat-0"),
            ScrapeTarget::new(&idle.address, "team-a", "idle", "idle-0"),
        ],
    )
    .await;
    prometheus.wait_targets_up(2, 30).await;
    let count = r#"sum(vllm:time_to_first_token_seconds_count{namespace="team-a", inferenceservice="chat"})"#;
    // A scrape before any request: the series start at zero inside the window.
    until_prometheus_says(&prometheus, count, 0.0).await;

    let before = Exposition::parse(&chat.metrics().await).unwrap();
    let target = Target {
        base_url: chat.url(),
        model: "smol".into(),
        endpoint: Endpoint::Chat,
        api_key: None,
        ignore_eos: true,
        tokenizer: None,
        keep_alive: false,
    };
    let sent = 24;
    let plan = RunPlan {
        arrivals: Arrivals::Closed { concurrency: 4 },
        requests: sent,
        warmup: 0,
        input: Length::Fixed { n: 16 },
        output: Length::Fixed { n: 8 },
        shared_prefix: 4,
        seed: 11,
        max_duration: Some(Duration::from_secs(40)),
        dataset: None,
        replay: None,
        turns: 1,
    };
    let load = run(&target, &plan, || {}).await;
    assert_eq!(load.records.len(), sent);
    assert!(load.records.iter().all(|r| r.ok()), "every request succeeds");
    let after = Exposition::parse(&chat.metrics().await).unwrap();
    // E2E is observed last, as a request finishes: once Prometheus counts every E2E, its newest
    // scrape holds every TTFT and ITL too (a TTFT count alone can be complete while the last
    // requests still stream).
    let finished =
        r#"sum(vllm:e2e_request_latency_seconds_count{namespace="team-a", inferenceservice="chat"})"#;
    until_prometheus_says(&prometheus, finished, sent as f64).await;

    // Evaluate at the chat engine's newest scrape: no extrapolation to the right either.
    let at = prometheus
        .query_one(r#"max(timestamp(vllm:num_requests_running{inferenceservice="chat"}))"#, None)
        .await
        .unwrap();
    let window = 120.0;
    let requests = [request("team-a", "chat", window), request("team-a", "idle", window)];
    let src = source(&prometheus);
    let seen = src.observe_at(&requests, at).await;
    assert!(seen.error.is_none(), "{:?}", seen.error);
    let (fresh, busy) = &seen.services[&ServiceKey::new("team-a", "chat")];
    assert_eq!(*fresh, Freshness::Fresh);

    for (name, metric, quantile) in
        [("TTFT", TTFT, busy.ttft), ("ITL", ITL, busy.itl), ("E2E", E2E, busy.e2e)]
    {
        let Quantile::Value { seconds, samples } = quantile else { panic!("{name}: {quantile:?}") };
        // Prometheus' own histogram_quantile at the same instant, through a different client.
        let promql = format!(
            "histogram_quantile(0.95, sum by (namespace, inferenceservice, le) \
             (rate({metric}_bucket{{inferenceservice=\"chat\"}}[120s])))"
        );
        let own = prometheus.query_one(&promql, Some(at)).await.unwrap();
        close(seconds, own, &format!("{name} P95 vs Prometheus"));
        // The engine's own histogram, bucket deltas across the load, by the same maths.
        let engine = after.histogram(metric, &[]).unwrap().since(&before.histogram(metric, &[]).unwrap());
        let local = engine.quantile(0.95).unwrap();
        let (a, b) = (bucket_index(&engine, seconds), bucket_index(&engine, local));
        assert!(
            a.abs_diff(b) <= 1,
            "{name}: Prometheus {seconds} and engine {local} more than a bucket apart"
        );
        close(samples, engine.count, &format!("{name} samples vs the engine's count"));
        eprintln!("{name} P95: source {seconds:.6} s, engine histogram {local:.6} s, {samples} samples");
    }
    assert_eq!(busy.ttft.samples(), Some(sent as f64));
    assert_eq!(busy.e2e.samples(), Some(sent as f64));
    let output: usize = load.records.iter().map(|r| r.output_tokens).sum();
    assert_eq!(busy.itl.samples(), Some((output - sent) as f64), "one gap per token after the first");

    // Each `finished_reason` series of `vllm:request_success_total` exists from the engine's
    // start at 0 (as vLLM's do); should a scrape still have missed the start, PromQL's increase
    // lies between the total less the first values and the total (extrapolation stops at zero).
    let first: f64 = prometheus
        .query_data(r#"vllm:request_success_total{inferenceservice="chat"}[120s]"#, Some(at))
        .await["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|series| series["values"][0][1].as_str().unwrap().parse::<f64>().unwrap())
        .sum();
    let finished = busy.request_rate.unwrap() * window;
    assert!(
        finished >= sent as f64 - first - 1e-9 && finished <= sent as f64 + 1e-9,
        "finished requests {finished}: not within [{} − {first}, {sent}]",
        sent
    );
    close(busy.output_token_rate.unwrap() * window, output as f64, "generated tokens");
    let prompt = after.sum("vllm:prompt_tokens_total", &[]).unwrap()
        - before.sum("vllm:prompt_tokens_total", &[]).unwrap();
    close(busy.prompt_token_rate.unwrap() * window, prompt, "prompt tokens");
    assert_eq!((busy.running, busy.waiting), (Some(0.0), Some(0.0)), "idle after the load");
    assert!(busy.kv_usage.is_some_and(|kv| (0.0..=1.0).contains(&kv)));
    assert_eq!(busy.reporting_replicas, Some(1.0));

    // No traffic: a known state, never a zero latency.
    let (fresh, quiet) = &seen.services[&ServiceKey::new("team-a", "idle")];
    assert_eq!(*fresh, Freshness::Fresh);
    for q in [quiet.ttft, quiet.itl, quiet.e2e] {
        assert!(matches!(q, Quantile::TooFewSamples { samples } if samples == 0.0), "{q:?}");
    }
    assert_eq!((quiet.output_token_rate, quiet.prompt_token_rate), (Some(0.0), Some(0.0)));
    // The finish-reason series exist from the start, so an idle engine's request rate is a
    // known 0 (the planner may give back capacity), not missing.
    assert_eq!(quiet.request_rate, Some(0.0));

    // Prometheus gone: every service missing, the error counted, nothing panics.
    let shared: Arc<dyn MetricsSource> = Arc::new(src);
    prometheus.stop();
    let seen = shared.observe(&requests).await;
    assert_eq!(seen.error.as_ref().map(|e| e.metric_label()), Some("unreachable"));
    assert_eq!(seen.services.len(), 2);
    for (freshness, metrics) in seen.services.values() {
        assert!(matches!(freshness, Freshness::Missing { .. }), "{freshness:?}");
        assert_eq!(*metrics, ServiceMetrics::missing());
    }
    drop((chat, idle));
}

/// The exposition with every sample at zero except the `_created` timestamps: the same vLLM
/// server just after it started.
fn at_start(recorded: &str) -> String {
    recorded
        .lines()
        .map(|line| {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            match line.rsplit_once(' ') {
                Some((series, _)) if !line.starts_with('#') && !name.ends_with("_created") => {
                    format!("{series} 0.0\n")
                }
                _ => format!("{line}\n"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_vllm_exposition_reads_as_computed_by_hand() {
    let recorded = include_str!("../data/vllm-metrics.txt");
    let start = at_start(recorded);
    // The file's percentiles, by hand (see its header) and by the histogram maths.
    let ttft_p95 = 0.5625;
    let itl_p95 = 0.05 + 0.025 * 810.0 / 1700.0;
    let e2e_p95 = 10.0 + 5.0 * 4.0 / 12.0;
    let (later, earlier) = (Exposition::parse(recorded).unwrap(), Exposition::parse(&start).unwrap());
    for (metric, want) in [(TTFT, ttft_p95), (ITL, itl_p95), (E2E, e2e_p95)] {
        let delta = later.histogram(metric, &[]).unwrap().since(&earlier.histogram(metric, &[]).unwrap());
        close(delta.quantile(0.95).unwrap(), want, metric);
    }

    // Two replicas of one service: one takes the traffic, the other stays idle at zero.
    let busy = StaticMetrics::start(start.clone()).await;
    let quiet = StaticMetrics::start(start.clone()).await;
    let targets = [
        ScrapeTarget::new(&busy.address, "llm", "llama", "llama-0"),
        ScrapeTarget::new(&quiet.address, "llm", "llama", "llama-1"),
    ];
    // A tenant's pod, scraped by a job that honours the labels it exposes, forges the
    // service's queue and load under its name: the planner must not see them.
    let forged = StaticMetrics::start(
        "vllm:num_requests_waiting{namespace=\"llm\",inferenceservice=\"llama\"} 1000\n\
         vllm:num_requests_running{namespace=\"llm\",inferenceservice=\"llama\"} 500\n\
         vllm:kv_cache_usage_perc{namespace=\"llm\",inferenceservice=\"llama\"} 1\n",
    )
    .await;
    let tenant_job = format!(
        "  - job_name: tenant\n    honor_labels: true\n    static_configs:\n      - targets: [\"{}\"]\n",
        forged.address
    );
    let prometheus = Prometheus::start_with_jobs(SCRAPE, &targets, &tenant_job).await;
    prometheus.wait_targets_up(3, 30).await;
    until_prometheus_says(
        &prometheus,
        r#"count(vllm:num_requests_running{job="pacer-engines",inferenceservice="llama"})"#,
        2.0,
    )
    .await;
    // The forgery is in Prometheus, under the victim's labels.
    until_prometheus_says(
        &prometheus,
        r#"sum(vllm:num_requests_waiting{namespace="llm",inferenceservice="llama"})"#,
        1000.0,
    )
    .await;
    busy.set(recorded);
    until_prometheus_says(&prometheus, r#"sum(vllm:request_success_total{pod="llama-0"})"#, 200.0).await;
    let at =
        prometheus.query_one(r#"timestamp(vllm:num_requests_running{pod="llama-0"})"#, None).await.unwrap();

    let window = 60.0;
    let requests = [request("llm", "llama", window), request("llm", "absent", window)];
    let src = source(&prometheus);
    let seen = src.observe_at(&requests, at).await;
    assert!(seen.error.is_none(), "{:?}", seen.error);
    let (fresh, m) = &seen.services[&ServiceKey::new("llm", "llama")];
    assert_eq!(*fresh, Freshness::Fresh);
    let value = |q: Quantile| q.seconds().zip(q.samples()).unwrap();
    let (ttft, ttft_n) = value(m.ttft);
    let (itl, itl_n) = value(m.itl);
    let (e2e, e2e_n) = value(m.e2e);
    close(ttft, ttft_p95, "TTFT P95");
    close(itl, itl_p95, "ITL P95");
    close(e2e, e2e_p95, "E2E P95");
    close(ttft_n, 200.0, "TTFT samples");
    close(itl_n, 29800.0, "ITL samples");
    close(e2e_n, 200.0, "E2E samples");
    close(m.request_rate.unwrap(), 200.0 / window, "request rate");
    close(m.prompt_token_rate.unwrap(), 102_400.0 / window, "prompt token rate");
    close(m.output_token_rate.unwrap(), 30_000.0 / window, "generation token rate");
    // Summed over the two replicas, without the forged series of the tenant's job.
    assert_eq!((m.running, m.waiting), (Some(7.0), Some(2.0)), "summed over replicas");
    // `avg_over_time` over the rate window: the scrapes at zero before the load and the one at 7.
    assert!(m.running_mean.is_some_and(|r| r > 0.0 && r < 7.0), "running mean {:?}", m.running_mean);
    close(m.kv_usage.unwrap(), 0.21, "KV usage averaged over replicas");
    assert_eq!(m.reporting_replicas, Some(2.0));
    // A service Prometheus has no series for is missing, with the reason.
    let (missing, _) = &seen.services[&ServiceKey::new("llm", "absent")];
    assert!(matches!(missing, Freshness::Missing { reason } if reason.contains("llm/absent")));

    // A replica goes away (its pod deleted): the target file is rewritten, Prometheus marks
    // its series stale, and the service reports one replica.
    prometheus.set_targets(&targets[..1]);
    prometheus.wait_targets_up(2, 30).await;
    eventually(30, "one reporting replica", || async {
        let seen = src.observe(&requests[..1]).await;
        (seen.services[&requests[0].service].1.reporting_replicas == Some(1.0)).then_some(())
    })
    .await;
}

/// Local mode's own scraper against a real Prometheus scraping the same two engines of one
/// service: the same P95s within bucket resolution and the same sample counts within PromQL's
/// extrapolation (the two targets are scraped at different instants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_source_agrees_with_prometheus_on_the_same_engines() {
    use pacer_local::source::{LocalSource, Target as LocalTarget};
    let _one = ONE_AT_A_TIME.lock().await;

    let logs = tempfile::tempdir().unwrap();
    let flags = ["--served-model-name=smol", "--tier=q4_0", "--max-batch-size=4", "--kv-cache-tokens=4096"];
    let (a, b) = tokio::join!(
        EngineProcess::start("chat-0", &flags, logs.path()),
        EngineProcess::start("chat-1", &flags, logs.path())
    );
    let prometheus = Prometheus::start(
        SCRAPE,
        &[
            ScrapeTarget::new(&a.address, "team-a", "chat", "chat-0"),
            ScrapeTarget::new(&b.address, "team-a", "chat", "chat-1"),
        ],
    )
    .await;
    prometheus.wait_targets_up(2, 30).await;
    let count = r#"sum(vllm:time_to_first_token_seconds_count{namespace="team-a", inferenceservice="chat"})"#;
    until_prometheus_says(&prometheus, count, 0.0).await;

    // The local scraper, on the same interval, from the same moment.
    let clock = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let local = Arc::new(LocalSource::new(ServiceKey::new("team-a", "chat"), SCRAPE, 600.0, Arc::new(clock)));
    let started = clock() - 1.0;
    let targets: Vec<LocalTarget> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(id, e)| LocalTarget { id: id as u32, started, url: format!("{}/metrics", e.url()) })
        .collect();
    let scraper = {
        let (local, targets) = (local.clone(), targets.clone());
        tokio::spawn(async move {
            loop {
                local.scrape(&targets).await;
                tokio::time::sleep(SCRAPE).await;
            }
        })
    };

    let plan = |seed| RunPlan {
        arrivals: Arrivals::Closed { concurrency: 3 },
        requests: 15,
        warmup: 0,
        input: Length::Uniform { min: 8, max: 48 },
        output: Length::Uniform { min: 4, max: 16 },
        shared_prefix: 0,
        seed,
        max_duration: Some(Duration::from_secs(60)),
        dataset: None,
        replay: None,
        turns: 1,
    };
    let target = |e: &EngineProcess| Target {
        base_url: e.url(),
        model: "smol".into(),
        endpoint: Endpoint::Chat,
        api_key: None,
        ignore_eos: true,
        tokenizer: None,
        keep_alive: false,
    };
    let (ta, tb) = (target(&a), target(&b));
    let (pa, pb) = (plan(5), plan(6));
    let (la, lb) = tokio::join!(run(&ta, &pa, || {}), run(&tb, &pb, || {}));
    let records: Vec<_> = la.records.iter().chain(&lb.records).collect();
    assert!(records.iter().all(|r| r.ok()), "every request succeeds");
    let sent = records.len() as f64;
    let finished =
        r#"sum(vllm:e2e_request_latency_seconds_count{namespace="team-a", inferenceservice="chat"})"#;
    until_prometheus_says(&prometheus, finished, sent).await;
    // Two more scrapes each, so both sources hold the final counters.
    tokio::time::sleep(3 * SCRAPE).await;

    let window = 120.0;
    let requests = [request("team-a", "chat", window)];
    let (_, theirs) =
        source(&prometheus).observe(&requests).await.services[&ServiceKey::new("team-a", "chat")].clone();
    let seen = local.observe(&requests);
    let (fresh, ours) = &seen.services[&ServiceKey::new("team-a", "chat")];
    assert_eq!(*fresh, Freshness::Fresh);
    scraper.abort();

    // Bucket bounds come from the engine's exposition.
    let exposition = Exposition::parse(&a.metrics().await).unwrap();
    for (name, metric, mine, prom) in [
        ("TTFT", TTFT, ours.ttft, theirs.ttft),
        ("ITL", ITL, ours.itl, theirs.itl),
        ("E2E", E2E, ours.e2e, theirs.e2e),
    ] {
        let (Quantile::Value { seconds: m, samples: ms }, Quantile::Value { seconds: p, samples: ps }) =
            (mine, prom)
        else {
            panic!("{name}: local {mine:?}, Prometheus {prom:?}")
        };
        let h = exposition.histogram(metric, &[]).unwrap();
        let (i, j) = (bucket_index(&h, m), bucket_index(&h, p));
        assert!(
            i.abs_diff(j) <= 1,
            "{name} P95: local {m} s and Prometheus {p} s are more than a bucket apart"
        );
        assert!((ms - ps).abs() <= 0.1 * ps, "{name} samples: local {ms}, Prometheus {ps}");
        eprintln!("{name} P95: local {m:.6} s ({ms} samples), Prometheus {p:.6} s ({ps} samples)");
    }
    assert_eq!(ours.ttft.samples(), Some(sent), "the local source counts every request exactly");
    // Rates are not compared here: Prometheus divides a counter's increase by the whole range
    // asked for, the local ring by the span its scrapes cover, and these engines are younger
    // than the window. (Once the engines are older than the rate window, the two agree.)
    assert_eq!(ours.reporting_replicas, Some(2.0));
    assert_eq!(ours.reporting_replicas, theirs.reporting_replicas);
    drop((a, b));
}
