//! The capacity model: from an engine profile's step times and an observed workload to the
//! percentiles the SLA is about, for any replica count, batch size and tier.
//!
//! One replica is a continuous-batching server with `max_batch_size` slots. A request holds a
//! slot for its prefill and its decode steps; every step costs what the profile's
//! [`StepModel`] says for the rows and prompt tokens in it. The running batch size follows from
//! Little's law by fixed-point iteration; requests beyond the free slots queue, and the queue is
//! an M/M/c (Erlang C) queue with one server per slot, whose waiting-time tail gives TTFT's. A
//! step that carries a prompt chunk is longer, which is what ITL's tail sees. The model is a
//! seed: [`Correction`](super::Correction) factors learned online (observed / predicted) absorb
//! what it leaves out.

use super::observation::ServiceMetrics;
use super::profile::{EngineProfile, StepModel};
use pacer_crds::Tier;
use std::collections::BTreeMap;

/// Most prompt and decode tokens one step processes (the engine's `--max-num-batched-tokens`).
pub const STEP_TOKEN_BUDGET: f64 = 512.0;

/// The load on a service: arrivals and mean request shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Requests per second, over the whole service.
    pub request_rate: f64,
    /// Mean prompt tokens per request.
    pub prompt_tokens: f64,
    /// Mean generated tokens per request.
    pub output_tokens: f64,
}

impl Workload {
    /// The workload the metrics show, when the rates are known and there is traffic to average.
    pub fn from_metrics(m: &ServiceMetrics) -> Option<Workload> {
        let rate = m.request_rate.filter(|r| r.is_finite() && *r >= 0.0)?;
        let prompt = m.prompt_token_rate.filter(|r| r.is_finite() && *r >= 0.0)?;
        let output = m.output_token_rate.filter(|r| r.is_finite() && *r >= 0.0)?;
        if rate <= 1e-9 {
            return None;
        }
        Some(Workload {
            request_rate: rate,
            prompt_tokens: prompt / rate,
            output_tokens: (output / rate).max(1.0),
        })
    }
}

/// Predicted percentiles of one configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// TTFT at the percentile, seconds (infinite when the replicas cannot keep up).
    pub ttft: f64,
    /// ITL at the percentile, seconds.
    pub itl: f64,
    /// Share of the slot capacity in use, 0..1 (≥ 1: overloaded).
    pub utilization: f64,
    /// Mean running batch per replica.
    pub batch: f64,
}

impl Prediction {
    /// Whether the replicas keep up with the arrivals at all.
    pub fn stable(&self) -> bool {
        self.utilization < 1.0 && self.ttft.is_finite()
    }
}

/// Step-time models per tier.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityModel {
    steps: BTreeMap<Tier, StepModel>,
}

impl CapacityModel {
    /// A model from profiles, one per tier (a later profile of the same tier wins; profiles of
    /// tiers Pacer does not know are ignored).
    pub fn new(profiles: Vec<EngineProfile>) -> CapacityModel {
        let mut steps = BTreeMap::new();
        for p in profiles {
            if let Some(tier) = tier_named(&p.tier) {
                steps.insert(tier, p.step);
            }
        }
        CapacityModel { steps }
    }

    /// A model from step models directly (tests and the simulator).
    pub fn from_steps(steps: impl IntoIterator<Item = (Tier, StepModel)>) -> CapacityModel {
        CapacityModel { steps: steps.into_iter().collect() }
    }

    /// The step model of `tier`, if profiled.
    pub fn step(&self, tier: Tier) -> Option<&StepModel> {
        self.steps.get(&tier)
    }

    /// Whether no tier is profiled (the planner is then purely reactive).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Predicted percentiles (`quantile` in 0..1) of `replicas` replicas at `tier` with
    /// `max_batch_size` slots each under `load`; `None` when the tier is not profiled.
    pub fn predict(
        &self,
        tier: Tier,
        max_batch_size: u32,
        replicas: i32,
        load: &Workload,
        quantile: f64,
    ) -> Option<Prediction> {
        let step = self.step(tier)?;
        Some(predict_replica(step, f64::from(max_batch_size.max(1)), load, replicas.max(1), quantile))
    }
}

/// The tier `pacer-engine --tier` calls `name`.
pub fn tier_named(name: &str) -> Option<Tier> {
    [Tier::F32, Tier::Q8_0, Tier::Native, Tier::Q4_0].into_iter().find(|t| t.as_str() == name)
}

fn predict_replica(
    step: &StepModel,
    slots: f64,
    load: &Workload,
    replicas: i32,
    quantile: f64,
) -> Prediction {
    let lambda = load.request_rate / f64::from(replicas);
    let prompt = load.prompt_tokens.max(0.0);
    let output = load.output_tokens.max(1.0);
    // Tokens a decode row attends to, on average over its life.
    let context = prompt + output / 2.0;
    let chunks = (prompt / STEP_TOKEN_BUDGET).ceil().max(1.0);
    let decode_step = |b: f64| step.step_seconds(b, 0.0, b * context);
    // Fixed point of Little's law: batch = arrivals × slot-holding time, capped by the slots.
    let mut batch = (lambda * (decode_step(1.0) * output)).min(slots).max(f64::MIN_POSITIVE);
    let mut hold = 0.0;
    for _ in 0..40 {
        let b = batch.max(1.0);
        // Prompt work spread over the decode steps stretches each of them.
        let prefill_share = (lambda * prompt * step.per_prefill_token_s).min(0.95);
        let itl_mean = decode_step(b) / (1.0 - prefill_share);
        let prefill = prompt * step.per_prefill_token_s + chunks * decode_step(b);
        hold = prefill + (output - 1.0).max(0.0) * itl_mean;
        let next = (lambda * hold).min(slots);
        if (next - batch).abs() < 1e-6 {
            batch = next;
            break;
        }
        batch = 0.5 * batch + 0.5 * next;
    }
    let b = batch.max(1.0);
    let offered = lambda * hold;
    let utilization = offered / slots;
    // ITL's tail: the share of steps that carry a prompt chunk; if it exceeds the tail mass the
    // percentile lands on such a step.
    let plain = decode_step(b);
    let chunk_tokens = prompt.min(STEP_TOKEN_BUDGET - b).max(0.0);
    let with_chunk = plain + chunk_tokens * step.per_prefill_token_s;
    let steps_per_second = 1.0 / plain.max(1e-9);
    let chunk_share = (lambda * chunks / steps_per_second).min(1.0);
    let tail = 1.0 - quantile;
    let itl = if chunk_share >= tail {
        with_chunk
    } else {
        // Between the two, in proportion to how close the chunk share comes to the tail.
        plain + (with_chunk - plain) * (chunk_share / tail)
    };
    let prefill_alone = prompt * step.per_prefill_token_s + chunks * decode_step(b);
    let ttft = if utilization >= 1.0 {
        f64::INFINITY
    } else {
        prefill_alone + erlang_c_wait_quantile(slots, offered, hold, quantile)
    };
    Prediction { ttft, itl, utilization, batch: b }
}

/// The `quantile` of the waiting time of an M/M/c queue with `c` servers, offered load `a`
/// (Erlangs) and mean service time `service`: `P(W > t) = C(c, a)·exp(−(c − a)·t/service)`.
pub fn erlang_c_wait_quantile(c: f64, a: f64, service: f64, quantile: f64) -> f64 {
    if a <= 0.0 {
        return 0.0;
    }
    if a >= c {
        return f64::INFINITY;
    }
    let waiting = erlang_c(c.floor().max(1.0) as u32, a);
    let tail = 1.0 - quantile;
    if waiting <= tail {
        return 0.0;
    }
    (waiting / tail).ln() * service / (c - a)
}

/// Erlang C: the probability that an arrival waits, for `c` servers and offered load `a`.
pub fn erlang_c(c: u32, a: f64) -> f64 {
    if a <= 0.0 {
        return 0.0;
    }
    let cf = f64::from(c);
    if a >= cf {
        return 1.0;
    }
    // Erlang B by its stable recursion, then C from B.
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (f64::from(k) + a * b);
    }
    let rho = a / cf;
    b / (1.0 - rho + rho * b)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Step times like SmolLM2-135M's on one thread of this project's CI machine.
    pub fn test_step() -> StepModel {
        StepModel {
            base_s: 0.012,
            per_decode_row_s: 0.001,
            per_prefill_token_s: 0.00035,
            per_context_token_s: 2e-6,
        }
    }

    fn load(rate: f64) -> Workload {
        Workload { request_rate: rate, prompt_tokens: 200.0, output_tokens: 100.0 }
    }

    #[test]
    fn erlang_c_matches_known_values() {
        // Textbook values: c = 1 is M/M/1 (P(wait) = ρ); c = 2, a = 1 gives 1/3.
        assert!((erlang_c(1, 0.5) - 0.5).abs() < 1e-12);
        assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(erlang_c(4, 0.0), 0.0);
        assert_eq!(erlang_c(4, 5.0), 1.0);
    }

    #[test]
    fn one_request_alone_costs_its_prefill_and_decode_steps() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let p = model.predict(Tier::Native, 8, 1, &load(0.001), 0.95).expect("profiled");
        let s = test_step();
        assert!((p.itl - s.step_seconds(1.0, 0.0, 250.0)).abs() < 2e-3, "{p:?}");
        let prefill = 200.0 * s.per_prefill_token_s + s.step_seconds(1.0, 0.0, 250.0);
        assert!((p.ttft - prefill).abs() < 1e-3, "{p:?}");
    }

    #[test]
    fn more_load_means_slower_and_more_replicas_mean_faster() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let at = |rate: f64, n: i32| model.predict(Tier::Native, 8, n, &load(rate), 0.95).expect("profiled");
        let (light, heavy) = (at(0.5, 1), at(2.0, 1));
        assert!(heavy.ttft > light.ttft && heavy.itl > light.itl && heavy.utilization > light.utilization);
        assert!(at(2.0, 2).ttft < heavy.ttft);
        // Far past capacity the queue never drains.
        assert!(!at(100.0, 1).stable());
        assert!(model.predict(Tier::Q4_0, 8, 1, &load(1.0), 0.95).is_none(), "unprofiled tier");
    }

    #[test]
    fn a_smaller_batch_lowers_itl() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let at = |b: u32| model.predict(Tier::Native, b, 1, &load(1.5), 0.95).expect("profiled");
        assert!(at(4).itl <= at(16).itl);
    }
}
