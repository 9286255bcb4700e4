//! The planner's one rule: of every configuration the spec allows (tier × batch size × token
//! budget, each with the fewest replicas whose corrected capacity carries the load), the
//! cheapest predicted to hold the SLA within a share of its targets.
//!
//! "Cheapest" is ordered: no degradation before degradation (a less precise tier only when no
//! replica count of the preferred tier holds, and then with every replica allowed), then fewer
//! replicas, then fewer levers moved from the current configuration, then the most capacity to
//! spare. So the chosen configuration is the cheapest one predicted to hold, with ties to
//! precision, then to stillness.
//!
//! Where batch settings reach the engines only by a rolling update (vLLM), a move of them is
//! charged its roll-out ([`roll_cost`]): the surge pod's time, spread over how long the new
//! settings are expected to run. It wins only when the replicas it saves outlast the roll-out.

use super::capacity::{CapacityModel, EngineConfig, Limits, Workload};
use super::levers::Levers;
use super::spec::PlannerSpec;
use super::{Correction, History, correction_for};

/// One configuration the planner could run, with what the model says of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The levers.
    pub levers: Levers,
    /// Requests per second one replica carries within the limits.
    pub per_replica: f64,
    /// Rank of its tier below the preferred one (0: the preferred tier).
    pub degradation: usize,
}

/// The outcome of a search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Choice {
    /// The cheapest configuration predicted to hold.
    Holds(Candidate),
    /// Nothing within the spec's ranges is predicted to hold: the cheapest configuration
    /// predicted to come within [`SHORT_TOLERANCE`] of the best any can do (more replicas do
    /// not shorten a TTFT spent prefilling long prompts).
    Short(Candidate),
}

impl Choice {
    /// The configuration, whether it holds or not.
    pub fn candidate(&self) -> &Candidate {
        match self {
            Choice::Holds(c) | Choice::Short(c) => c,
        }
    }
}

/// When nothing holds, configurations whose predicted worst ratio to target is within this
/// much (a share of the target) of the best count as equally good, and the cheapest of them is
/// chosen.
pub const SHORT_TOLERANCE: f64 = 0.1;

/// The batch sizes and budgets tried: the range's ends, the initial and current values, and
/// the powers of two between.
fn values(min: u32, max: u32, initial: u32, current: u32) -> Vec<u32> {
    let mut v = vec![min, max, initial.clamp(min, max), current.clamp(min, max)];
    let mut p = 1u32;
    while p < max {
        if p > min {
            v.push(p);
        }
        p = p.saturating_mul(2);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The tiers the planner may choose, most precise first: the preferred tier and, when the spec
/// allows degrading, the faster ones after it.
pub fn tiers(spec: &PlannerSpec) -> Vec<crate::Tier> {
    let Some(preferred) = spec.tier_rank(spec.preferred_tier) else { return vec![spec.preferred_tier] };
    if spec.allow_degrade { spec.tiers[preferred..].to_vec() } else { vec![spec.preferred_tier] }
}

/// Per-replica capacity of `levers`' engine configuration within `margin` of the targets, with
/// its learned correction.
pub fn per_replica(
    spec: &PlannerSpec,
    model: &CapacityModel,
    history: &History,
    levers: &Levers,
    shape: &Workload,
    margin: f64,
) -> Option<f64> {
    let config = engine_config(levers, spec);
    let c: Correction = correction_for(history, &config);
    model.capacity(
        &config,
        shape,
        spec.quantile(),
        Limits {
            ttft: margin * spec.ttft_target,
            itl: margin * spec.itl_target,
            ttft_scale: c.ttft,
            itl_scale: c.itl,
            floor_credit: (1.0 - margin).clamp(0.0, 1.0),
            utilization: utilization_for(margin),
        },
    )
}

/// The utilization allowed at a latency margin: the same share of headroom in the engine's
/// time as in the targets, halved (0.85 → 0.925), so a configuration runs below saturation
/// where its latencies are flat and the model cannot see how close it is.
pub fn utilization_for(margin: f64) -> f64 {
    1.0 - (1.0 - margin.clamp(0.0, 1.0)) / 2.0
}

/// The engine settings and tier of `levers`, with the ITL budget of `spec`.
pub fn engine_config(levers: &Levers, spec: &PlannerSpec) -> EngineConfig {
    EngineConfig {
        tier: levers.tier,
        max_batch_size: levers.max_batch_size,
        token_budget: levers.max_num_batched_tokens.max(levers.max_batch_size),
        max_step_ms: spec.max_step_ms,
    }
}

/// Replicas of a configuration carrying `per_replica` each for `rate`, at least the spec's
/// minimum; `None` above its maximum.
pub fn replicas_for(spec: &PlannerSpec, rate: f64, per_replica: f64) -> Option<i32> {
    if per_replica <= 0.0 {
        return None;
    }
    let n = (rate / per_replica - 1e-9).ceil().max(1.0);
    (n <= f64::from(spec.max_replicas)).then(|| (n as i32).max(spec.min_replicas))
}

/// What a search looks at: the spec, the model with its learned corrections, the levers in
/// force and the request shape.
#[derive(Debug, Clone, Copy)]
pub struct Search<'a> {
    /// Targets and ranges.
    pub spec: &'a PlannerSpec,
    /// The capacity model.
    pub model: &'a CapacityModel,
    /// The learned corrections.
    pub history: &'a History,
    /// The levers in force (fewer moves from them break ties).
    pub current: &'a Levers,
    /// The request shape.
    pub shape: &'a Workload,
}

/// What a search asks for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Requests per second to carry.
    pub rate: f64,
    /// The share of each target to stay within.
    pub margin: f64,
    /// Only this replica count (the fast levers for the replicas ready now), or any in range.
    pub replicas: Option<i32>,
    /// The tiers the search may use.
    pub tiers: &'a [crate::Tier],
}

/// The cheapest configuration predicted to carry `ask.rate` requests/s of the shape within
/// `ask.margin` of every target; `None` when no tier the search may use is profiled.
pub fn cheapest(search: &Search<'_>, ask: &Ask<'_>) -> Option<Choice> {
    let Search { spec, model, history, current, shape } = *search;
    let Ask { rate, margin, replicas: fixed_replicas, tiers: tiers_allowed } = *ask;
    let batches = values(spec.batch_min, spec.batch_max, spec.batch_initial, current.max_batch_size);
    let budgets =
        values(spec.budget_min, spec.budget_max, spec.budget_initial, current.max_num_batched_tokens);
    let pref = spec.tier_rank(spec.preferred_tier).unwrap_or(0);
    let roll = roll_cost(spec, history, current);
    let mut best: Option<(Candidate, (usize, f64, usize, f64))> = None;
    // For when nothing holds: every (candidate, predicted worst ratio to target).
    let mut short: Vec<(Candidate, f64, usize)> = Vec::new();
    for tier in tiers_allowed {
        let degradation = spec.tier_rank(*tier).unwrap_or(pref).saturating_sub(pref);
        for &b in &batches {
            for &budget in &budgets {
                if budget < b {
                    continue;
                }
                let levers =
                    Levers { max_batch_size: b, max_num_batched_tokens: budget, tier: *tier, ..*current };
                let Some(cap) = per_replica(spec, model, history, &levers, shape, margin) else { continue };
                let top = fixed_replicas.unwrap_or(spec.max_replicas);
                let candidate = |replicas: i32| Candidate {
                    levers: Levers { replicas, ..levers },
                    per_replica: cap,
                    degradation,
                };
                let moved = usize::from(b != current.max_batch_size)
                    + usize::from(budget != current.max_num_batched_tokens)
                    + usize::from(*tier != current.tier);
                if best.is_none() {
                    // A less precise tier runs only with every replica allowed.
                    let lo = if degradation > 0 { top } else { fixed_replicas.unwrap_or(spec.min_replicas) };
                    for n in lo..=top {
                        let ratio =
                            worst_ratio(spec, model, history, &Levers { replicas: n, ..levers }, shape, rate);
                        short.push((candidate(n), ratio, moved));
                    }
                }
                let n = match fixed_replicas {
                    Some(n) => (f64::from(n) * cap >= rate).then_some(n),
                    // A less precise tier runs only with every replica allowed: replicas cost
                    // money, precision costs the users' answers.
                    None if degradation > 0 => replicas_for(spec, rate, cap).map(|_| spec.max_replicas),
                    None => replicas_for(spec, rate, cap),
                };
                let Some(n) = n else { continue };
                let c = candidate(n);
                let batch_moved = b != current.max_batch_size || budget != current.max_num_batched_tokens;
                let cost = f64::from(n) + if batch_moved { roll } else { 0.0 };
                let key = (degradation, cost, moved, -cap);
                if best.as_ref().is_none_or(|(_, k)| key_less(&key, k)) {
                    best = Some((c, key));
                }
            }
        }
    }
    if let Some((c, _)) = best {
        return Some(Choice::Holds(c));
    }
    let floor = short.iter().map(|(_, r, _)| *r).fold(f64::INFINITY, f64::min);
    if !floor.is_finite() {
        // Nothing is even stable: everything the spec allows, the configuration that carries
        // the most per replica.
        return short
            .into_iter()
            .filter(|(c, _, _)| c.levers.replicas == fixed_replicas.unwrap_or(spec.max_replicas))
            .max_by(|a, b| {
                a.0.per_replica.total_cmp(&b.0.per_replica).then(b.0.degradation.cmp(&a.0.degradation))
            })
            .map(|(c, _, _)| Choice::Short(c));
    }
    short
        .into_iter()
        .filter(|(_, r, _)| *r <= floor + SHORT_TOLERANCE)
        .min_by(|a, b| {
            (a.0.degradation, a.0.levers.replicas, a.2)
                .cmp(&(b.0.degradation, b.0.levers.replicas, b.2))
                .then(a.1.total_cmp(&b.1))
        })
        .map(|(c, _, _)| Choice::Short(c))
}

/// The predicted worst ratio of a percentile to its target for `levers` at `rate`, with the
/// learned corrections (infinite when the replicas cannot keep up).
pub fn worst_ratio(
    spec: &PlannerSpec,
    model: &CapacityModel,
    history: &History,
    levers: &Levers,
    shape: &Workload,
    rate: f64,
) -> f64 {
    let config = engine_config(levers, spec);
    let c = correction_for(history, &config);
    match model.predict(&config, levers.replicas, &shape.at_rate(rate), spec.quantile()) {
        Some(p) if p.stable() => (c.ttft * p.ttft / spec.ttft_target).max(c.itl * p.itl / spec.itl_target),
        _ => f64::INFINITY,
    }
}

/// What moving the batch settings costs, in replicas, where the engines take them only at start
/// (`spec.batch_rolls`; 0 where they take them live): the roll-out replaces the running pods one
/// at a time with one surge pod, each for a pod start, and the new settings are expected to run
/// at least the scale-down stabilization (or the window, if longer) before the planner moves
/// again.
pub fn roll_cost(spec: &PlannerSpec, history: &History, current: &Levers) -> f64 {
    if !spec.batch_rolls {
        return 0.0;
    }
    let pod_start = history.pod_start.unwrap_or(super::decide::DEFAULT_POD_START);
    let runs_for = spec.scale_down_stabilization.max(spec.window).max(1.0);
    f64::from(current.replicas.max(1)) * pod_start / runs_for
}

fn key_less(a: &(usize, f64, usize, f64), b: &(usize, f64, usize, f64)) -> bool {
    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.total_cmp(&b.3)).is_lt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_tried_cover_the_range_and_the_current_setting() {
        assert_eq!(values(1, 32, 8, 12), vec![1, 2, 4, 8, 12, 16, 32]);
        assert_eq!(values(64, 512, 512, 512), vec![64, 128, 256, 512]);
        assert_eq!(values(5, 5, 5, 9), vec![5]);
    }
}
