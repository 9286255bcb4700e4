//! The scheduler thread's loop: take commands, admit, build a step within the token budget
//! (preempting when the KV pool runs out), run it, stream the results, retire finished or
//! abandoned sequences, publish metrics. What to admit, feed and preempt is decided by the
//! model-free functions of [`super::plan`]; this file carries the decisions out.

use super::plan::{self, SeqView};
use super::step_time::{StepClock, TimeBound};
use super::tail::{self, GapLedger, HoldQuery, PromptStep};
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
    /// Whether a chunk of its prompt has run (it is no longer held, see [`tail`]).
    prefill_started: bool,
    failed: bool,
}

struct Loop<'a> {
    model: Arc<LoadedModel>,
    settings: BatchSettings,
    kv: KvCache,
    /// Whether full blocks are registered and prompts start from cached prefixes.
    prefix_caching: bool,
    metrics: EngineMetrics,
    shared: &'a SharedState,
    waiting: VecDeque<Box<Submission>>,
    /// Preempted sequences, oldest first: readmitted before anything new.
    preempted: VecDeque<Active>,
    running: Vec<Active>,
    /// The running fit of step time against step work, for the ITL budget.
    clock: StepClock,
    /// The streams' recent gaps, for the prompt hold.
    gaps: GapLedger,
}

pub(super) fn run(
    model: Arc<LoadedModel>,
    settings: BatchSettings,
    kv: KvCache,
    prefix_caching: bool,
    metrics: EngineMetrics,
    rx: Receiver<Command>,
    shared: &SharedState,
) {
    let mut lp = Loop {
        model,
        settings,
        kv,
        prefix_caching,
        metrics,
        shared,
        waiting: VecDeque::new(),
        preempted: VecDeque::new(),
        running: Vec::new(),
        clock: StepClock::new(),
        gaps: GapLedger::new(),
    };
    lp.metrics.set_info(lp.model.model.tier.as_str(), &settings);
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
    /// Two short forwards, so the first request does not pay for page faults and pool
    /// start-up, and the step clock starts with a fit: one of 8 tokens and one of 128, each
    /// counted as a few steps until real ones replace them.
    fn warm_up(&mut self) {
        let equiv = plan::attention_equivalent(&self.model.model.config);
        let bos = self.model.tokenizer.bos().unwrap_or(0);
        for (run, n) in [8usize, 8, 128].into_iter().enumerate() {
            let mut seq = SeqCache::new();
            let tokens = vec![bos; n];
            let step = SeqStep { cache: &mut seq, tokens: &tokens, logits: true };
            let started = Instant::now();
            let result = self.model.model.forward(&mut self.kv, &mut [step]);
            let took = started.elapsed().as_secs_f64();
            self.kv.release(&mut seq);
            if let Err(e) = result {
                tracing::warn!(error = %e, "warm-up step failed");
                return;
            }
            // The first run pays for page faults: only the later ones teach the clock.
            if run > 0 {
                let view = SeqView { cached: 0, blocks: 0, reclaimable: 0, prefill_left: n };
                self.clock.observe_weighted(plan::step_work(&[view], &[(0, n)], equiv), took, 5.0);
            }
        }
        tracing::info!(fit = ?self.clock.fit(), "step clock seeded");
    }

    /// Takes every pending command; blocks while idle. Returns false when all senders are gone.
    fn receive(&mut self, rx: &Receiver<Command>) -> bool {
        let idle = self.running.is_empty() && self.waiting.is_empty() && self.preempted.is_empty();
        if idle {
            match rx.recv() {
                Ok(cmd) => self.apply(cmd),
                Err(_) => return false,
            }
        }
        // An idle engine may wait a little to start with a fuller batch.
        if self.running.is_empty()
            && self.preempted.is_empty()
            && !self.waiting.is_empty()
            && self.settings.batch_wait_ms > 0
        {
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
                    return !(self.running.is_empty()
                        && self.waiting.is_empty()
                        && self.preempted.is_empty());
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
                self.metrics.set_info(self.model.model.tier.as_str(), &s);
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
        let before = self.preempted.len();
        self.preempted.retain(|a| !a.sub.events.is_closed());
        (0..before - self.preempted.len()).for_each(|_| self.metrics.finished("abort"));
    }

    /// Moves requests into the batch while a batch slot and KV blocks for their prompt are
    /// free: preempted sequences first (oldest first), then waiting requests in arrival order.
    /// Blocks for the generated tokens are taken as they come ([`plan::plan_step`]).
    fn admit(&mut self) {
        let back = plan::admissible(
            self.preempted.iter().map(|a| a.seq.admission_tokens()),
            self.running.len(),
            self.settings.max_batch_size,
            self.kv.free_blocks(),
        );
        let readmitted: Vec<Active> = self.preempted.drain(..back).collect();
        for mut a in readmitted {
            self.start_from_cache(&mut a.seq);
            let tokens = a.seq.admission_tokens();
            if let Err(e) = self.kv.reserve(&mut a.seq.cache, tokens) {
                unreachable!("admissible() counted the free blocks: {e}");
            }
            self.running.push(a);
        }
        if !self.preempted.is_empty() {
            // The oldest preempted sequence goes first; nothing new overtakes it.
            return;
        }
        let context = self.model.model.config.context_length;
        let capacity = self.kv.capacity_tokens();
        while self.running.len() < self.settings.max_batch_size.max(1) {
            let Some(sub) = self.waiting.front() else { break };
            let whole = (sub.request.prompt.len() + sub.request.max_tokens).min(context);
            if whole > capacity {
                // It could never finish, even alone (the HTTP layer refuses these with a 400;
                // this guards other callers): fail it rather than let it thrash.
                let sub = self.waiting.pop_front().unwrap_or_else(|| unreachable!("front exists"));
                self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
                let msg = format!("the request needs {whole} KV-cache tokens but the engine has {capacity}");
                let _ = sub.events.send(Event::Failed(msg));
                continue;
            }
            let prompt = sub.request.prompt.len() + 1;
            if plan::admissible(
                [prompt],
                self.running.len(),
                self.settings.max_batch_size,
                self.kv.free_blocks(),
            ) == 0
            {
                break;
            }
            let Some(sub) = self.waiting.pop_front() else { break };
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            match Sequence::new(sub.request.clone(), context) {
                Ok(mut seq) => {
                    self.start_from_cache(&mut seq);
                    let tokens = seq.admission_tokens();
                    if let Err(e) = self.kv.reserve(&mut seq.cache, tokens) {
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
                        prefill_started: false,
                        failed: false,
                    });
                }
                Err(e) => {
                    let _ = sub.events.send(Event::Failed(e.to_string()));
                }
            }
        }
    }

    /// Starts an admitted sequence's cache with the longest cached prefix of what it must
    /// prefill, so those tokens are not computed again.
    fn start_from_cache(&mut self, seq: &mut Sequence) {
        if !self.prefix_caching {
            return;
        }
        let mut cache = std::mem::take(&mut seq.cache);
        let found = self.kv.take_prefix(&mut cache, seq.prefill_tokens());
        self.metrics.prefix_queries.inc_by(seq.prefill_tokens().len() as u64);
        self.metrics.prefix_hits.inc_by(found as u64);
        seq.cache = cache;
        if found > 0 {
            seq.skip_cached(found);
        }
    }

    /// Frees the KV blocks of the running sequences at `victims` (newest first) and queues
    /// them to be recomputed when blocks are free again.
    fn preempt(&mut self, victims: &[usize]) {
        // Highest index first, so the indices still to remove stay valid.
        let mut sorted = victims.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for i in sorted {
            let mut a = self.running.remove(i);
            tracing::debug!(request_id = %a.sub.id, generated = a.seq.generated().len(), "KV cache full; sequence preempted");
            self.kv.release(&mut a.seq.cache);
            a.seq.preempt();
            self.metrics.preemptions.inc();
            // Newest first here, so pushing each to the front leaves the oldest in front.
            self.preempted.push_front(a);
        }
    }

    fn publish_gauges(&self) {
        // A preempted sequence is in flight (drain waits for it) and, for the metrics, waiting.
        self.shared.running.store(self.running.len() + self.preempted.len(), Ordering::Release);
        self.metrics.running.set(self.running.len() as i64);
        self.metrics.waiting.set((self.shared.waiting() + self.preempted.len()) as i64);
        let queued: usize = self.waiting.iter().map(|s| s.request.prompt.len()).sum::<usize>()
            + self.preempted.iter().map(|a| a.seq.remaining_prefill()).sum::<usize>()
            + self.running.iter().map(|a| a.seq.remaining_prefill()).sum::<usize>();
        self.metrics.queued_prompt_tokens.set(queued as i64);
        self.metrics.set_kv_usage(self.kv.usage());
    }

    /// One forward over the batch: decodes first, then prompt chunks within the token budget.
    fn step(&mut self) {
        let views: Vec<SeqView> = self
            .running
            .iter()
            .map(|a| SeqView {
                cached: a.seq.cache.len(),
                blocks: a.seq.cache.capacity() / crate::model::BLOCK_TOKENS,
                reclaimable: self.kv.exclusive_blocks(&a.seq.cache),
                prefill_left: a.seq.remaining_prefill(),
            })
            .collect();
        let free = self.kv.free_blocks();
        let equiv = plan::attention_equivalent(&self.model.model.config);
        let budget = plan::StepBudget {
            tokens: self.settings.max_num_batched_tokens,
            attention_equiv: equiv,
            time: TimeBound::new(&self.clock, Duration::from_millis(self.settings.max_step_ms)),
        };
        let decided = self.plan_with_hold(&views, budget, free);
        let work = plan::step_work(&views, &decided.feeds, equiv);
        // The gaps this step ends: streams past their first token; long if prompt work rides.
        let gaps = decided.feeds.iter().filter(|&&(i, _)| self.running[i].last_token.is_some()).count();
        let long = decided.feeds.iter().any(|&(i, _)| views[i].prefill_left > 0);
        // Indices shift when victims leave the batch: map the feeds to the survivors' places.
        let shift = |i: usize| i - decided.preempt.iter().filter(|&&v| v < i).count();
        let feeds: Vec<(usize, usize)> = decided.feeds.iter().map(|&(i, n)| (shift(i), n)).collect();
        if !decided.preempt.is_empty() {
            self.preempt(&decided.preempt);
        }
        let plan: Vec<(usize, Vec<u32>, bool)> = feeds
            .iter()
            .map(|&(i, n)| {
                let (t, l) = self.running[i].seq.next_input(n);
                (i, t.to_vec(), l)
            })
            .collect();
        if plan.is_empty() {
            return;
        }
        for &(i, _) in &feeds {
            let a = &mut self.running[i];
            a.prefill_started |= a.seq.in_prefill();
        }
        self.gaps.record(gaps, long);
        let rows: usize = plan.iter().map(|(_, t, _)| t.len()).sum();
        self.metrics.batch_size.observe(rows as f64);
        let started = Instant::now();
        let mut caches: Vec<SeqCache> =
            plan.iter().map(|(i, _, _)| std::mem::take(&mut self.running[*i].seq.cache)).collect();
        let result = {
            let mut steps: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(&plan)
                .map(|(cache, (_, tokens, logits))| SeqStep { cache, tokens, logits: *logits })
                .collect();
            self.shared.step_started();
            let result = match self.injected_fault() {
                Some(e) => Err(e),
                None => self.model.model.forward(&mut self.kv, &mut steps),
            };
            self.shared.step_ended(result.is_ok());
            result
        };
        for ((i, _, _), mut cache) in plan.iter().zip(caches) {
            let a = &mut self.running[*i];
            if self.prefix_caching && result.is_ok() {
                // Blocks the step filled become reusable by later sequences with this prefix.
                let n = cache.len();
                if n / crate::model::BLOCK_TOKENS > cache.registered_blocks() {
                    self.kv.register_full_blocks(&mut cache, &a.seq.tokens(n));
                }
            }
            a.seq.cache = cache;
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
            let _ =
                a.sub.events.send(Event::Token { id: delta.token, text: delta.text, logprob: delta.logprob });
            if let Some(reason) = delta.finish {
                self.record_finish(*i, reason, now);
            }
        }
        // The gap the streams saw: the forward and handing out its tokens.
        self.clock.observe(work, started.elapsed().as_secs_f64());
        self.retire(|a| a.seq.finish().is_some());
    }

    /// Plans the step with its prompt work shaped by [`tail::prompt_step`]: whole, in
    /// budget-sized chunks, or with the prompts that have not started sitting it out. A held
    /// plan that would preempt someone is made again without the hold (a held prompt's blocks
    /// are not worth a running sequence's progress).
    fn plan_with_hold(&self, views: &[SeqView], budget: plan::StepBudget, free: usize) -> plan::StepPlan {
        let hold = Duration::from_millis(self.settings.prefill_hold_ms);
        if hold.is_zero() || !views.iter().any(|v| v.prefill_left > 0) {
            return plan::plan_step_with(views, budget, free);
        }
        let unstarted = |i: usize| views[i].prefill_left > 0 && !self.running[i].prefill_started;
        let now = Instant::now();
        let query = HoldQuery {
            gaps: self.running.iter().filter(|a| a.last_token.is_some()).count(),
            prefill_in_progress: (0..views.len()).any(|i| views[i].prefill_left > 0 && !unstarted(i)),
            oldest_wait: (0..views.len())
                .filter(|&i| unstarted(i))
                .map(|i| now.saturating_duration_since(self.running[i].sub.arrived))
                .max(),
            hold,
        };
        match tail::prompt_step(&self.gaps, query) {
            PromptStep::Budgeted => plan::plan_step_with(views, budget, free),
            // One long gap for all of the prompt work, not a train of budget-sized ones (the
            // ledger bounds how often).
            PromptStep::Whole => {
                let whole = plan::StepBudget {
                    time: None,
                    tokens: budget.tokens.max(tail::RELEASED_TOKENS),
                    ..budget
                };
                plan::plan_step_with(views, whole, free)
            }
            PromptStep::HoldNew => {
                let kept: Vec<usize> = (0..views.len()).filter(|&i| !unstarted(i)).collect();
                let sub: Vec<SeqView> = kept.iter().map(|&i| views[i]).collect();
                let held = plan::plan_step_with(&sub, budget, free);
                if !held.preempt.is_empty() {
                    return plan::plan_step_with(views, budget, free);
                }
                plan::StepPlan {
                    feeds: held.feeds.iter().map(|&(i, n)| (kept[i], n)).collect(),
                    preempt: Vec::new(),
                }
            }
        }
    }

    /// A fault a test injected for this step: a failure, after a stall if one was asked for.
    fn injected_fault(&self) -> Option<crate::error::EngineError> {
        let faults = &self.shared.faults;
        let stall = faults.stall_ms.swap(0, Ordering::AcqRel);
        if stall > 0 {
            std::thread::sleep(Duration::from_millis(stall));
        }
        faults
            .fail_steps
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| crate::error::EngineError::Model("injected step failure (test fault)".into()))
    }

    /// Records a finished sequence's metrics; [`Self::retire`] frees it and tells its client.
    fn record_finish(&self, i: usize, reason: FinishReason, now: Instant) {
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
    }

    /// Removes the sequences `done` selects (keeping the others in admission order), frees
    /// their KV blocks and publishes the gauges, and only then tells the finished ones'
    /// clients: a client that reads the metrics on its answer sees its blocks back.
    fn retire(&mut self, done: impl Fn(&Active) -> bool) {
        let mut finished = Vec::new();
        for mut a in self.running.extract_if(.., |a| done(a)) {
            self.kv.release(&mut a.seq.cache);
            if let (Some(reason), false) = (a.seq.finish(), a.failed) {
                let event = Event::Finished {
                    reason,
                    prompt_tokens: a.seq.prompt_len(),
                    completion_tokens: a.seq.generated().len(),
                };
                finished.push((a.sub.events, event));
            }
        }
        self.publish_gauges();
        for (events, event) in finished {
            let _ = events.send(event);
        }
    }
}
