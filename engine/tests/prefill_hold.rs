//! The prompt hold (`prefill_hold_ms`) with the real model: short prompts arriving one by one
//! while streams decode start together instead of one step each, so the streams see fewer long
//! gaps; every held prompt still starts within its hold, and the same run without a hold shows
//! the long gaps this saves, so the test can tell the two apart.
//!
//! Gaps are measured where a user sees them: between token events of the streaming responses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::http::{MODEL, config, four_streams, start};
use pacer_engine::scheduler::BatchSettings;
use serde_json::json;
use std::time::{Duration, Instant};

/// Held by each test for its whole run. Both measure step timing on the machine's cores, and the
/// harness runs a file's tests side by side: one test's 1,200-token prompts starved the other's
/// streams (fewer than 8 decode gaps in 400 ms), a failure of the run, not of the engine.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Prompts sent beside the streams, 25 ms apart.
const PROMPTS: usize = 8;

/// What one run saw: per stream, its gaps between the first prompt sent and the last answered;
/// the median of the streams' gaps before that (a decode step); each prompt's time to its answer.
struct Run {
    gaps: Vec<Vec<Duration>>,
    decode: Duration,
    answers: Vec<Duration>,
}

/// Four streams decode; once they run, [`PROMPTS`] short prompts arrive 25 ms apart.
async fn prompts_beside_streams(prefill_hold_ms: u64) -> Run {
    let mut cfg = config();
    cfg.settings = BatchSettings { prefill_hold_ms, ..BatchSettings::default() };
    let url = start(cfg).await;
    let client = reqwest::Client::new();
    let streams = four_streams(&client, &url);
    // Let every stream reach its decode phase, and time its steps for 400 ms.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sent = Instant::now();
    let mut prompts = Vec::new();
    for i in 0..PROMPTS {
        // 120 words, so a step carrying one prompt is well over three decode steps even where
        // AMX tiles prefill it fast (at 50 words it was about three there, and runs without a
        // hold showed only 4 long gaps).
        let body = json!({
            "model": MODEL, "prompt": format!("{i} {}", "sea ".repeat(120)), "max_tokens": 1, "temperature": 0,
        });
        let (client, url) = (client.clone(), url.clone());
        prompts.push(tokio::spawn(async move {
            let at = Instant::now();
            let r = client.post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
            (at.elapsed(), Instant::now())
        }));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut answers = Vec::new();
    let mut done = sent;
    for p in prompts {
        let (took, at) = p.await.unwrap();
        answers.push(took);
        done = done.max(at);
    }
    let (mut gaps, mut before) = (Vec::new(), Vec::new());
    for s in streams {
        let times = s.await.unwrap();
        assert!(times.last().unwrap() > &done, "a stream ended before the prompts were answered");
        gaps.push(times.windows(2).filter(|w| w[0] >= sent && w[1] <= done).map(|w| w[1] - w[0]).collect());
        // Events that arrived in one read share a time: those gaps say nothing of a step.
        let real = |d: &Duration| *d >= Duration::from_millis(1);
        let steady = sent - Duration::from_millis(400);
        before.extend(
            times.windows(2).filter(|w| w[0] >= steady && w[1] < sent).map(|w| w[1] - w[0]).filter(real),
        );
    }
    before.sort();
    assert!(before.len() >= 8, "the streams barely ran before the prompts: {before:?}");
    Run { gaps, decode: before[before.len() / 2], answers }
}

/// Per stream, the gaps over three decode steps (steps that carried prompt work; a noisy
/// decode step on a busy 2-core machine reaches twice its median, a prompt step seven times).
fn long_gaps(run: &Run) -> Vec<usize> {
    run.gaps.iter().map(|g| g.iter().filter(|&&d| d > 3 * run.decode).count()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_prompts_start_together_and_within_their_hold() {
    let _alone = ALONE.lock().await;
    const HOLD_MS: u64 = 2000;
    let held = prompts_beside_streams(HOLD_MS).await;
    let plain = prompts_beside_streams(0).await;
    let (held_long, plain_long) = (long_gaps(&held), long_gaps(&plain));
    eprintln!(
        "long gaps per stream: hold {HOLD_MS} ms {held_long:?}, no hold {plain_long:?} (decode steps {:?} and {:?}); \
         answers with the hold {:?}, without {:?}",
        held.decode, plain.decode, held.answers, plain.answers
    );
    // Every held prompt started within its hold (plus the step that ran it and the HTTP trip).
    for a in &held.answers {
        assert!(*a < Duration::from_millis(HOLD_MS + 1500), "a held prompt waited {a:?}");
    }
    // Without a hold the prompts go in one or two a step; with it, a few steps carry them all.
    let (most_held, least_plain) = (*held_long.iter().max().unwrap(), *plain_long.iter().min().unwrap());
    assert!(least_plain >= 4, "without a hold only {plain_long:?} long gaps: the run cannot tell");
    assert!(
        2 * most_held <= least_plain,
        "the hold saved too few long gaps: {held_long:?} against {plain_long:?}"
    );
}

/// Steps the server has run with more rows than the default token budget (512).
async fn steps_over_the_token_budget(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    let value = |pick: &dyn Fn(&str) -> bool| -> f64 {
        let line = text.lines().find(|l| pick(l)).unwrap_or_else(|| panic!("no batch-size line in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let all = value(&|l| l.starts_with("pacer_engine_batch_size_count"));
    let within = value(&|l| l.starts_with("pacer_engine_batch_size_bucket") && l.contains("le=\"512\""));
    (all - within) as u64
}

/// A prompt of over a thousand tokens, answered with one token; returns its prompt tokens.
async fn long_prompt(url: &str, word: &str) -> u64 {
    let body = json!({ "model": MODEL, "prompt": word.repeat(1200), "max_tokens": 1, "temperature": 0 });
    let r = common::http::post(url, "/v1/completions", &body).await;
    assert_eq!(r.status(), 200);
    let answer: serde_json::Value = r.json().await.unwrap();
    answer["usage"]["prompt_tokens"].as_u64().unwrap()
}

/// With the hold on, a long prompt is one step whether it arrives alone or beside streams
/// (while long gaps are rare, or once its hold is up): one long gap instead of a train of
/// budget-sized ones. Without the hold, the token budget and the ITL budget cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_hold_a_long_prompt_is_one_step_alone_or_beside_streams() {
    let _alone = ALONE.lock().await;
    for hold_ms in [2000, 0] {
        let mut cfg = config();
        cfg.settings = BatchSettings { prefill_hold_ms: hold_ms, ..BatchSettings::default() };
        assert_eq!(cfg.settings.max_num_batched_tokens, 512);
        let url = start(cfg).await;
        let tokens = long_prompt(&url, "sea ").await;
        assert!(tokens > 1024, "the prompt is only {tokens} tokens: it fits the token budget twice");
        let alone = steps_over_the_token_budget(&url).await;
        let client = reqwest::Client::new();
        let streams = four_streams(&client, &url);
        tokio::time::sleep(Duration::from_millis(800)).await;
        // Other words, so the prefix cache does not hold it.
        long_prompt(&url, "wave ").await;
        for s in streams {
            s.await.unwrap();
        }
        let beside = steps_over_the_token_budget(&url).await - alone;
        eprintln!(
            "hold {hold_ms} ms: {tokens}-token prompt; steps over 512 rows alone {alone}, beside streams {beside}"
        );
        let expected = if hold_ms > 0 { 1 } else { 0 };
        assert_eq!((alone, beside), (expected, expected), "hold {hold_ms} ms");
    }
}
