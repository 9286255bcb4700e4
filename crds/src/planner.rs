//! How an InferenceService reads as the planner's input: its targets, ranges and policy in the
//! planner's units ([`PlannerSpec`]), and the levers a service starts with or last ran at
//! ([`Levers`]). The planner itself knows no Kubernetes type.

use crate::{InferenceService, InferenceServiceSpec, PolicyMode, parse_duration};
use pacer_planner::{Levers, PlannerSpec};

impl InferenceServiceSpec {
    /// Reads the planner's view of this spec; durations the schema would refuse fall back to
    /// their defaults (the controller refuses such specs before the planner runs).
    pub fn planner_spec(&self) -> PlannerSpec {
        let spec = self;
        let secs = |text: &str, default: f64| parse_duration(text).map_or(default, |d| d.as_secs_f64());
        let p = &spec.policy;
        PlannerSpec {
            percentile: spec.sla.percentile,
            ttft_target: f64::from(spec.sla.ttft_ms) / 1000.0,
            itl_target: f64::from(spec.sla.itl_ms) / 1000.0,
            e2e_target: spec.sla.e2e_ms.map(|ms| f64::from(ms) / 1000.0),
            window: secs(&spec.sla.window, 300.0),
            min_replicas: spec.replicas.min,
            max_replicas: spec.replicas.max,
            batch_min: spec.batching.max_batch_size.min,
            batch_max: spec.batching.max_batch_size.max,
            batch_initial: spec.batching.max_batch_size.initial,
            budget_min: spec.batching.max_num_batched_tokens.min,
            budget_max: spec.batching.max_num_batched_tokens.max,
            budget_initial: spec.batching.max_num_batched_tokens.initial,
            tiers: spec.quantization.allowed_tiers.clone(),
            preferred_tier: spec.quantization.preferred(),
            allow_degrade: spec.quantization.allow_degrade,
            enforce: p.mode == PolicyMode::Enforce,
            evaluation_interval: secs(&p.evaluation_interval, 30.0),
            scale_up_stabilization: secs(&p.scale_up_stabilization, 60.0),
            scale_down_stabilization: secs(&p.scale_down_stabilization, 300.0),
            max_step_ms: spec.batching.max_step_ms.unwrap_or(0),
            batch_rolls: !spec.engine.runtime.live_batch(),
        }
    }
}

impl InferenceService {
    /// The levers a new InferenceService starts with: minimum replicas, the initial batch
    /// settings and the preferred tier.
    pub fn initial_levers(&self) -> Levers {
        let s = &self.spec;
        Levers {
            replicas: s.replicas.min,
            max_batch_size: s.batching.max_batch_size.initial,
            batch_wait_ms: s.batching.batch_wait_ms.initial,
            max_num_batched_tokens: s
                .batching
                .max_num_batched_tokens
                .initial
                .max(s.batching.max_batch_size.initial),
            tier: s.quantization.preferred(),
        }
    }

    /// The levers the operator last decided (kept in status), brought inside the spec's current
    /// ranges: after a spec edit narrows a range, the nearest allowed value; without a status,
    /// the initial values.
    pub fn current_levers(&self) -> Levers {
        let initial = self.initial_levers();
        let Some(status) = &self.status else { return initial };
        let s = &self.spec;
        let tier = status
            .tier
            .as_deref()
            .and_then(|t| s.quantization.allowed_tiers.iter().copied().find(|a| a.as_str() == t))
            // Without degrading allowed, only the preferred tier runs.
            .filter(|t| s.quantization.allow_degrade || *t == initial.tier)
            .unwrap_or(initial.tier);
        Levers {
            replicas: status.replicas.unwrap_or(initial.replicas).clamp(s.replicas.min, s.replicas.max),
            max_batch_size: status
                .max_batch_size
                .unwrap_or(initial.max_batch_size)
                .clamp(s.batching.max_batch_size.min, s.batching.max_batch_size.max),
            batch_wait_ms: status
                .batch_wait_ms
                .unwrap_or(initial.batch_wait_ms)
                .clamp(s.batching.batch_wait_ms.min, s.batching.batch_wait_ms.max),
            max_num_batched_tokens: status
                .max_num_batched_tokens
                .unwrap_or(initial.max_num_batched_tokens)
                .clamp(s.batching.max_num_batched_tokens.min, s.batching.max_num_batched_tokens.max),
            tier,
        }
    }
}
