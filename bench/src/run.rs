//! Drives a run: warm-up, then requests sent on the chosen arrival shape, each timed by
//! [`client::send`]; returns every request's record and the measured window.

use crate::client::{self, Target};
use crate::load::{Arrivals, Length, Rng, synthetic_prompt};
use crate::metrics::RequestRecord;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What to send.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// Arrival shape.
    pub arrivals: Arrivals,
    /// Measured requests.
    pub requests: usize,
    /// Requests sent (closed loop, one at a time) before measuring, and discarded.
    pub warmup: usize,
    /// Prompt length (≈ tokens).
    pub input: Length,
    /// `max_tokens` per request.
    pub output: Length,
    /// Words every prompt starts with (a shared system prompt).
    pub shared_prefix: usize,
    /// Seed for prompts, lengths and the schedule.
    pub seed: u64,
    /// Stop scheduling new requests after this long.
    pub max_duration: Option<Duration>,
    /// Requests from a file, used in order (cycled when shorter than the run) instead of
    /// synthetic prompts.
    pub dataset: Option<Vec<crate::dataset::DatasetItem>>,
    /// Send times from the dataset's timestamps (open loop), instead of `arrivals`' schedule.
    pub replay: Option<Vec<f64>>,
    /// Turns per conversation (chat): each of `requests` is a session whose next user turn,
    /// with the history and the assistant's reply, is sent when the previous answer ends.
    pub turns: usize,
}

/// One conversation: the first request, then each follow-up user turn with the history.
async fn session(
    client: &reqwest::Client,
    target: &Target,
    first: &serde_json::Value,
    follow_ups: &[String],
    epoch: Instant,
    scheduled: f64,
) -> Vec<RequestRecord> {
    let mut body = first.clone();
    let mut records = Vec::with_capacity(follow_ups.len() + 1);
    let mut at = scheduled;
    for turn in 0..=follow_ups.len() {
        let (rec, reply) = client::send_with_text(client, target, &body, epoch, at).await;
        let failed = !rec.ok();
        records.push(rec);
        if failed || turn == follow_ups.len() {
            break;
        }
        if let Some(messages) = body.get_mut("messages").and_then(serde_json::Value::as_array_mut) {
            messages.push(serde_json::json!({"role": "assistant", "content": reply}));
            messages.push(serde_json::json!({"role": "user", "content": follow_ups[turn]}));
        }
        at = epoch.elapsed().as_secs_f64();
    }
    records
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// One record per measured request (sent ones only, in schedule order).
    pub records: Vec<RequestRecord>,
    /// Seconds from the first send to the last stream closing.
    pub duration: f64,
}

/// Runs `plan` against `target`; `on_done` is called after each measured request (progress).
pub async fn run(target: &Target, plan: &RunPlan, on_done: impl Fn() + Send + Sync + 'static) -> RunResult {
    let client = client::http_client(target);
    let mut rng = Rng::new(plan.seed);
    let bodies: Vec<serde_json::Value> = (0..plan.requests + plan.warmup)
        .map(|i| match &plan.dataset {
            Some(items) => {
                let item = &items[i % items.len()];
                // The caller validated every item against the endpoint (`body_for_item`).
                client::body_for_item(target, item, plan.output.sample(&mut rng)).unwrap_or_default()
            }
            None => {
                let prompt = synthetic_prompt(plan.input.sample(&mut rng), plan.shared_prefix, &mut rng);
                client::body(target, &prompt, plan.output.sample(&mut rng))
            }
        })
        .collect();
    let warm_epoch = Instant::now();
    for b in &bodies[plan.requests..] {
        let _ = client::send(&client, target, b, warm_epoch, 0.0).await;
    }
    let bodies = Arc::new(bodies[..plan.requests].to_vec());
    let follow_ups: Arc<Vec<Vec<String>>> = Arc::new(
        (0..plan.requests)
            .map(|_| {
                (1..plan.turns.max(1))
                    .map(|_| synthetic_prompt(plan.input.sample(&mut rng), 0, &mut rng))
                    .collect()
            })
            .collect(),
    );
    let schedule = match &plan.replay {
        Some(times) => times.iter().copied().cycle().take(plan.requests).collect(),
        None => plan.arrivals.schedule(plan.requests, &mut rng),
    };
    let open_loop = plan.replay.is_some() || matches!(plan.arrivals, Arrivals::Open { .. });
    let epoch = Instant::now();
    let deadline = plan.max_duration.map(|d| d.as_secs_f64());
    let on_done = Arc::new(on_done);
    let mut records: Vec<Option<Vec<RequestRecord>>> = vec![None; plan.requests];
    if open_loop {
        {
            let mut tasks = Vec::with_capacity(plan.requests);
            for (i, &at) in schedule.iter().enumerate() {
                if deadline.is_some_and(|d| at > d) {
                    break;
                }
                tokio::time::sleep_until((epoch + Duration::from_secs_f64(at)).into()).await;
                let (client, target, bodies, on_done, follow_ups) =
                    (client.clone(), target.clone(), bodies.clone(), on_done.clone(), follow_ups.clone());
                tasks.push(tokio::spawn(async move {
                    let r = session(&client, &target, &bodies[i], &follow_ups[i], epoch, at).await;
                    on_done();
                    (i, r)
                }));
            }
            for t in tasks {
                if let Ok((i, r)) = t.await {
                    records[i] = Some(r);
                }
            }
        }
    } else {
        let concurrency = match plan.arrivals {
            Arrivals::Closed { concurrency } => concurrency,
            Arrivals::Open { .. } => 1,
        };
        {
            let next = Arc::new(AtomicUsize::new(0));
            let workers: Vec<_> = (0..concurrency.max(1))
                .map(|_| {
                    let (client, target, bodies, on_done, next, follow_ups) = (
                        client.clone(),
                        target.clone(),
                        bodies.clone(),
                        on_done.clone(),
                        next.clone(),
                        follow_ups.clone(),
                    );
                    tokio::spawn(async move {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let now = epoch.elapsed().as_secs_f64();
                            if i >= bodies.len() || deadline.is_some_and(|d| now > d) {
                                return mine;
                            }
                            mine.push((
                                i,
                                session(&client, &target, &bodies[i], &follow_ups[i], epoch, now).await,
                            ));
                            on_done();
                        }
                    })
                })
                .collect();
            for w in workers {
                if let Ok(done) = w.await {
                    for (i, r) in done {
                        records[i] = Some(r);
                    }
                }
            }
        }
    }
    let records: Vec<RequestRecord> = records.into_iter().flatten().flatten().collect();
    let first = records.iter().map(|r| r.sent).fold(f64::INFINITY, f64::min);
    let last = records.iter().map(|r| r.closed).fold(0.0, f64::max);
    RunResult { duration: if records.is_empty() { 0.0 } else { last - first }, records }
}
