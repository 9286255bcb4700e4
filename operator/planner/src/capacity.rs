//! The capacity model: from an engine profile's step times and a workload to the percentiles the
//! SLA is about, for any configuration (replicas, batch size, token budget, tier), and from
//! there to the highest request rate one replica of a configuration holds within a share of the
//! targets.
//!
//! One replica is a continuous-batching server with `max_batch_size` slots and a token budget
//! per step. A request holds a slot for its prefill and its decode steps; every step costs what
//! the profile's [`StepModel`] says for the rows, prompt tokens and context in it.
//!
//! - The running batch follows from Little's law by fixed-point iteration; prompt work spread
//!   over the decode steps stretches each of them.
//! - Requests beyond the free slots queue: an M/M/c (Erlang C) queue with one server per slot
//!   gives the waiting-time tail. Prompts also queue for the step's token budget behind other
//!   prompts (an M/M/1 tail on the prefill work). TTFT at the percentile is the percentile of
//!   both waits plus the request's own prefill, prompt lengths log-normal around the mean and
//!   the observed length at the percentile ([`super::tail`]).
//! - ITL's tail is a mixture: most steps carry decode rows only, a share `f` also carries a
//!   prompt chunk (at most the budget less the decode rows). The percentile lands on the chunk
//!   steps once `f` exceeds the tail's mass, and rises with `f`: this is why the token budget
//!   is a lever for ITL and the batch size often is not.
//!
//! The model is a seed: [`Correction`](super::Correction) factors learned online (observed /
//! predicted, per configuration) absorb what it leaves out.

use super::observation::ServiceMetrics;
use super::profile::{EngineProfile, StepModel};
use super::tail::{Lengths, Wait, quantile_of_sum};
use crate::Tier;
use std::collections::BTreeMap;

pub use pacer_engine_api::defaults::STEP_TOKEN_BUDGET;
/// A long prompt, for TTFT's tail, as a multiple of the mean prompt (the workload only gives
/// the mean; 1.5 sits between a fixed length, 1.0, and a uniform spread's P95, 1.9).
pub const LONG_PROMPT: f64 = 1.5;

/// The load on a service: arrivals and mean request shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Requests per second, over the whole service.
    pub request_rate: f64,
    /// Mean prompt tokens per request.
    pub prompt_tokens: f64,
    /// Mean generated tokens per request.
    pub output_tokens: f64,
    /// Prompt tokens at the SLA percentile, when observed ([`LONG_PROMPT`] × the mean
    /// otherwise).
    pub prompt_tail: Option<f64>,
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
            prompt_tail: m.prompt_tokens_tail.filter(|p| p.is_finite() && *p >= 1.0),
        })
    }

    /// The same request shape at another rate.
    pub fn at_rate(&self, request_rate: f64) -> Workload {
        Workload { request_rate: request_rate.max(0.0), ..*self }
    }
}

/// One replica's engine settings and tier: what the capacity of a replica depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EngineConfig {
    /// The weights' tier.
    pub tier: Tier,
    /// Most sequences in the running batch.
    pub max_batch_size: u32,
    /// Most tokens one step carries.
    pub token_budget: u32,
    /// The engines' ITL budget (`max_step_ms`; 0 = none): while rows decode, a step's prompt
    /// tokens are cut to what keeps it this short, never below half the decodes' own time.
    pub max_step_ms: u32,
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
    /// A model from profiles. Of several profiles of one tier (other thread counts, other
    /// machines) the slowest at a batch of 8 is kept: planning for less capacity errs on the
    /// side of the SLA. (A profile of a tier Pacer does not know does not parse.)
    pub fn new(profiles: Vec<EngineProfile>) -> CapacityModel {
        let mut steps: BTreeMap<Tier, StepModel> = BTreeMap::new();
        let cost = |s: &StepModel| s.step_seconds(8.0, 0.0, 8.0 * 256.0);
        for p in profiles {
            let slower = steps.get(&p.tier).is_none_or(|kept| cost(&p.step) > cost(kept));
            if slower {
                steps.insert(p.tier, p.step);
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

    /// This model with the step models learnt online ([`crate::online`]) for the tiers it has
    /// no profile of, where a fit is ready (and, with `checked`, has explained the last still
    /// window it was checked on: [`crate::online::StepFit::agrees`]); profiled tiers keep their
    /// profile.
    pub fn with_online(
        &self,
        fits: &BTreeMap<String, crate::online::StepFit>,
        checked: bool,
    ) -> CapacityModel {
        let mut steps = self.steps.clone();
        for (name, fit) in fits {
            if checked && !fit.agrees {
                continue;
            }
            if let (Some(tier), Some(step)) = (Tier::named(name), fit.model()) {
                steps.entry(tier).or_insert(step);
            }
        }
        CapacityModel { steps }
    }

    /// Whether no tier is profiled (the planner then learns from observations alone).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Predicted percentiles (`quantile` in 0..1) of `replicas` replicas of `config` under
    /// `load` (spread evenly over the replicas); `None` when the tier is not profiled.
    pub fn predict(
        &self,
        config: &EngineConfig,
        replicas: i32,
        load: &Workload,
        quantile: f64,
    ) -> Option<Prediction> {
        let step = self.step(config.tier)?;
        let per_replica = load.at_rate(load.request_rate / f64::from(replicas.max(1)));
        Some(predict_replica(step, config, &per_replica, quantile))
    }

    /// The highest request rate one replica of `config` holds with its predicted percentiles,
    /// multiplied by `scale` (a learned correction), within `ttft_limit` and `itl_limit`, for
    /// the request shape of `shape`; 0 when not even a lone request does; `None` when the tier
    /// is not profiled.
    pub fn capacity(
        &self,
        config: &EngineConfig,
        shape: &Workload,
        quantile: f64,
        limits: Limits,
    ) -> Option<f64> {
        let step = self.step(config.tier)?;
        let lone = predict_replica(step, config, &shape.at_rate(1e-6), quantile);
        // What no replica count lowers (a lone request's TTFT, mostly a long prompt's prefill)
        // is exempt from the margin by `floor_credit`: the margin is room for the queue's swings.
        let ttft_allowed = limits.ttft + limits.floor_credit * limits.ttft_scale * lone.ttft;
        let holds = |rate: f64| {
            let p = predict_replica(step, config, &shape.at_rate(rate), quantile);
            p.stable()
                && p.utilization <= limits.utilization
                && limits.ttft_scale * p.ttft <= ttft_allowed
                && limits.itl_scale * p.itl <= limits.itl
        };
        if !holds(1e-6) {
            return Some(0.0);
        }
        // The rate at which the slots alone would be full with lone-request hold times bounds
        // the search from above.
        let mut hi = f64::from(config.max_batch_size.max(1))
            / (lone.ttft + shape.output_tokens * lone.itl).max(1e-6)
            * 2.0;
        while holds(hi) && hi < 1e6 {
            hi *= 2.0;
        }
        let mut lo = 0.0;
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if holds(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo < 1e-4 * hi {
                break;
            }
        }
        Some(lo)
    }
}

/// The latencies a configuration must stay within, and the corrections its predictions are
/// multiplied by first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Seconds of TTFT allowed at the percentile.
    pub ttft: f64,
    /// Seconds of ITL allowed at the percentile.
    pub itl: f64,
    /// The learned TTFT correction (observed / predicted).
    pub ttft_scale: f64,
    /// The learned ITL correction.
    pub itl_scale: f64,
    /// The share of a configuration's TTFT floor (the corrected TTFT of a lone request, which
    /// no replica count lowers) added to `ttft`: with `ttft` = margin × target and this
    /// 1 − margin, the margin applies to the part of TTFT the replicas change, and a floor near
    /// the target does not ask for replicas that cannot help. 0: the margin applies to all of it.
    pub floor_credit: f64,
    /// The highest predicted utilization (slots, or the engine's time) allowed: near 1 a
    /// queue's percentiles swing from window to window whatever their mean says, and the
    /// percentiles the model predicts there are the least certain.
    pub utilization: f64,
}

/// The fewest prompt tokens the engine's first prompt gets in a step, whatever the ITL budget.
const MIN_CHUNK: f64 = pacer_engine_api::defaults::MIN_CHUNK as f64;

fn predict_replica(step: &StepModel, config: &EngineConfig, load: &Workload, quantile: f64) -> Prediction {
    let slots = f64::from(config.max_batch_size.max(1));
    let budget = f64::from(config.token_budget.max(config.max_batch_size).max(1));
    let lambda = load.request_rate.max(0.0);
    let prompt = load.prompt_tokens.max(1.0);
    let output = load.output_tokens.max(1.0);
    let tail = (1.0 - quantile).clamp(1e-6, 1.0);
    // Tokens a decode row attends to, on average over its life.
    let context = prompt + output / 2.0;
    let decode_step = |b: f64| step.step_seconds(b, 0.0, b * context);
    // Prompt tokens a step can carry beside `b` decode rows: the token budget's room, cut by
    // the ITL budget as the engine cuts it (prompts keep at least half the decodes' time and
    // a minimum chunk).
    let max_step = f64::from(config.max_step_ms) / 1000.0;
    let room = |b: f64| {
        let tokens = (budget - b).max(1.0);
        if max_step <= 0.0 || step.per_prefill_token_s <= 0.0 {
            return tokens;
        }
        let decodes = decode_step(b);
        let timed = (max_step.max(1.5 * decodes) - decodes) / step.per_prefill_token_s;
        tokens.min(timed.max(MIN_CHUNK))
    };
    // Steps a prompt of `tokens` takes beside a mean batch of `batch` others: the ITL budget
    // only cuts chunks while others decode, so below one the chunks mix both kinds of step.
    let chunks = |tokens: f64, batch: f64| {
        let b = batch.max(1.0);
        let company = batch.clamp(0.0, 1.0);
        let alone = (tokens / (budget - b).max(1.0)).ceil().max(1.0);
        let beside = (tokens / room(b)).ceil().max(1.0);
        company * beside + (1.0 - company) * alone
    };
    // Share of the engine's time spent on prompt tokens.
    let prefill_share = (lambda * prompt * step.per_prefill_token_s).min(0.95);
    // Fixed point of Little's law: batch = arrivals × slot-holding time, capped by the slots.
    let mut batch = (lambda * (decode_step(1.0) * output)).min(slots).max(f64::MIN_POSITIVE);
    let mut hold = 0.0;
    let mut itl_mean = decode_step(1.0);
    for _ in 0..60 {
        let b = batch.max(1.0);
        itl_mean = decode_step(b) / (1.0 - prefill_share);
        let prefill = prompt * step.per_prefill_token_s + chunks(prompt, batch) * decode_step(b);
        hold = prefill + (output - 1.0).max(0.0) * itl_mean;
        let next = (lambda * hold).min(slots);
        if (next - batch).abs() < 1e-7 {
            batch = next;
            break;
        }
        batch = 0.5 * batch + 0.5 * next;
    }
    let b = batch.max(1.0);
    let offered = lambda * hold;
    // The engine's time: every decode row and prompt token, and the fixed cost of steps as
    // full as the slots allow, must fit in a second; past that the queue grows whatever the
    // slots say.
    let busy = prefill_share
        + lambda
            * (output - 1.0).max(0.0)
            * (step.per_decode_row_s + step.per_context_token_s * context + step.base_s / slots);
    let utilization = (offered / slots).max(busy);

    // ITL: a mixture of plain decode steps and steps that carry a prompt chunk.
    let plain = decode_step(b);
    let chunk_share = (lambda * chunks(prompt, batch) * itl_mean).min(1.0);
    // Chunk sizes beside decoding rows (the only ones a stream waits on): spread evenly up to
    // twice the mean chunk, at most the room in a step.
    let mean_chunk = (prompt / (prompt / room(b)).ceil().max(1.0)).min(room(b));
    let widest = (2.0 * mean_chunk).min(room(b));
    let itl = if chunk_share <= tail {
        plain
    } else {
        plain + step.per_prefill_token_s * widest * (1.0 - tail / chunk_share)
    };

    // TTFT: wait for a slot (Erlang C), wait behind other prompts (M/M/1 on the prefill work),
    // then prefill the request's own prompt; the percentile of that sum, prompt lengths fitted
    // to the mean and the observed length at the percentile.
    let long = load.prompt_tail.unwrap_or(LONG_PROMPT * prompt).max(prompt).max(1.0);
    let prefill = |tokens: f64| tokens * step.per_prefill_token_s + chunks(tokens, batch) * decode_step(b);
    let ttft = if utilization >= 1.0 {
        f64::INFINITY
    } else {
        let slot = erlang_c_wait(slots, offered, hold);
        let behind_prompts = if prefill_share > 0.0 {
            let service = prompt * step.per_prefill_token_s;
            Wait { p: prefill_share, rate: (1.0 - prefill_share) / service.max(1e-9) }
        } else {
            Wait::NONE
        };
        quantile_of_sum(slot, behind_prompts, &Lengths::fit(prompt, long, quantile), prefill, quantile)
    };
    Prediction { ttft, itl, utilization, batch: b }
}

/// The waiting time of an M/M/c queue with `c` servers, offered load `a` (Erlangs) and mean
/// service time `service`, as a tail `P(W > t) = C(c, a)·exp(−(c − a)·t/service)`.
pub fn erlang_c_wait(c: f64, a: f64, service: f64) -> Wait {
    if a <= 0.0 || a >= c {
        return Wait { p: if a >= c { 1.0 } else { 0.0 }, rate: 1.0 };
    }
    Wait { p: erlang_c(c.floor().max(1.0) as u32, a), rate: (c - a) / service.max(1e-9) }
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
        Workload { request_rate: rate, prompt_tokens: 200.0, output_tokens: 100.0, prompt_tail: None }
    }

    /// 400-token prompts, 100-token answers: wide enough that chunk steps can reach the tail.
    fn long(rate: f64) -> Workload {
        Workload { prompt_tokens: 400.0, ..load(rate) }
    }

    fn config(batch: u32, budget: u32) -> EngineConfig {
        EngineConfig { tier: Tier::Native, max_batch_size: batch, token_budget: budget, max_step_ms: 0 }
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
        let p = model.predict(&config(8, 512), 1, &load(0.001), 0.95).expect("profiled");
        let s = test_step();
        assert!((p.itl - s.step_seconds(1.0, 0.0, 250.0)).abs() < 2e-3, "{p:?}");
        let prefill = 300.0 * s.per_prefill_token_s + s.step_seconds(1.0, 0.0, 250.0);
        assert!((p.ttft - prefill).abs() < 1e-3, "{p:?}");
    }

    #[test]
    fn more_load_means_slower_and_more_replicas_mean_faster() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let at = |rate: f64, n: i32| model.predict(&config(8, 512), n, &load(rate), 0.95).expect("profiled");
        let (light, heavy) = (at(0.5, 1), at(2.0, 1));
        assert!(heavy.ttft > light.ttft && heavy.itl > light.itl && heavy.utilization > light.utilization);
        assert!(at(2.0, 2).ttft < heavy.ttft);
        // Far past capacity the queue never drains.
        assert!(!at(100.0, 1).stable());
        let q4 = EngineConfig { tier: Tier::Q4_0, ..config(8, 512) };
        assert!(model.predict(&q4, 1, &load(1.0), 0.95).is_none(), "unprofiled tier");
    }

    #[test]
    fn a_smaller_token_budget_lowers_the_itl_tail_once_chunk_steps_reach_it() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        // Busy: more than the tail's share of steps carry a prompt chunk, so P95 ITL is such a
        // step, and smaller chunks make it shorter, at some cost in TTFT.
        let wide = model.predict(&config(8, 512), 1, &long(2.0), 0.95).expect("profiled");
        let narrow = model.predict(&config(8, 64), 1, &long(2.0), 0.95).expect("profiled");
        assert!(narrow.itl < 0.6 * wide.itl, "{narrow:?} vs {wide:?}");
        assert!(narrow.ttft >= wide.ttft, "{narrow:?} vs {wide:?}");
        // Light: chunk steps are rarer than the tail, P95 ITL is a plain step; cutting prompts
        // into more chunks puts more steps in the tail, so the budget is no lever there.
        let wide = model.predict(&config(8, 512), 1, &long(0.5), 0.95).expect("profiled");
        let narrow = model.predict(&config(8, 64), 1, &long(0.5), 0.95).expect("profiled");
        assert!(wide.itl <= narrow.itl, "{narrow:?} vs {wide:?}");
    }

    #[test]
    fn the_itl_budget_caps_the_itl_tail_and_costs_ttft_only_beside_decoding_rows() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let capped = EngineConfig { max_step_ms: 40, ..config(8, 512) };
        // Busy: the uncapped tail is a step carrying a wide chunk; the budget bounds it near
        // 40 ms, and prompts pay for it in more steps.
        let open = model.predict(&config(8, 512), 1, &long(1.9), 0.95).expect("profiled");
        let bounded = model.predict(&capped, 1, &long(1.9), 0.95).expect("profiled");
        assert!(open.itl > 0.06 && bounded.itl <= 0.041, "{bounded:?} vs {open:?}");
        assert!(bounded.ttft > open.ttft && bounded.ttft.is_finite(), "{bounded:?} vs {open:?}");
        // Moderate: wide chunk steps are rarer than the tail, so the open tail is a plain step;
        // the budget makes more steps carry chunks, and only costs (why it is opt-in).
        let open = model.predict(&config(8, 512), 1, &long(1.5), 0.95).expect("profiled");
        let bounded = model.predict(&capped, 1, &long(1.5), 0.95).expect("profiled");
        assert!(open.itl < bounded.itl && bounded.itl <= 0.041, "{bounded:?} vs {open:?}");
        assert!(bounded.ttft > open.ttft, "{bounded:?} vs {open:?}");
        // Nearly idle: a prompt rarely has company, so the budget barely changes its TTFT.
        let open = model.predict(&config(8, 512), 1, &long(0.01), 0.95).expect("profiled");
        let bounded = model.predict(&capped, 1, &long(0.01), 0.95).expect("profiled");
        assert!(bounded.ttft < 1.05 * open.ttft, "{bounded:?} vs {open:?}");
    }

    #[test]
    fn capacity_is_the_rate_where_a_limit_binds_and_scales_with_the_correction() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        let limits = Limits {
            ttft: 1.0,
            itl: 0.2,
            ttft_scale: 1.0,
            itl_scale: 1.0,
            floor_credit: 0.0,
            utilization: 1.0,
        };
        let c = model.capacity(&config(8, 512), &load(1.0), 0.95, limits).expect("profiled");
        assert!(c > 0.1 && c < 20.0, "{c}");
        let at = |rate: f64| model.predict(&config(8, 512), 1, &load(rate), 0.95).expect("profiled");
        let (below, above) = (at(0.98 * c), at(1.05 * c));
        assert!(below.stable() && below.ttft <= 1.0 && below.itl <= 0.2, "{below:?}");
        assert!(!above.stable() || above.ttft > 1.0 || above.itl > 0.2, "{above:?}");
        // A pessimistic correction lowers the capacity.
        let corrected = model
            .capacity(&config(8, 512), &load(1.0), 0.95, Limits { ttft_scale: 2.0, itl_scale: 2.0, ..limits })
            .expect("profiled");
        assert!(corrected < c, "{corrected} vs {c}");
        // A target below a lone request's step: no capacity at all.
        let none = Limits { itl: 0.001, ..limits };
        assert_eq!(model.capacity(&config(8, 512), &load(1.0), 0.95, none), Some(0.0));
    }

    #[test]
    fn a_ttft_floor_near_the_target_is_exempt_from_the_margin_by_its_credit() {
        let model = CapacityModel::from_steps([(Tier::Native, test_step())]);
        // 2,000-token prompts: a lone request's TTFT is most of a 1 s target.
        let shape = Workload { prompt_tokens: 2000.0, prompt_tail: Some(2000.0), ..load(1.0) };
        let lone = model.predict(&config(8, 512), 1, &shape.at_rate(1e-6), 0.95).expect("profiled");
        assert!(lone.ttft > 0.7 && lone.ttft < 0.95, "{lone:?}");
        let margin = 0.95;
        let limits = Limits {
            ttft: margin,
            itl: 1.0,
            ttft_scale: 1.0,
            itl_scale: 1.0,
            floor_credit: 0.0,
            utilization: 1.0,
        };
        let strict = model.capacity(&config(8, 512), &shape, 0.95, limits).expect("profiled");
        let credited = model
            .capacity(&config(8, 512), &shape, 0.95, Limits { floor_credit: 1.0 - margin, ..limits })
            .expect("profiled");
        assert!(credited > strict, "{credited} vs {strict}");
        // Never past the target itself: at the credited capacity the prediction is within it.
        let p = model.predict(&config(8, 512), 1, &shape.at_rate(credited), 0.95).expect("profiled");
        assert!(p.ttft <= margin + (1.0 - margin) * lone.ttft + 1e-9 && p.ttft <= 1.0, "{p:?}");
    }
}
