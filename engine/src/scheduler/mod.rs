//! Continuous batching: an actor on its own OS thread owns the model, the KV cache, the waiting
//! queue and the running batch. The HTTP layer talks to it only through [`SchedulerHandle`]
//! (commands in over a channel, token events out over a per-request channel), so no lock is
//! shared between request handlers and the model loop.
//!
//! Iteration-level scheduling: between any two steps, requests join (admission in arrival
//! order, while the batch has room and the KV pool can hold the request's prompt) and leave
//! (finished, or their client went away). Each step spends at most `max_num_batched_tokens`:
//! every decoding sequence gets its one token first, prompt chunks share the rest, so a long
//! prompt never stalls running decodes for more than one step. KV blocks are taken as
//! sequences grow; when the pool runs out, the newest sequence is preempted and later
//! recomputed ([`plan`] holds these rules, tested without a model).

mod engine_loop;
mod plan;
mod settings;

pub use settings::{BatchSettings, watch_settings_file};

use crate::LoadedModel;
use crate::generate::{FinishReason, GenerateRequest};
use crate::metrics::EngineMetrics;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a request's stream receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it released (possibly empty).
    Token {
        /// The token id.
        id: u32,
        /// Text safe to show.
        text: String,
        /// Its log probability, when the request asked for them.
        logprob: Option<crate::sampling::TokenLogprob>,
    },
    /// The last event of a successful request.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Prompt length.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The request failed inside the engine.
    Failed(String),
}

/// A request handed to the scheduler.
#[derive(Debug)]
pub struct Submission {
    /// Request id (for logs).
    pub id: String,
    /// What to generate.
    pub request: GenerateRequest,
    /// When the HTTP layer accepted it (TTFT and E2E start here).
    pub arrived: Instant,
    /// Where its events go; dropping the receiver cancels the request.
    pub events: UnboundedSender<Event>,
}

enum Command {
    Submit(Box<Submission>),
    Settings(BatchSettings),
}

/// State the HTTP layer reads without asking the actor.
#[derive(Debug, Default)]
pub struct SharedState {
    ready: AtomicBool,
    draining: AtomicBool,
    waiting: AtomicUsize,
    running: AtomicUsize,
    stopped: AtomicBool,
}

impl SharedState {
    /// Model loaded and warmed up, and not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire) && !self.is_stopped()
    }
    /// Whether new requests are being refused for shutdown.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    /// Requests accepted but not yet scheduled.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
    /// Sequences in the running batch.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
    /// Whether the scheduler thread has exited (it only does so on a fatal error).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// Why a submission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The waiting queue is at `max_waiting`.
    QueueFull,
    /// The engine is draining for shutdown.
    Draining,
    /// The engine is not ready (loading, or its scheduler died).
    NotReady,
}

/// The HTTP layer's side of the actor.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<SharedState>,
    max_waiting: usize,
}

impl SchedulerHandle {
    /// Queues a request, or refuses it at once when the queue is full or the engine drains.
    pub fn submit(&self, submission: Submission) -> Result<(), Refusal> {
        if self.shared.is_draining() {
            return Err(Refusal::Draining);
        }
        if !self.shared.ready.load(Ordering::Acquire) || self.shared.is_stopped() {
            return Err(Refusal::NotReady);
        }
        // Reserve a waiting slot first, so concurrent submissions cannot overshoot the bound.
        let reserved = self
            .shared
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| (w < self.max_waiting).then_some(w + 1));
        if reserved.is_err() {
            return Err(Refusal::QueueFull);
        }
        if self.tx.send(Command::Submit(Box::new(submission))).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::NotReady);
        }
        Ok(())
    }

    /// Applies new batch settings between two steps.
    pub fn update_settings(&self, settings: BatchSettings) {
        let _ = self.tx.send(Command::Settings(settings));
    }

    /// Stops accepting requests; in-flight ones continue.
    pub fn start_draining(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    /// Read-only state for health, readiness and drain.
    pub fn shared(&self) -> &SharedState {
        &self.shared
    }
}

/// Starts the scheduler thread for `model`. It warms the model up (one short forward) before
/// reporting ready.
pub fn start(
    model: Arc<LoadedModel>,
    settings: BatchSettings,
    kv_cache_tokens: usize,
    prefix_caching: bool,
    max_waiting: usize,
    metrics: EngineMetrics,
) -> std::io::Result<SchedulerHandle> {
    // The pool is made here, not on the thread, so a device that cannot hold it fails startup.
    let kv = model.model.new_kv_cache(kv_cache_tokens).map_err(std::io::Error::other)?;
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(SharedState::default());
    let state = shared.clone();
    std::thread::Builder::new().name("pacer-scheduler".into()).spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine_loop::run(model, settings, kv, prefix_caching, metrics, rx, &state)
        }));
        if result.is_err() {
            tracing::error!("the scheduler panicked; the engine stops serving (readiness goes false)");
        }
        state.stopped.store(true, Ordering::Release);
    })?;
    Ok(SchedulerHandle { tx, shared, max_waiting })
}
