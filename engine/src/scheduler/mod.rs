//! Continuous batching: an actor on its own OS thread owns the model, the KV cache, the waiting
//! queue and the running batch. The HTTP layer talks to it only through [`SchedulerHandle`]
//! (commands in over a channel, token events out over a per-request channel), so no lock is
//! shared between request handlers and the model loop.
//!
//! Iteration-level scheduling: between any two steps, requests join (admission in arrival
//! order, while the batch has room and the KV pool can hold the request's prompt) and leave
//! (finished, or their client went away). Each step spends at most `max_num_batched_tokens`:
//! every decoding sequence gets its one token first, prompt chunks share the rest, so a long
//! prompt never stalls running decodes for more than one step; while decodes run, the chunks
//! are also cut to the ITL budget `max_step_ms` by the engine's own fit of its step times
//! ([`step_time`]). KV blocks are taken as
//! sequences grow; when the pool runs out, the newest sequence is preempted and later
//! recomputed ([`plan`] holds these rules, tested without a model).

mod engine_loop;
pub mod plan;
mod settings;
mod step_time;
pub mod tail;

pub use settings::{BatchSettings, DEFAULT_MAX_STEP_MS, watch_settings_file};

use crate::LoadedModel;
use crate::generate::{FinishReason, GenerateRequest};
use crate::metrics::EngineMetrics;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
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
    /// Forward steps that failed in a row (0 after any step that succeeds).
    failed_steps: AtomicU32,
    /// When the forward step now running started, in ms of [`monotonic_ms`] (0: none running).
    step_started_ms: AtomicU64,
    /// Faults a test asked for (see [`SchedulerHandle::inject_faults`]).
    faults: FaultState,
}

/// After this many forward steps failing in a row the engine reports itself unhealthy, so
/// its pod is restarted instead of answering 500s forever.
pub const UNHEALTHY_AFTER_FAILED_STEPS: u32 = 3;

/// Milliseconds on a process-wide monotonic clock, never 0.
fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Why the engine is not healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sickness {
    /// The scheduler thread exited (it panicked).
    Stopped,
    /// The last `n` forward steps all failed.
    FailingSteps(u32),
    /// One forward step has been running for this long, past the stall limit.
    Stalled(Duration),
}

impl std::fmt::Display for Sickness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sickness::Stopped => write!(f, "the scheduler stopped"),
            Sickness::FailingSteps(n) => write!(f, "the last {n} forward steps failed"),
            Sickness::Stalled(d) => write!(f, "a forward step has run for {:.1} s", d.as_secs_f64()),
        }
    }
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
    /// Why the engine cannot serve, if it cannot: its scheduler stopped, its steps keep
    /// failing, or one step has run longer than `stall_limit` (a hung kernel or device).
    pub fn sickness(&self, stall_limit: Duration) -> Option<Sickness> {
        if self.is_stopped() {
            return Some(Sickness::Stopped);
        }
        let failed = self.failed_steps.load(Ordering::Acquire);
        if failed >= UNHEALTHY_AFTER_FAILED_STEPS {
            return Some(Sickness::FailingSteps(failed));
        }
        let started = self.step_started_ms.load(Ordering::Acquire);
        if started > 0 {
            let running = Duration::from_millis(monotonic_ms().saturating_sub(started));
            if running > stall_limit {
                return Some(Sickness::Stalled(running));
            }
        }
        None
    }
    fn step_started(&self) {
        self.step_started_ms.store(monotonic_ms(), Ordering::Release);
    }
    fn step_ended(&self, ok: bool) {
        self.step_started_ms.store(0, Ordering::Release);
        if ok {
            self.failed_steps.store(0, Ordering::Release);
        } else {
            self.failed_steps.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Faults injected by tests through [`SchedulerHandle::inject_faults`].
#[derive(Debug, Default)]
struct FaultState {
    fail_steps: AtomicU32,
    stall_ms: AtomicU64,
}

/// Faults for a test to inject into the running scheduler: the health checks are tested
/// against a real engine whose steps fail or hang.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// The next this many forward steps fail (as a kernel error would).
    pub fail_steps: u32,
    /// The next forward step sleeps this long first (as a hung device would).
    pub stall: Duration,
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

    /// Injects faults into the next forward steps. For tests of the health checks: nothing
    /// in the engine calls it, and a step without faults pays two atomic loads for it.
    #[doc(hidden)]
    pub fn inject_faults(&self, faults: Faults) {
        let f = &self.shared.faults;
        f.stall_ms.store(faults.stall.as_millis() as u64, Ordering::Release);
        f.fail_steps.store(faults.fail_steps, Ordering::Release);
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
