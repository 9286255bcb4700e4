//! A calibrated discrete-event simulator of one InferenceService under a scaling policy, on a
//! virtual clock: engine replicas batching like `pacer-engine` with a profile's step times, a
//! least-outstanding-requests router, pod start-up, drains and surge rollouts, Prometheus'
//! scrapes and arithmetic, and a policy evaluated at its interval on what Prometheus answers.
//! Hours of traffic run in seconds of CPU; a seed reproduces a run exactly.
//!
//! - [`replica`]: one engine replica's scheduler and step times.
//! - [`fleet`]: pods, readiness, drains, rollouts and the router.
//! - [`prom`]: histograms, scrapes, `rate` and `histogram_quantile`.
//! - [`trace`]: step, ramp, diurnal, bursty and replayed traces.
//! - [`policy`]: the policy trait and the baselines; [`pacer`]: Pacer's planner.
//! - [`calibrate`]: capacity at the SLA from the profile (the bound, Dynamo's profile).
//! - [`fidelity`]: a measured run replayed through one simulated replica, side by side.
//! - [`score`]: windows, attainment, replica-seconds, changes, recovery.
//! - [`plot`]: the timeline picture; [`compare`]: every policy on every trace.
#![forbid(unsafe_code)]
// Output goes through `tracing` or a returned value; a print in a library is a leftover.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod calibrate;
pub mod compare;
pub mod dynamo;
pub mod fidelity;
pub mod fleet;
pub mod hindsight;
pub mod pacer;
pub mod plot;
pub mod policy;
pub mod prom;
pub mod replica;
pub mod score;
pub mod trace;

use fleet::{Fleet, PodState};
use pacer_crds::{InferenceService, InferenceServiceSpec, Tier};
use pacer_planner::{EngineProfile, Levers, PlannerSpec, StepModel};
use policy::Policy;
use prom::{Prometheus, Sample};
use replica::{Finished, Seq, Settings};
use score::{Outcome, Scorer};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use trace::Trace;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file or argument is unusable.
    #[error("{0}")]
    Input(String),
    /// Writing results failed.
    #[error("writing {path}: {message}")]
    Output {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}

/// Everything a run needs besides the trace and the policy.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Targets, ranges and policy of the service.
    pub spec: PlannerSpec,
    /// One profile per tier the service may run.
    pub profiles: Vec<EngineProfile>,
    /// The levers the service starts with.
    pub initial: Levers,
    /// Seconds from pod creation to the engine process starting (image, scheduling).
    pub container_start: f64,
    /// Seconds between Prometheus scrapes.
    pub scrape_interval: f64,
    /// Window of `rate()` for request and token rates and means.
    pub rate_window: f64,
    /// Seconds per scoring window.
    pub score_window: f64,
    /// Tokens each engine's KV cache holds: `pacer-engine`'s default, or for a vLLM service
    /// the GPU of the vLLM-like profile ([`VLLM_KV_CACHE_TOKENS`]).
    pub kv_cache_tokens: u32,
}

impl SimConfig {
    /// A run of `spec` on `profiles` with the defaults: 20 s container start, 15 s scrapes,
    /// 1 min rate window, 1 min scoring windows. Tiers without a profile are dropped from the
    /// allowed tiers.
    pub fn new(isvc: &InferenceServiceSpec, profiles: Vec<EngineProfile>) -> Result<SimConfig, SimError> {
        let mut spec = isvc.planner_spec();
        let has = |t: &Tier| profiles.iter().any(|p| p.tier == *t);
        spec.tiers.retain(|t| has(t));
        if !has(&spec.preferred_tier) {
            return Err(SimError::Input(format!(
                "no profile for the preferred tier {} (profiles: {})",
                spec.preferred_tier,
                profiles.iter().map(|p| p.tier.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        if spec.tiers.len() < 2 {
            spec.allow_degrade = false;
        }
        let initial = Levers {
            replicas: spec.min_replicas,
            max_batch_size: spec.batch_initial,
            batch_wait_ms: isvc.batching.batch_wait_ms.initial,
            max_num_batched_tokens: spec.budget_initial.max(spec.batch_initial),
            tier: spec.preferred_tier,
        };
        Ok(SimConfig {
            spec,
            profiles,
            initial,
            container_start: 20.0,
            scrape_interval: 15.0,
            rate_window: 60.0,
            score_window: 60.0,
            kv_cache_tokens: match isvc.engine.runtime {
                pacer_crds::Runtime::Pacer => replica::KV_CACHE_TOKENS,
                pacer_crds::Runtime::Vllm => VLLM_KV_CACHE_TOKENS,
            },
        })
    }

    /// Index of `tier`'s profile.
    pub fn tier_index(&self, tier: Tier) -> Option<usize> {
        self.profiles.iter().position(|p| p.tier == tier)
    }
}

/// The service the simulator runs when no spec is given: P95 TTFT ≤ 1 s and ITL ≤ 40 ms
/// over 2 min windows, 1–8 replicas, batch 1–32 starting at 8.
pub const DEFAULT_SPEC: &str = include_str!("default-spec.yaml");

/// Reads an InferenceService (or just its spec) from YAML.
pub fn read_spec(yaml: &str) -> Result<InferenceServiceSpec, SimError> {
    if let Ok(isvc) = serde_yaml::from_str::<InferenceService>(yaml) {
        return Ok(isvc.spec);
    }
    serde_yaml::from_str::<InferenceServiceSpec>(yaml)
        .map_err(|e| SimError::Input(format!("not an InferenceService or its spec: {e}")))
}

/// A profile with realistic step times for the test model (SmolLM2-135M) on one thread, for
/// tests and for runs before measured profiles exist: about 12 ms per step plus 1 ms per decode
/// row, 0.35 ms per prompt token; `q4_0` about 30 % faster than `q8_0`, `native` in between.
///
/// vLLM's tiers get [`vllm_profile`]'s figures.
pub fn test_profile(tier: Tier) -> EngineProfile {
    let speed = match tier {
        Tier::F32 => 1.6,
        Tier::Q8_0 => 1.0,
        Tier::Native => 0.85,
        Tier::Q4_0 => 0.7,
        _ => return vllm_profile(tier),
    };
    EngineProfile {
        schema: pacer_planner::profile::PROFILE_SCHEMA,
        model: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        tier,
        threads: 1,
        device: "built-in test profile".into(),
        load_seconds: 2.0,
        warmup_seconds: 0.5,
        step: StepModel {
            base_s: 0.012 * speed,
            per_decode_row_s: 0.001 * speed,
            per_prefill_token_s: 0.00035 * speed,
            per_context_token_s: 0.000_000_5 * speed,
        },
        samples: Vec::new(),
        quality: None,
    }
}

/// A vLLM-like profile: an 8-billion-parameter Llama (Llama-3.1-8B-Instruct) on one H100 SXM,
/// **derived, not measured** — no GPU has run here. The figures come from the roofline of
/// NVIDIA's datasheet (3.35 TB/s of HBM3; 989 dense BF16 and 1,979 dense FP8 tensor TFLOPS) at
/// 70 % of the bandwidth and 50 % of the compute:
///
/// - a step reads every weight once: 16.1 GB in bf16/fp16 (6.9 ms), 8.0 GB in fp8/int8
///   (3.4 ms), 4.3 GB in int4 (1.8 ms), plus 0.3 ms of launch and scheduling;
/// - each token a step carries, decode row or prompt token, costs 2 × 8.0 G multiply-adds:
///   32 µs in bf16 (W4A16 int4 too, whose activations stay 16-bit), 16 µs on FP8 units;
/// - each context token a decode row attends to reads 128 KiB of bf16 KV (64 KiB in fp8):
///   56 / 28 ns;
/// - a pod is ready 90 s after its container starts (loading the weights from a local disk,
///   then `torch.compile` and CUDA-graph capture), not counting the image pull.
///
/// The planner's logic, not vLLM's speed, is what runs on these figures: they set the scale
/// (a replica carries tens of requests a second at a 50 ms ITL) and the slow pod start.
pub fn vllm_profile(tier: Tier) -> EngineProfile {
    let (weights_s, per_token_s, per_context_s) = match tier {
        Tier::Fp8 | Tier::Int8 => (0.0034, 0.000_016, 0.000_000_028),
        Tier::Int4 | Tier::Q4_0 => (0.0018, 0.000_032, 0.000_000_056),
        _ => (0.0069, 0.000_032, 0.000_000_056),
    };
    EngineProfile {
        schema: pacer_planner::profile::PROFILE_SCHEMA,
        model: "meta-llama/Llama-3.1-8B-Instruct (derived)".into(),
        tier,
        threads: 1,
        device: "NVIDIA H100 SXM, roofline estimate".into(),
        load_seconds: 60.0,
        warmup_seconds: 30.0,
        step: StepModel {
            base_s: weights_s + 0.0003,
            per_decode_row_s: per_token_s,
            per_prefill_token_s: per_token_s,
            per_context_token_s: per_context_s,
        },
        samples: Vec::new(),
        quality: None,
    }
}

/// The KV cache of a vLLM replica of the vLLM-like profile: about 52 GB of an H100's 80 GB left
/// after the weights and activations, at 128 KiB per token of Llama-3.1-8B's bf16 KV.
pub const VLLM_KV_CACHE_TOKENS: u32 = 400_000;

/// The service `pacer-operator simulate --profile builtin-vllm` runs when no spec is given: a
/// vLLM deployment of an 8B model with a bf16 and an fp8 variant, P95 TTFT ≤ 500 ms and
/// ITL ≤ 50 ms.
pub const VLLM_SPEC: &str = include_str!("vllm-spec.yaml");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Engine(usize),
    Ready(usize),
    Scrape,
    Move,
    Window,
}

#[derive(Debug)]
struct Timed {
    at: f64,
    seq: u64,
    event: Event,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    // Reversed: the heap pops the earliest event, and among equal times the first scheduled.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

struct Clock {
    heap: BinaryHeap<Timed>,
    seq: u64,
    /// The time each pod's engine event is scheduled for; other entries are stale.
    engine_at: HashMap<usize, f64>,
}

impl Clock {
    fn push(&mut self, at: f64, event: Event) {
        self.seq += 1;
        self.heap.push(Timed { at, seq: self.seq, event });
    }

    fn engine(&mut self, fleet: &Fleet, id: usize) {
        match fleet.next_event(id) {
            Some(t) if self.engine_at.get(&id) != Some(&t) => {
                self.engine_at.insert(id, t);
                self.push(t, Event::Engine(id));
            }
            Some(_) => {}
            None => {
                self.engine_at.remove(&id);
            }
        }
    }
}

/// The engine settings of `levers`, with the ITL budget the operator renders for `spec` (every
/// policy runs Pacer's engines, so every policy's engines run it).
fn settings(levers: &Levers, spec: &PlannerSpec) -> Settings {
    Settings {
        max_batch_size: levers.max_batch_size,
        batch_wait: f64::from(levers.batch_wait_ms) / 1000.0,
        token_budget: levers.max_num_batched_tokens,
        max_step: f64::from(spec.max_step_ms) / 1000.0,
    }
}

/// The settings the pod template carries where the engines read them only at start
/// (`spec.batch_rolls`): a change of them rolls the pods.
fn pinned(levers: &Levers, spec: &PlannerSpec) -> Option<Settings> {
    spec.batch_rolls.then(|| settings(levers, spec))
}

/// Runs `trace` through the service under `policy`.
pub fn simulate(config: &SimConfig, trace: &Trace, policy: &mut dyn Policy) -> Result<Outcome, SimError> {
    let spec = &config.spec;
    let tier_of = |l: &Levers| {
        config.tier_index(l.tier).ok_or_else(|| SimError::Input(format!("no profile for tier {}", l.tier)))
    };
    let mut levers = config.initial;
    let mut fleet = Fleet::with_kv(
        config.profiles.clone(),
        config.container_start,
        levers.replicas,
        tier_of(&levers)?,
        config.kv_cache_tokens,
    );
    fleet.pin(pinned(&levers, spec));
    let retention = spec.window.max(config.rate_window) + 4.0 * config.scrape_interval;
    let mut prom = Prometheus::new(retention);
    let mut clock = Clock { heap: BinaryHeap::new(), seq: 0, engine_at: HashMap::new() };
    let mut scorer = Scorer::new(config, trace, &policy.name());
    clock.push(0.0, Event::Scrape);
    clock.push(policy.interval(), Event::Move);
    clock.push(config.score_window, Event::Window);
    let mut next_arrival = 0usize;
    let mut done: Vec<Finished> = Vec::new();
    let mut last_t = 0.0;
    let mut last_reason = String::new();
    loop {
        let heap_next = clock.heap.peek().map_or(f64::INFINITY, |e| e.at);
        let arrival_next = trace.requests.get(next_arrival).map_or(f64::INFINITY, |r| r.timestamp);
        let now = heap_next.min(arrival_next);
        if now > trace.duration || !now.is_finite() {
            scorer.pods_until(trace.duration, fleet.pods.len(), last_t);
            break;
        }
        scorer.pods_until(now, fleet.pods.len(), last_t);
        last_t = now;
        if arrival_next <= heap_next {
            let r = trace.requests[next_arrival];
            let seq = Seq::new(next_arrival, now, r.prompt_tokens, r.output_tokens);
            next_arrival += 1;
            scorer.arrival(now);
            if let Some(id) = fleet.route(seq, now, settings(&levers, spec)) {
                clock.engine(&fleet, id);
            }
            continue;
        }
        let Some(Timed { at, event, .. }) = clock.heap.pop() else { break };
        match event {
            Event::Engine(id) => {
                if clock.engine_at.get(&id) != Some(&at) {
                    continue;
                }
                clock.engine_at.remove(&id);
                fleet.poll(id, at, settings(&levers, spec), &mut done);
                for f in done.drain(..) {
                    scorer.finished(&f);
                }
                clock.engine(&fleet, id);
                fleet.reap();
                for id in fleet.take_terminated() {
                    prom.mark_stale(id);
                    clock.engine_at.remove(&id);
                }
            }
            Event::Ready(id) => {
                if fleet.mark_ready(id, at, settings(&levers, spec)) {
                    let created = fleet.reconcile(at, levers.replicas, tier_of(&levers)?);
                    for (id, ready_at) in created {
                        clock.push(ready_at, Event::Ready(id));
                    }
                    settle(&mut fleet, &mut clock, &mut prom);
                }
            }
            Event::Scrape => {
                for p in fleet.pods.iter().filter(|p| !matches!(p.state, PodState::Starting { .. })) {
                    let e = &p.engine;
                    let mut sample =
                        Sample::of(at, &e.metrics, e.running() as f64, e.waiting() as f64, e.kv_usage());
                    sample.queued_prompt_tokens = e.queued_prompt_tokens() as f64;
                    prom.push(p.id, sample);
                }
                prom.compact(at);
                clock.push(at + config.scrape_interval, Event::Scrape);
            }
            Event::Move => {
                let tier = tier_of(&levers)?;
                let mut seen = prom.observe(
                    at,
                    spec.quantile(),
                    spec.window,
                    config.rate_window,
                    fleet.ready_at_tier(tier),
                    levers.replicas,
                );
                seen.engines = fleet.reports();
                let tick = policy.evaluate(at, &seen, &levers);
                let mut next = tick.levers;
                next.replicas = next.replicas.clamp(spec.min_replicas, spec.max_replicas);
                if config.tier_index(next.tier).is_none() {
                    next.tier = levers.tier;
                }
                if next != levers {
                    scorer.decision(at, &levers, &next, &tick.reason);
                    let batch_changed =
                        (next.max_batch_size, next.batch_wait_ms, next.max_num_batched_tokens)
                            != (levers.max_batch_size, levers.batch_wait_ms, levers.max_num_batched_tokens);
                    levers = next;
                    fleet.pin(pinned(&levers, spec));
                    if batch_changed && !spec.batch_rolls {
                        // Live settings reach every engine now (the engines watch their file).
                        let ids: Vec<usize> = fleet.pods.iter().map(|p| p.id).collect();
                        for id in ids {
                            fleet.poll(id, at, settings(&levers, spec), &mut done);
                            clock.engine(&fleet, id);
                        }
                        for f in done.drain(..) {
                            scorer.finished(&f);
                        }
                    }
                    let created = fleet.reconcile(at, levers.replicas, tier_of(&levers)?);
                    for (id, ready_at) in created {
                        clock.push(ready_at, Event::Ready(id));
                    }
                    settle(&mut fleet, &mut clock, &mut prom);
                }
                last_reason = tick.reason;
                clock.push(at + policy.interval(), Event::Move);
            }
            Event::Window => {
                let tier = tier_of(&levers)?;
                let seen_p = prom.observe(at, spec.quantile(), spec.window, config.rate_window, 0, 0);
                scorer.close_window(
                    at,
                    &levers,
                    fleet.ready_at_tier(tier),
                    fleet.pods.len(),
                    &seen_p,
                    &last_reason,
                );
                clock.push(at + config.score_window, Event::Window);
            }
        }
    }
    let in_flight = fleet.pods.iter().map(|p| p.engine.outstanding()).sum::<usize>() + fleet.pending();
    Ok(scorer.finish(fleet.failed(), in_flight))
}

/// After pods changed: reschedules every engine (held requests may have moved), removes idle
/// drained pods and retires their series.
fn settle(fleet: &mut Fleet, clock: &mut Clock, prom: &mut Prometheus) {
    fleet.reap();
    for id in fleet.take_terminated() {
        prom.mark_stale(id);
        clock.engine_at.remove(&id);
    }
    let ids: Vec<usize> = fleet.pods.iter().map(|p| p.id).collect();
    for id in ids {
        clock.engine(fleet, id);
    }
}
