//! The scheduler thread's loop: take commands, admit, build a step within the token budget,
//! run it, stream the results, retire finished or abandoned sequences, publish metrics.

use super::{BatchSettings, Command, Event, SharedState, Submission};
use crate::LoadedModel;
use crate::generate::{FinishReason, Sequence};
use crate::metrics::EngineMetrics;
use crate::model::{KvCache, SeqCache, SeqStep};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// A sequence in the running batch, with its request's timestamps.
struct Active {
    seq: Sequence,
    sub: Box<Submission>,
    scheduled: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    failed: bool,
}

struct Loop<'a> {
    model: Arc<LoadedModel>,
    settings: BatchSettings,
    kv: KvCache,
    metrics: EngineMetrics,
    shared: &'a SharedState,
    waiting: VecDeque<Box<Submission>>,
    running: Vec<Active>,
}

pub(super) fn run(
    model: Arc<LoadedModel>,
    settings: BatchSettings,
    kv_cache_tokens: usize,
    metrics: EngineMetrics,
    rx: Receiver<Command>,
    shared: &SharedState,
) {
    let kv = model.model.new_kv_cache(kv_cache_tokens);
    let mut lp = Loop { model, settings, kv, metrics, shared, waiting: VecDeque::new(), running: Vec::new() };
    lp.metrics.set_info(lp.model.model.tier.as_str(), settings.max_batch_size, settings.batch_wait_ms);
    lp.warm_up();
    shared.ready.store(true, Ordering::Release);
    tracing::info!(kv_cache_tokens = lp.kv.capacity_tokens(), ?settings, "scheduler ready");
    loop {
        if !lp.receive(&rx) {
            return;
        }
        lp.drop_abandoned();
        lp.admit();
        lp.publish_gauges();
        if !lp.running.is_empty() {
            lp.step();
        }
    }
}

impl Loop<'_> {
    /// One short forward so the first request does not pay for page faults and pool start-up.
    fn warm_up(&mut self) {
        let mut seq = SeqCache::new();
        let tokens = [self.model.tokenizer.bos().unwrap_or(0); 8];
        let step = SeqStep { cache: &mut seq, tokens: &tokens, logits: true };
        if let Err(e) = self.model.model.forward(&mut self.kv, &mut [step]) {
            tracing::warn!(error = %e, "warm-up step failed");
        }
        self.kv.release(&mut seq);
    }

    /// Takes every pending command; blocks while idle. Returns false when all senders are gone.
    fn receive(&mut self, rx: &Receiver<Command>) -> bool {
        let idle = self.running.is_empty() && self.waiting.is_empty();
        if idle {
            match rx.recv() {
                Ok(cmd) => self.apply(cmd),
                Err(_) => return false,
            }
        }
        // An idle engine may wait a little to start with a fuller batch.
        if self.running.is_empty() && !self.waiting.is_empty() && self.settings.batch_wait_ms > 0 {
            let deadline = self.waiting[0].arrived + Duration::from_millis(self.settings.batch_wait_ms);
            while self.waiting.len() < self.settings.max_batch_size {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match rx.recv_timeout(left) {
                    Ok(cmd) => self.apply(cmd),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => self.apply(cmd),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => {
                    return !(self.running.is_empty() && self.waiting.is_empty());
                }
            }
        }
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(sub) => self.waiting.push_back(sub),
            Command::Settings(s) => {
                tracing::info!(previous = ?self.settings, next = ?s, "applying batch settings");
                self.settings = s;
                self.metrics.set_info(self.model.model.tier.as_str(), s.max_batch_size, s.batch_wait_ms);
            }
        }
    }

    /// Cancels requests whose client went away: their KV blocks return to the pool now.
    fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.shared.waiting.fetch_sub(gone, Ordering::AcqRel);
            (0..gone).for_each(|_| self.metrics.finished("abort"));
        }
        for mut a in self.running.extract_if(.., |a| a.sub.events.is_closed()) {
            tracing::info!(request_id = %a.sub.id, "client went away; sequence cancelled");
            self.kv.release(&mut a.seq.cache);
            self.metrics.finished("abort");
        }
    }

    /// Moves waiting requests into the batch in arrival order while there is room for them:
    /// a batch slot, and KV blocks for the request's whole budget (reserved now, so a running
    /// sequence never runs out of cache mid-generation).
    fn admit(&mut self) {
        let context = self.model.model.config.context_length;
        while self.running.len() < self.settings.max_batch_size {
            let Some(sub) = self.waiting.front() else { break };
            let budget = (sub.request.prompt.len() + sub.request.max_tokens).min(context);
            if budget.div_ceil(crate::model::BLOCK_TOKENS) * crate::model::BLOCK_TOKENS
                > self.kv.free_tokens()
            {
                if self.running.is_empty() && budget > self.kv.capacity_tokens() {
                    // It would never fit: fail it rather than block the queue forever.
                    let sub = self.waiting.pop_front().unwrap_or_else(|| unreachable!("front exists"));
                    self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
                    let msg = format!(
                        "the request needs {budget} KV-cache tokens but the engine has {}",
                        self.kv.capacity_tokens()
                    );
                    let _ = sub.events.send(Event::Failed(msg));
                    continue;
                }
                break;
            }
            let Some(sub) = self.waiting.pop_front() else { break };
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            match Sequence::new(sub.request.clone(), context) {
                Ok(mut seq) => {
                    let budget = seq.kv_budget();
                    if let Err(e) = self.kv.reserve(&mut seq.cache, budget) {
                        let _ = sub.events.send(Event::Failed(e.to_string()));
                        continue;
                    }
                    let now = Instant::now();
                    self.metrics.queue_time.observe((now - sub.arrived).as_secs_f64());
                    self.running.push(Active {
                        seq,
                        sub,
                        scheduled: now,
                        first_token: None,
                        last_token: None,
                        failed: false,
                    });
                }
                Err(e) => {
                    let _ = sub.events.send(Event::Failed(e.to_string()));
                }
            }
        }
    }

    fn publish_gauges(&self) {
        self.shared.running.store(self.running.len(), Ordering::Release);
        self.metrics.running.set(self.running.len() as i64);
        self.metrics.waiting.set(self.shared.waiting() as i64);
        self.metrics.set_kv_usage(self.kv.usage());
    }

    /// One forward over the batch: decodes first, then prompt chunks within the token budget.
    fn step(&mut self) {
        let mut budget = self.settings.max_num_batched_tokens;
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, a) in self.running.iter().enumerate() {
            if !a.seq.in_prefill() {
                let (t, l) = a.seq.next_input(1);
                plan.push((i, t.to_vec(), l));
                budget = budget.saturating_sub(1);
            }
        }
        for (i, a) in self.running.iter().enumerate() {
            if a.seq.in_prefill() && budget > 0 {
                let (t, l) = a.seq.next_input(budget);
                budget -= t.len();
                plan.push((i, t.to_vec(), l));
            }
        }
        if plan.is_empty() {
            return;
        }
        let rows: usize = plan.iter().map(|(_, t, _)| t.len()).sum();
        self.metrics.batch_size.observe(rows as f64);
        let mut caches: Vec<SeqCache> =
            plan.iter().map(|(i, _, _)| std::mem::take(&mut self.running[*i].seq.cache)).collect();
        let result = {
            let mut steps: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(&plan)
                .map(|(cache, (_, tokens, logits))| SeqStep { cache, tokens, logits: *logits })
                .collect();
            self.model.model.forward(&mut self.kv, &mut steps)
        };
        for ((i, _, _), cache) in plan.iter().zip(caches) {
            self.running[*i].seq.cache = cache;
        }
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "step failed; failing its sequences");
                for (i, _, _) in &plan {
                    let a = &mut self.running[*i];
                    let _ = a.sub.events.send(Event::Failed(e.to_string()));
                    a.failed = true;
                }
                self.retire(|a| a.failed);
                return;
            }
        };
        let now = Instant::now();
        let tokenizer = &self.model.tokenizer;
        for ((i, tokens, _), l) in plan.iter().zip(logits) {
            let a = &mut self.running[*i];
            if a.seq.in_prefill() {
                self.metrics.prompt_tokens.inc_by(tokens.len() as u64);
            }
            let Some(delta) = a.seq.after_step(tokens.len(), l.as_deref(), tokenizer) else { continue };
            self.metrics.generation_tokens.inc();
            match a.last_token {
                None => {
                    self.metrics.ttft.observe((now - a.sub.arrived).as_secs_f64());
                    self.metrics.prefill_time.observe((now - a.scheduled).as_secs_f64());
                    a.first_token = Some(now);
                }
                Some(prev) => self.metrics.observe_itl((now - prev).as_secs_f64()),
            }
            a.last_token = Some(now);
            let _ = a.sub.events.send(Event::Token { id: delta.token, text: delta.text });
            if let Some(reason) = delta.finish {
                self.finish(*i, reason, now);
            }
        }
        self.retire(|a| a.seq.finish().is_some());
    }

    fn finish(&self, i: usize, reason: FinishReason, now: Instant) {
        let a = &self.running[i];
        let n = a.seq.generated().len();
        let first = a.first_token.unwrap_or(now);
        let decode = (now - first).as_secs_f64();
        self.metrics.e2e.observe((now - a.sub.arrived).as_secs_f64());
        self.metrics.decode_time.observe(decode);
        if n >= 2 {
            self.metrics.tpot.observe(decode / (n - 1) as f64);
        }
        self.metrics.prompt_len.observe(a.seq.prompt_len() as f64);
        self.metrics.generation_len.observe(n as f64);
        self.metrics.finished(reason.as_str());
        let _ = a.sub.events.send(Event::Finished {
            reason,
            prompt_tokens: a.seq.prompt_len(),
            completion_tokens: n,
        });
    }

    /// Removes the sequences `done` selects (keeping the others in admission order) and
    /// frees their KV blocks.
    fn retire(&mut self, done: impl Fn(&Active) -> bool) {
        for mut a in self.running.extract_if(.., |a| done(a)) {
            self.kv.release(&mut a.seq.cache);
        }
        self.publish_gauges();
    }
}
