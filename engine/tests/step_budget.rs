//! The ITL budget with the real model: a 2,000-token prompt arriving while streams decode is
//! fed in chunks sized so each step stays within `max_step_ms`, so the running streams' gaps
//! stay near the budget instead of jumping to the length of a full 512-token chunk. The same
//! run without a budget shows the gaps this prevents, so the test can tell the two apart.
//!
//! Gaps are measured where a user sees them: between token events of the streaming responses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::http::{MODEL, config, four_streams, start};
use pacer_engine::scheduler::BatchSettings;
use serde_json::json;
use std::time::{Duration, Instant};

const BUDGET_MS: u64 = 100;

/// Streams four decoding requests, sends a 2,000-token prompt once they all run, and returns
/// every gap between token events of the four streams while the long prompt is prefilled.
async fn gaps_behind_a_long_prompt(max_step_ms: u64) -> Vec<Duration> {
    let mut cfg = config();
    cfg.settings = BatchSettings { max_step_ms, ..BatchSettings::default() };
    let url = start(cfg).await;
    let client = reqwest::Client::new();
    let streams = four_streams(&client, &url);
    // Let every stream reach its decode phase.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let long = json!({
        "model": MODEL, "prompt": "sea ".repeat(2000), "max_tokens": 1, "temperature": 0,
    });
    let sent = Instant::now();
    let r = client.post(format!("{url}/v1/completions")).json(&long).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let usage: serde_json::Value = r.json().await.unwrap();
    let done = Instant::now();
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() >= 1900, "{usage}");
    let mut gaps = Vec::new();
    for s in streams {
        let times = s.await.unwrap();
        assert!(times.last().unwrap() > &done, "a stream ended before the long prompt was done");
        gaps.extend(times.windows(2).filter(|w| w[0] >= sent && w[1] <= done).map(|w| w[1] - w[0]));
    }
    gaps.sort();
    gaps
}

fn p99(gaps: &[Duration]) -> Duration {
    gaps[(gaps.len() * 99 / 100).min(gaps.len() - 1)]
}

fn report(what: &str, gaps: &[Duration]) {
    let at = |q: usize| gaps.get((gaps.len() * q / 100).min(gaps.len().saturating_sub(1))).copied();
    eprintln!("{what}: {} gaps, P50 {:?}, P99 {:?}, worst {:?}", gaps.len(), at(50), at(99), gaps.last());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gap_behind_a_2000_token_prompt_stays_within_twice_the_budget() {
    let bounded = gaps_behind_a_long_prompt(BUDGET_MS).await;
    report(&format!("max_step_ms {BUDGET_MS}"), &bounded);
    assert!(bounded.len() >= 20, "too few gaps to judge: {}", bounded.len());
    let limit = Duration::from_millis(2 * BUDGET_MS);
    assert!(p99(&bounded) <= limit, "P99 gap {:?} over {limit:?}: {bounded:?}", p99(&bounded));

    // Without a budget the same prompt goes in full-budget chunks, and the streams wait for them.
    let unbounded = gaps_behind_a_long_prompt(0).await;
    report("no time budget", &unbounded);
    let worst = unbounded.last().copied().unwrap_or_default();
    assert!(worst > limit, "without a budget the worst gap was only {worst:?}: {unbounded:?}");
}
