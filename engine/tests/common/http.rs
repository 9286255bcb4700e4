//! The server over real HTTP: a started `pacer-engine serve` on a free loopback port, and the
//! requests and SSE parsing the server tests share.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use pacer_engine::Tier;
use pacer_engine::scheduler::BatchSettings;
use pacer_engine::server::{self, ServeConfig};
use serde_json::{Value, json};
use std::time::Duration;

pub const MODEL: &str = "smol";

pub fn config() -> ServeConfig {
    ServeConfig {
        served_name: MODEL.into(),
        api_key: None,
        settings: BatchSettings::default(),
        settings_file: None,
        max_waiting: 64,
        kv_cache_tokens: 8192,
        prefix_caching: true,
        drain_timeout: Duration::from_secs(30),
        max_body_bytes: 1 << 20,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        max_connections: 64,
        log_prompts: false,
        max_buffered_bytes: 64 << 20,
        stall_timeout: Duration::from_secs(60),
    }
}

/// Starts a server on a free loopback port; returns its base URL. It lives until the test's
/// runtime ends.
pub async fn start(config: ServeConfig) -> String {
    start_with(super::loaded(Tier::Q4_0), config).await
}

/// As [`start`], serving `model` (another tier or device).
pub async fn start_with(model: std::sync::Arc<pacer_engine::LoadedModel>, config: ServeConfig) -> String {
    start_server(model, config).await.0
}

/// As [`start_with`], also returning the scheduler's handle (for its test-only fault hook).
pub async fn start_server(
    model: std::sync::Arc<pacer_engine::LoadedModel>,
    config: ServeConfig,
) -> (String, pacer_engine::scheduler::SchedulerHandle) {
    let srv = server::build(model, &config).unwrap();
    let scheduler = srv.scheduler.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(server::serve(listener, srv, config.drain_timeout, std::future::pending()));
    wait_ready(&url).await;
    (url, scheduler)
}

/// Waits until `{url}/ready` answers 200. No kept-alive probe connection: it would hold one
/// of `max_connections` for a while after this returns (a test of the limit once lost a slot
/// to it).
async fn wait_ready(url: &str) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    for _ in 0..200 {
        if client.get(format!("{url}/ready")).send().await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("server at {url} never became ready");
}

/// As [`start`], with `/health`, `/ready` and `/metrics` also on a probe port of their own;
/// returns the API's base URL and the probe port's.
pub async fn start_with_probes(config: ServeConfig) -> (String, String) {
    let srv = server::build(super::loaded(Tier::Q4_0), &config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let probes = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let probe_url = format!("http://{}", probes.local_addr().unwrap());
    tokio::spawn(server::serve_with_probes(
        listener,
        Some(probes),
        srv,
        config.drain_timeout,
        std::future::pending(),
    ));
    wait_ready(&probe_url).await;
    (url, probe_url)
}

pub fn chat(content: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "every SSE event ends with a blank line: {body:?}");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}")).to_string())
        .collect()
}

pub async fn post(url: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new().post(format!("{url}{path}")).json(body).send().await.unwrap()
}

pub async fn metric(url: &str, prefix: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric line starting with {prefix}"))
}

/// Four streaming completions of 400 tokens each (`ignore_eos`), started at once; each task
/// returns when every token event of its stream arrived (events read together share a time).
pub fn four_streams(
    client: &reqwest::Client,
    url: &str,
) -> Vec<tokio::task::JoinHandle<Vec<std::time::Instant>>> {
    (0..4)
        .map(|i| {
            let body = json!({
                "model": MODEL, "prompt": format!("Stream {i}: the history of the sea, told slowly."),
                "max_tokens": 400, "ignore_eos": true, "temperature": 0, "stream": true,
            });
            let (client, url) = (client.clone(), url.to_string());
            tokio::spawn(async move {
                let mut r = client.post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                let mut times = Vec::new();
                while let Some(chunk) = r.chunk().await.unwrap() {
                    let events = String::from_utf8_lossy(&chunk).matches("data: {").count();
                    times.extend(std::iter::repeat_n(std::time::Instant::now(), events));
                }
                times
            })
        })
        .collect()
}
