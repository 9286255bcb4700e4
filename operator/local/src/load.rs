//! Built-in traffic for local mode, made with `pacer-bench`'s generator (open-loop arrival
//! schedules, synthetic prompts, streaming requests timed per SSE event): a profile is a list
//! of phases, each a rate held for a duration. Records are kept as requests finish, so a run
//! stopped by Ctrl-C still reports what was sent.

use pacer_bench::client::{self, Endpoint, Target};
use pacer_bench::load::{Arrivals, Rng, synthetic_prompt};
use pacer_bench::metrics::RequestRecord;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One phase: `rate` requests per second (Poisson) for `seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phase {
    /// Requests per second.
    pub rate: f64,
    /// How long, in seconds.
    pub seconds: f64,
}

/// A load profile and the shape of its requests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Prompt length, ≈ tokens.
    pub input_tokens: usize,
    /// Output tokens per request (the engine ignores end-of-sequence so every answer has them).
    pub output_tokens: usize,
    /// Seed of the schedule and the prompts.
    pub seed: u64,
}

impl Profile {
    /// Light → heavy → light, as measured on a 2-core machine with one compute thread per
    /// replica: one replica holds 1 request/s (64 prompt tokens, 32 generated) well inside
    /// the local config's targets and saturates near 2.8/s, so 3.5/s needs a second replica.
    pub fn step(light: f64, heavy: f64, seconds: [f64; 3]) -> Profile {
        Profile {
            phases: vec![
                Phase { rate: light, seconds: seconds[0] },
                Phase { rate: heavy, seconds: seconds[1] },
                Phase { rate: light, seconds: seconds[2] },
            ],
            input_tokens: 64,
            output_tokens: 32,
            seed: 7,
        }
    }

    /// The default step: 45 s at 1/s, 110 s at 3.5/s, 115 s at 1/s (4.5 minutes).
    pub fn default_step() -> Profile {
        Profile::step(1.0, 3.5, [45.0, 110.0, 115.0])
    }

    /// Seconds the whole profile lasts.
    pub fn seconds(&self) -> f64 {
        self.phases.iter().map(|p| p.seconds).sum()
    }

    /// Send times (seconds from the start) of every request: each phase's Poisson schedule,
    /// cut at the phase's end and shifted to its start.
    pub fn schedule(&self) -> Vec<f64> {
        let mut rng = Rng::new(self.seed);
        let mut times = Vec::new();
        let mut start = 0.0;
        for p in &self.phases {
            if p.rate > 0.0 {
                let n = (p.rate * p.seconds * 2.0).ceil() as usize + 1;
                let arrivals = Arrivals::Open { rate: p.rate, burstiness: 1.0, ramp_to: None };
                times.extend(
                    arrivals
                        .schedule(n, &mut rng)
                        .into_iter()
                        .take_while(|t| *t < p.seconds)
                        .map(|t| start + t),
                );
            }
            start += p.seconds;
        }
        times
    }
}

/// A running load: its records so far.
#[derive(Debug, Clone, Default)]
pub struct Records(Arc<Mutex<Vec<RequestRecord>>>);

impl Records {
    /// Every finished request so far (times in seconds from the load's start).
    pub fn snapshot(&self) -> Vec<RequestRecord> {
        self.0.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Sends `profile` to the router at `base_url` for model `model` until it ends or `stop`
/// fires; returns when every sent request has finished. `records` fills as they do.
pub async fn drive(
    base_url: String,
    model: String,
    profile: Profile,
    records: Records,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let target = Target {
        base_url,
        model,
        endpoint: Endpoint::Completions,
        api_key: None,
        ignore_eos: true,
        tokenizer: None,
        // Pacer's own router keeps connections open as it announces.
        keep_alive: true,
    };
    let http = client::http_client(&target);
    let mut rng = Rng::new(profile.seed ^ 0x5eed);
    let epoch = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for at in profile.schedule() {
        let when = epoch + Duration::from_secs_f64(at);
        tokio::select! {
            () = tokio::time::sleep_until(when.into()) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let body = client::body(
            &target,
            &synthetic_prompt(profile.input_tokens, 0, &mut rng),
            profile.output_tokens,
        );
        let (http, target, records) = (http.clone(), target.clone(), records.clone());
        tasks.spawn(async move {
            let record = client::send(&http, &target, &body, epoch, at).await;
            if let Ok(mut r) = records.0.lock() {
                r.push(record);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_schedule_follows_its_phases() {
        let p = Profile::step(1.0, 4.0, [100.0, 100.0, 100.0]);
        let s = p.schedule();
        let count = |a: f64, b: f64| s.iter().filter(|t| **t >= a && **t < b).count() as f64;
        // Poisson counts: mean 100 and 400, standard deviation 10 and 20.
        assert!((60.0..140.0).contains(&count(0.0, 100.0)), "{}", count(0.0, 100.0));
        assert!((320.0..480.0).contains(&count(100.0, 200.0)), "{}", count(100.0, 200.0));
        assert!((60.0..140.0).contains(&count(200.0, 300.0)));
        assert!(s.windows(2).all(|w| w[0] <= w[1]) && s.last().is_some_and(|t| *t < 300.0));
        assert_eq!(p.seconds(), 300.0);
    }
}
