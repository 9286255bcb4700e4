//! One engine replica on the virtual clock, scheduled like `pacer-engine`'s loop: admission in
//! arrival order while a batch slot and KV blocks for the whole request are free (the engine
//! takes blocks as sequences grow and preempts when its pool runs out; reserving the whole
//! request is the same whenever the pool does not bind, as with the simulated workloads, and
//! never preempts), steps of one
//! token per decode row first and chunked prefill in the rest of the token budget, an idle
//! engine waiting `batch_wait_ms` to fill a batch, and each step lasting what the profile's
//! step model says. It records per-request truth (TTFT, every ITL gap, E2E) and the engine's
//! Prometheus histograms.

use super::prom::EngineSeries;
use pacer_planner::StepModel;
use std::collections::VecDeque;

/// The engine's defaults and limits, from the one place the engine takes them too: tokens one
/// step may carry, KV-cache tokens per engine, tokens per KV block (reservations round up to
/// whole blocks) and the fewest prompt tokens the first prompt of a step gets under the ITL
/// budget.
pub use pacer_engine_api::defaults::{KV_BLOCK_TOKENS, KV_CACHE_TOKENS, MIN_CHUNK, STEP_TOKEN_BUDGET};

/// One request as the engine sees it.
#[derive(Debug, Clone)]
pub struct Seq {
    /// Index of the request in its trace.
    pub id: usize,
    /// When the engine accepted it.
    pub arrival: f64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Tokens to generate (at least 1).
    pub output: u32,
    prefilled: u32,
    generated: u32,
    last_token: f64,
    ttft: f64,
    itls: Vec<f32>,
    kv: u32,
}

impl Seq {
    /// A request arriving at `arrival`.
    pub fn new(id: usize, arrival: f64, prompt: u32, output: u32) -> Seq {
        Seq {
            id,
            arrival,
            prompt: prompt.max(1),
            output: output.max(1),
            prefilled: 0,
            generated: 0,
            last_token: arrival,
            ttft: 0.0,
            itls: Vec::new(),
            kv: 0,
        }
    }

    fn in_prefill(&self) -> bool {
        self.prefilled < self.prompt
    }

    fn kv_budget(&self) -> u32 {
        (self.prompt + self.output).div_ceil(KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    }
}

/// A request the engine finished, with its measured latencies.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Index of the request in its trace.
    pub id: usize,
    /// When it finished.
    pub at: f64,
    /// Arrival → first token, seconds.
    pub ttft: f64,
    /// Every gap between consecutive tokens, seconds.
    pub itls: Vec<f32>,
    /// Arrival → last token, seconds.
    pub e2e: f64,
}

/// The live batch settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Most sequences in the running batch.
    pub max_batch_size: u32,
    /// Seconds an idle engine waits to fill a batch.
    pub batch_wait: f64,
    /// Most tokens one step carries (`--max-num-batched-tokens`).
    pub token_budget: u32,
    /// The ITL budget in seconds (`--max-step-ms`; 0 = none): while rows decode, prompt
    /// chunks are cut so the step lasts at most this long, never below half the decodes' own
    /// time, and the first prompt moves by at least [`MIN_CHUNK`].
    pub max_step: f64,
}

impl Settings {
    /// `max_batch_size` and `batch_wait` with the engine's default token budget and no ITL
    /// budget.
    pub const fn new(max_batch_size: u32, batch_wait: f64) -> Settings {
        Settings { max_batch_size, batch_wait, token_budget: STEP_TOKEN_BUDGET, max_step: 0.0 }
    }
}

/// One finished step as the engine's scheduler would report it (Dynamo's "forward pass
/// metrics"): what it carried and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepRecord {
    /// Seconds the step took.
    pub wall_time: f64,
    /// Prompt tokens prefilled in it.
    pub prefill_tokens: u32,
    /// Requests with a prompt chunk in it.
    pub prefill_requests: u32,
    /// Decode rows in it.
    pub decode_requests: u32,
    /// Context tokens the decode rows attend to.
    pub decode_kv_tokens: u64,
}

#[derive(Debug, Clone, Copy)]
struct Planned {
    index: usize,
    tokens: u32,
    decode: bool,
}

/// One step's feeds over the running sequences (in batch order; `prefill_left[i]` is 0 for a
/// row that decodes): one token for every decoding row first, then prompt chunks in batch order
/// within what `token_budget` leaves and, while rows decode, what the ITL budget leaves
/// (`timed`, in prompt tokens). The engine's rule (`pacer_engine::scheduler::plan`) for a step
/// with KV to spare; a test holds the two equal on the same inputs.
pub fn compose_step(prefill_left: &[u32], token_budget: u32, mut timed: Option<u32>) -> Vec<(usize, u32)> {
    let mut feeds: Vec<(usize, u32)> =
        prefill_left.iter().enumerate().filter(|(_, left)| **left == 0).map(|(i, _)| (i, 1)).collect();
    let mut budget = token_budget.saturating_sub(feeds.len() as u32);
    for (i, &left) in prefill_left.iter().enumerate() {
        if left > 0 && budget > 0 && timed != Some(0) {
            let chunk = left.min(budget).min(timed.unwrap_or(u32::MAX));
            timed = timed.map(|t| t - chunk);
            budget -= chunk;
            feeds.push((i, chunk));
        }
    }
    feeds
}

/// One engine replica.
#[derive(Debug, Clone)]
pub struct Engine {
    step: StepModel,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    kv_free: u32,
    /// Tokens its KV cache holds.
    kv_tokens: u32,
    /// The step in flight: when it ends, what it carries, and its record.
    in_step: Option<(f64, Vec<Planned>, StepRecord)>,
    /// The last finished step and how many steps have finished.
    last_step: (StepRecord, u64),
    /// An idle engine's batch-wait deadline.
    wake: Option<f64>,
    /// The engine's Prometheus series.
    pub metrics: EngineSeries,
    /// Requests it could never serve (larger than its KV cache).
    pub failed: u64,
}

impl Engine {
    /// An idle engine whose steps take what `step` says, with `pacer-engine`'s default KV cache.
    pub fn new(step: StepModel) -> Engine {
        Engine::with_kv(step, KV_CACHE_TOKENS)
    }

    /// An idle engine whose steps take what `step` says and whose KV cache holds `kv_tokens`.
    pub fn with_kv(step: StepModel, kv_tokens: u32) -> Engine {
        Engine {
            step,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_free: kv_tokens,
            kv_tokens,
            in_step: None,
            last_step: (StepRecord::default(), 0),
            wake: None,
            metrics: EngineSeries::default(),
            failed: 0,
        }
    }

    /// Requests in the engine (running and waiting): what a least-outstanding router counts.
    pub fn outstanding(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    /// `vllm:num_requests_running`.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// `vllm:num_requests_waiting`.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// `pacer_engine_queued_prompt_tokens`: prompt tokens not yet prefilled.
    pub fn queued_prompt_tokens(&self) -> u64 {
        let running: u64 = self.running.iter().map(|s| u64::from(s.prompt - s.prefilled)).sum();
        self.waiting_prompt_tokens() + running
    }

    /// The last finished step's record, and the count of finished steps (so a reader can tell
    /// a new record from one it has seen).
    pub fn last_step(&self) -> (StepRecord, u64) {
        self.last_step
    }

    /// Prompt tokens of the requests waiting for a batch slot.
    pub fn waiting_prompt_tokens(&self) -> u64 {
        self.waiting.iter().map(|s| u64::from(s.prompt)).sum()
    }

    /// Context tokens the running requests attend to now.
    pub fn running_kv_tokens(&self) -> u64 {
        self.running.iter().map(|s| u64::from(s.prefilled + s.generated)).sum()
    }

    /// `vllm:kv_cache_usage_perc`.
    pub fn kv_usage(&self) -> f64 {
        1.0 - f64::from(self.kv_free) / f64::from(self.kv_tokens.max(1))
    }

    /// When this engine next needs the clock: its step's end or its batch-wait deadline.
    pub fn next_event(&self) -> Option<f64> {
        self.in_step.as_ref().map(|(t, _, _)| *t).or(self.wake)
    }

    /// Accepts a request at `now` and starts a step if the engine was idle.
    pub fn submit(&mut self, seq: Seq, now: f64, settings: Settings) {
        self.waiting.push_back(seq);
        self.start(now, settings);
    }

    /// Advances the engine to `now`: finishes the step that ends now (pushing finished
    /// requests into `done`) and starts the next one if there is work.
    pub fn poll(&mut self, now: f64, settings: Settings, done: &mut Vec<Finished>) {
        if let Some((end, _, _)) = &self.in_step {
            if *end > now {
                return;
            }
            let (end, plan, record) = self.in_step.take().unwrap_or_else(|| unreachable!("checked above"));
            self.complete(end, &plan, done);
            self.last_step = (record, self.last_step.1 + 1);
        }
        self.start(now, settings);
    }

    fn complete(&mut self, now: f64, plan: &[Planned], done: &mut Vec<Finished>) {
        for p in plan {
            let s = &mut self.running[p.index];
            if p.decode {
                let gap = now - s.last_token;
                s.itls.push(gap as f32);
                self.metrics.itl.observe(gap);
                s.generated += 1;
                s.last_token = now;
                self.metrics.generation_tokens += 1.0;
            } else {
                s.prefilled += p.tokens;
                self.metrics.prompt_tokens += f64::from(p.tokens);
                if !s.in_prefill() {
                    // The last prompt chunk's logits give the first token.
                    s.generated = 1;
                    s.ttft = now - s.arrival;
                    s.last_token = now;
                    self.metrics.ttft.observe(s.ttft);
                    self.metrics.generation_tokens += 1.0;
                }
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].generated >= self.running[i].output {
                let s = self.running.remove(i);
                self.kv_free += s.kv;
                let e2e = now - s.arrival;
                self.metrics.e2e.observe(e2e);
                self.metrics.prompt_len.observe(f64::from(s.prompt));
                self.metrics.success += 1.0;
                done.push(Finished { id: s.id, at: now, ttft: s.ttft, itls: s.itls, e2e });
            } else {
                i += 1;
            }
        }
    }

    fn start(&mut self, now: f64, settings: Settings) {
        if self.in_step.is_some() {
            return;
        }
        self.wake = None;
        if self.running.is_empty() && !self.waiting.is_empty() && settings.batch_wait > 0.0 {
            // An idle engine waits for a fuller batch, up to batch_wait after the first arrival.
            let deadline = self.waiting[0].arrival + settings.batch_wait;
            if (self.waiting.len() as u32) < settings.max_batch_size && now < deadline {
                self.wake = Some(deadline);
                return;
            }
        }
        self.admit(settings);
        if self.running.is_empty() {
            return;
        }
        let budget = settings.token_budget.max(settings.max_batch_size).max(1);
        let prefill_left: Vec<u32> =
            self.running.iter().map(|s| if s.in_prefill() { s.prompt - s.prefilled } else { 0 }).collect();
        let (mut rows, mut context, mut prefill, mut prefilling) = (0u32, 0u64, 0u32, 0u32);
        for s in self.running.iter().filter(|s| !s.in_prefill()) {
            rows += 1;
            context += u64::from(s.prompt + s.generated);
        }
        // The ITL budget: with rows decoding, prompts get what the budget leaves of the step.
        let timed = (rows > 0 && settings.max_step > 0.0 && self.step.per_prefill_token_s > 0.0).then(|| {
            let decodes = self.step.step_seconds(f64::from(rows), 0.0, context as f64);
            let left = settings.max_step.max(1.5 * decodes) - decodes;
            (left / self.step.per_prefill_token_s).floor().max(f64::from(MIN_CHUNK)) as u32
        });
        let mut plan = Vec::with_capacity(self.running.len());
        for (index, tokens) in compose_step(&prefill_left, budget, timed) {
            let decode = prefill_left[index] == 0;
            if !decode {
                prefill += tokens;
                prefilling += 1;
            }
            plan.push(Planned { index, tokens, decode });
        }
        if plan.is_empty() {
            return;
        }
        let seconds = self.step.step_seconds(f64::from(rows), f64::from(prefill), context as f64).max(1e-6);
        let record = StepRecord {
            wall_time: seconds,
            prefill_tokens: prefill,
            prefill_requests: prefilling,
            decode_requests: rows,
            decode_kv_tokens: context,
        };
        self.in_step = Some((now + seconds, plan, record));
    }

    /// Moves waiting requests into the batch while a slot and their whole KV budget are free.
    fn admit(&mut self, settings: Settings) {
        while (self.running.len() as u32) < settings.max_batch_size.max(1) {
            let Some(front) = self.waiting.front() else { break };
            let budget = front.kv_budget();
            if budget > self.kv_free {
                if self.running.is_empty() && budget > self.kv_tokens {
                    // It would never fit: fail it rather than block the queue forever.
                    self.waiting.pop_front();
                    self.failed += 1;
                    continue;
                }
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else { break };
            s.kv = budget;
            self.kv_free -= budget;
            self.running.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> StepModel {
        StepModel {
            base_s: 0.012,
            per_decode_row_s: 0.001,
            per_prefill_token_s: 0.00035,
            per_context_token_s: 0.0,
        }
    }

    fn run_alone(prompt: u32, output: u32, settings: Settings) -> Finished {
        let mut e = Engine::new(model());
        e.submit(Seq::new(0, 0.0, prompt, output), 0.0, settings);
        let mut done = Vec::new();
        while let Some(t) = e.next_event() {
            e.poll(t, settings, &mut done);
        }
        done.pop().expect("finished")
    }

    #[test]
    fn one_request_alone_reproduces_the_profile() {
        let settings = Settings::new(8, 0.0);
        let f = run_alone(200, 10, settings);
        // TTFT = one prefill step of 200 tokens; every ITL = a one-row decode step.
        assert!((f.ttft - model().step_seconds(0.0, 200.0, 0.0)).abs() < 1e-9, "{}", f.ttft);
        assert_eq!(f.itls.len(), 9);
        for g in &f.itls {
            assert!((f64::from(*g) - model().step_seconds(1.0, 0.0, 0.0)).abs() < 1e-6, "{g}");
        }
        // A prompt longer than the token budget takes two chunks.
        let f = run_alone(600, 2, settings);
        let expect = model().step_seconds(0.0, 512.0, 0.0) + model().step_seconds(0.0, 88.0, 0.0);
        assert!((f.ttft - expect).abs() < 1e-9);
        // batch_wait delays a lone request's first step by the wait.
        let f = run_alone(200, 1, Settings::new(8, 0.02));
        assert!((f.ttft - 0.02 - model().step_seconds(0.0, 200.0, 0.0)).abs() < 1e-9);
    }

    #[test]
    fn the_batch_cap_and_kv_budget_hold_requests_back() {
        let settings = Settings::new(2, 0.0);
        let mut e = Engine::new(model());
        for i in 0..3 {
            e.submit(Seq::new(i, 0.0, 10, 5), 0.0, settings);
        }
        // The first started a step alone; the others join at the next step, up to the cap.
        assert_eq!((e.running(), e.waiting()), (1, 2));
        let t = e.next_event().expect("a step");
        e.poll(t, settings, &mut Vec::new());
        assert_eq!((e.running(), e.waiting()), (2, 1));
        // A request larger than the whole cache fails instead of blocking the queue.
        let mut e = Engine::new(model());
        e.submit(Seq::new(0, 0.0, KV_CACHE_TOKENS, 5), 0.0, settings);
        assert_eq!((e.failed, e.running()), (1, 0));
    }
}
