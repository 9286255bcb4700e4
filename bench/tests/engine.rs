//! pacer-bench against the real engine: the tokens it counts are the tokens the engine says it
//! generated (`vllm:generation_tokens_total`).

#![allow(clippy::unwrap_used)]

use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::metrics::TokenSource;
use pacer_bench::run::{RunPlan, run};
use pacer_engine::scheduler::BatchSettings;
use pacer_engine::server::{self, ServeConfig};
use pacer_engine::{LoadedModel, Tier};
use std::sync::Arc;
use std::time::Duration;

async fn generated_total(url: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with("vllm:generation_tokens_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap()
}

/// Chat requests of fixed length (`ignore_eos`) to the engine at `url`.
fn chat_target(url: &str) -> Target {
    Target {
        base_url: url.into(),
        model: "smol".into(),
        endpoint: Endpoint::Chat,
        api_key: None,
        ignore_eos: true,
        tokenizer: None,
        keep_alive: false,
    }
}

/// Starts the real engine (q4_0) on a free loopback port; returns its URL once ready.
async fn start_engine() -> String {
    let path = std::env::var_os("PACER_MODEL")
        .map(std::path::PathBuf::from)
        .or_else(pacer_engine::default_model_path)
        .filter(|p| p.exists())
        .expect("model not found: run scripts/fetch-model.sh or set PACER_MODEL");
    let model = Arc::new(LoadedModel::open(&path, Tier::Q4_0).unwrap());
    let config = ServeConfig {
        served_name: "smol".into(),
        api_key: None,
        settings: BatchSettings::default(),
        settings_file: None,
        max_waiting: 64,
        kv_cache_tokens: 8192,
        prefix_caching: true,
        drain_timeout: Duration::from_secs(10),
        max_body_bytes: 1 << 20,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        max_connections: 64,
        log_prompts: false,
        max_buffered_bytes: 64 << 20,
        stall_timeout: Duration::from_secs(60),
    };
    let srv = server::build(model, &config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(server::serve(listener, srv, config.drain_timeout, std::future::pending()));
    while reqwest::get(format!("{url}/ready")).await.map_or(true, |r| r.status() != 200) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_equal_the_engines_generation_counter() {
    let url = start_engine().await;
    let before = generated_total(&url).await;
    let target = chat_target(&url);
    let plan = RunPlan {
        arrivals: Arrivals::Closed { concurrency: 4 },
        requests: 8,
        warmup: 0,
        input: Length::Uniform { min: 8, max: 40 },
        output: Length::Uniform { min: 4, max: 24 },
        shared_prefix: 4,
        seed: 5,
        max_duration: None,
        dataset: None,
        replay: None,
        turns: 1,
    };
    let result = run(&target, &plan, || {}).await;
    let counted: usize = result.records.iter().map(|r| r.output_tokens).sum();
    assert!(result.records.iter().all(|r| r.ok() && r.token_source == TokenSource::Usage));
    assert_eq!(counted as f64, generated_total(&url).await - before);
    // With one token per SSE event, content events match the usage count too.
    assert!(result.records.iter().all(|r| r.content_events.len() <= r.output_tokens));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_sessions_carry_their_history() {
    let url = start_engine().await;
    let target = chat_target(&url);
    let plan = RunPlan {
        arrivals: Arrivals::Closed { concurrency: 2 },
        requests: 3,
        warmup: 0,
        input: Length::Fixed { n: 12 },
        output: Length::Fixed { n: 6 },
        shared_prefix: 0,
        seed: 9,
        max_duration: None,
        dataset: None,
        replay: None,
        turns: 3,
    };
    let result = run(&target, &plan, || {}).await;
    assert_eq!(result.records.len(), 9, "3 sessions × 3 turns");
    for session in result.records.chunks(3) {
        assert!(session.iter().all(|r| r.ok()));
        // Each turn's prompt holds the previous turns and answers, so it only grows.
        assert!(
            session[0].prompt_tokens < session[1].prompt_tokens
                && session[1].prompt_tokens < session[2].prompt_tokens
        );
        assert!(
            session[1].sent >= session[0].closed && session[2].sent >= session[1].closed,
            "turns follow answers"
        );
    }
}
