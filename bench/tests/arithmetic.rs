//! pacer-bench against a scripted in-process SSE server: a fake server is the right tool here,
//! because it makes the true timings known, so each metric can be checked against them.

#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::response::sse::{Event, Sse};
use axum::routing::post;
use futures::stream::{self, StreamExt};
use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::metrics::TokenSource;
use pacer_bench::run::{RunPlan, run};
use std::convert::Infallible;
use std::time::Duration;

const FIRST_MS: u64 = 60;
const GAP_MS: u64 = 30;

/// Chat: role chunk at once, 5 content chunks (first after 60 ms, then every 30 ms), a usage
/// chunk, [DONE]. Completions: 3 text chunks every 30 ms and no usage.
async fn serve() -> String {
    let chat = post(|| async {
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#.to_string();
        let events = stream::iter(vec![(0, role)])
            .chain(stream::iter(0..5).map(|i| {
                let wait = if i == 0 { FIRST_MS } else { GAP_MS };
                (wait, format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"t{i}"}}}}]}}"#))
            }))
            .chain(stream::iter(vec![
                (0, r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#.to_string()),
                (0, "[DONE]".to_string()),
            ]))
            .then(|(wait, data)| async move {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Ok::<_, Infallible>(Event::default().data(data))
            });
        Sse::new(events)
    });
    let completions = post(|| async {
        let events = stream::iter(0..3)
            .map(|i| format!(r#"{{"choices":[{{"index":0,"text":"w{i}"}}]}}"#))
            .chain(stream::iter(vec!["[DONE]".to_string()]))
            .then(|data| async move {
                tokio::time::sleep(Duration::from_millis(GAP_MS)).await;
                Ok::<_, Infallible>(Event::default().data(data))
            });
        Sse::new(events)
    });
    let app = Router::new().route("/v1/chat/completions", chat).route("/v1/completions", completions);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn plan(arrivals: Arrivals, requests: usize) -> RunPlan {
    RunPlan {
        arrivals,
        requests,
        warmup: 0,
        input: Length::Fixed { n: 8 },
        output: Length::Fixed { n: 5 },
        shared_prefix: 0,
        seed: 1,
        max_duration: None,
        dataset: None,
        replay: None,
        turns: 1,
    }
}

fn target(url: &str, endpoint: Endpoint) -> Target {
    Target {
        base_url: url.into(),
        model: "m".into(),
        endpoint,
        api_key: None,
        ignore_eos: false,
        tokenizer: None,
        keep_alive: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_scripted_timeline() {
    let url = serve().await;
    let result =
        run(&target(&url, Endpoint::Chat), &plan(Arrivals::Closed { concurrency: 2 }, 6), || {}).await;
    assert_eq!(result.records.len(), 6);
    for r in &result.records {
        assert!(r.ok(), "{:?}", r.error);
        assert_eq!(r.content_events.len(), 5, "role and usage chunks are not content");
        assert_eq!((r.output_tokens, r.prompt_tokens, r.token_source), (5, 7, TokenSource::Usage));
        let ttft = r.ttft().unwrap() * 1e3;
        assert!((FIRST_MS as f64..FIRST_MS as f64 + 40.0).contains(&ttft), "TTFT {ttft} ms");
        for gap in r.itls() {
            let gap = gap * 1e3;
            assert!((GAP_MS as f64 - 5.0..GAP_MS as f64 + 40.0).contains(&gap), "ITL {gap} ms");
        }
        let tpot = r.tpot().unwrap() * 1e3;
        assert!((GAP_MS as f64 - 5.0..GAP_MS as f64 + 20.0).contains(&tpot), "TPOT {tpot} ms");
        // E2E = TTFT + (N − 1)·TPOT, exactly, by the definitions.
        assert!((r.e2e().unwrap() - (r.ttft().unwrap() + 4.0 * r.tpot().unwrap())).abs() < 1e-9);
    }
    // Two in flight, six requests of ~180 ms each: three rounds.
    assert!((0.5..1.2).contains(&result.duration), "{}", result.duration);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_tokens_are_counted_from_events() {
    let url = serve().await;
    let result =
        run(&target(&url, Endpoint::Completions), &plan(Arrivals::Closed { concurrency: 1 }, 2), || {}).await;
    for r in &result.records {
        assert!(r.ok(), "{:?}", r.error);
        assert_eq!((r.output_tokens, r.token_source), (3, TokenSource::Events));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_on_schedule() {
    let url = serve().await;
    let arrivals = Arrivals::Open { rate: 20.0, burstiness: f64::INFINITY, ramp_to: None };
    let result = run(&target(&url, Endpoint::Chat), &plan(arrivals, 10), || {}).await;
    assert_eq!(result.records.len(), 10);
    for (i, r) in result.records.iter().enumerate() {
        assert!((r.scheduled - i as f64 * 0.05).abs() < 1e-9, "constant rate: every 50 ms");
        let lag = r.schedule_lag() * 1e3;
        assert!((0.0..20.0).contains(&lag), "request {i} sent {lag} ms late");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_replays_at_its_timestamps() {
    let url = serve().await;
    let items = pacer_bench::dataset::parse(
        "{\"prompt\": \"a\", \"timestamp\": 5.0}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"b\"}], \"timestamp\": 5.1, \"max_tokens\": 2}\n\
         {\"prompt\": \"c\", \"timestamp\": 5.3}",
    )
    .unwrap();
    let replay = pacer_bench::dataset::replay_schedule(&items, 1.0).unwrap();
    let plan = RunPlan {
        dataset: Some(items),
        replay: Some(replay),
        ..plan(Arrivals::Closed { concurrency: 1 }, 3)
    };
    let result = run(&target(&url, Endpoint::Chat), &plan, || {}).await;
    let scheduled: Vec<f64> = result.records.iter().map(|r| r.scheduled).collect();
    for (got, want) in scheduled.iter().zip([0.0, 0.1, 0.3]) {
        assert!((got - want).abs() < 1e-9, "{scheduled:?}");
    }
    assert!(
        result.records.iter().all(|r| r.ok() && r.schedule_lag() < 0.02),
        "replay is open loop and on time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_a_local_tokenizer_counts_the_generated_text() {
    let url = serve().await;
    let gguf = std::env::var_os("PACER_MODEL")
        .map(std::path::PathBuf::from)
        .or_else(pacer_engine::default_model_path)
        .filter(|p| p.exists())
        .expect("model not found: run scripts/fetch-model.sh or set PACER_MODEL");
    let counter = pacer_bench::tokens::TokenCounter::open(&gguf).unwrap();
    let want = counter.count("w0w1w2");
    let target =
        Target { tokenizer: Some(std::sync::Arc::new(counter)), ..target(&url, Endpoint::Completions) };
    let result = run(&target, &plan(Arrivals::Closed { concurrency: 1 }, 1), || {}).await;
    let r = &result.records[0];
    assert_eq!((r.output_tokens, r.token_source), (want, TokenSource::Tokenizer));
    assert!(want >= 3, "the SmolLM2 tokenizer splits digits, so w0w1w2 is at least 3 tokens");
}

/// The load generator's SplitMix64 is the engine's, bit for bit: seeded schedules and prompts
/// (and the simulator's traces, drawn with it) stay what they were when the two shared one type.
#[test]
fn the_load_generator_draws_the_engines_splitmix64_stream() {
    for seed in [0, 1, 7, 42, u64::MAX] {
        let mut ours = pacer_bench::load::Rng::new(seed);
        let mut engine = pacer_engine::sampling::SplitMix64::new(seed);
        for _ in 0..1000 {
            assert_eq!(ours.next_u64(), engine.next_u64(), "seed {seed}");
        }
    }
}
