//! Pure status computation: the InferenceService, the levers it runs at and its Deployment as
//! last seen → the status to write. Transition times are kept while a condition's status stays
//! the same, so an unchanged world produces an identical status and no write.

use crate::build::{self, Levers, SpecError};
use crate::planner::{AppliedSettings, Decision, Observation, Quantile, SlaState, Span};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use pacer_crds::conditions::{self, reasons};
use pacer_crds::{
    EngineSettings, InferenceService, InferenceServiceStatus, LastDecision, SlaReadings, StatusSummary,
};

/// What the status is computed from.
pub struct StatusInputs<'a> {
    /// The InferenceService as read.
    pub isvc: &'a InferenceService,
    /// The levers the children were built for.
    pub levers: &'a Levers,
    /// The engine Deployment as last seen (after apply, when the operator applied it).
    pub deployment: Option<&'a Deployment>,
    /// Set when the spec cannot be built.
    pub spec_error: Option<&'a SpecError>,
    /// The planner's latest evaluation; `None` when the operator has no metrics source.
    pub planner: Option<&'a PlannerOutcome>,
    /// The time to stamp on conditions that change.
    pub now: Time,
}

/// The planner's latest evaluation of one InferenceService.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerOutcome {
    /// What it decided.
    pub decision: Decision,
    /// What it saw.
    pub observation: Observation,
    /// When.
    pub at: Time,
}

/// The status for what was observed.
pub fn desired(o: &StatusInputs<'_>) -> InferenceServiceStatus {
    let isvc = o.isvc;
    let generation = isvc.metadata.generation;
    let previous = isvc.status.as_ref();
    let sla = &isvc.spec.sla;
    let mut found: Vec<Found> = Vec::new();

    let (ready, desired_replicas) = match o.spec_error {
        Some(err) => {
            found.push((conditions::SPEC_VALID, FALSE, err.reason(), err.to_string()));
            found.push((
                conditions::READY,
                FALSE,
                err.reason(),
                format!("{err}; fix the spec and the operator retries"),
            ));
            (0, previous.and_then(|s| s.replicas).unwrap_or(0))
        }
        None => {
            found.push((conditions::SPEC_VALID, TRUE, reasons::ACCEPTED, "the spec was accepted".into()));
            let (ready, ready_cond, progressing) = rollout(o.deployment, o.levers.replicas);
            found.push(ready_cond);
            found.push(progressing);
            found.extend(sla_conditions(isvc, o.levers, o.planner));
            found.extend(o.planner.map(|p| settings_condition(o.levers, &p.observation.metrics.applied)));
            (ready, o.levers.replicas)
        }
    };

    let conditions = found
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let kept = previous
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
                .filter(|c| c.status == status)
                .map(|c| c.last_transition_time.clone());
            Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message,
                observed_generation: generation,
                last_transition_time: kept.unwrap_or_else(|| o.now.clone()),
            }
        })
        .collect();

    let observed =
        o.planner.map(|p| observed_sla(isvc, p)).or_else(|| previous.and_then(|s| s.observed.clone()));
    let last_decision =
        o.planner.and_then(last_decision).or_else(|| previous.and_then(|s| s.last_decision.clone()));
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}ms"));
    let sla_state = match o.planner {
        Some(p) if o.spec_error.is_none() => p.decision.sla.as_str(),
        _ => SlaState::Unknown.as_str(),
    };
    InferenceServiceStatus {
        observed_generation: generation,
        conditions,
        replicas: Some(desired_replicas),
        ready_replicas: Some(ready),
        tier: Some(o.levers.tier.to_string()),
        max_batch_size: Some(o.levers.max_batch_size),
        batch_wait_ms: Some(o.levers.batch_wait_ms),
        max_num_batched_tokens: Some(o.levers.max_num_batched_tokens),
        applied: o
            .planner
            .and_then(|p| engine_settings(&p.observation.metrics.applied))
            .or_else(|| previous.and_then(|s| s.applied.clone())),
        selector: Some(build::selector_string(isvc)),
        summary: Some(StatusSummary {
            replicas: format!("{ready}/{desired_replicas}"),
            ttft: format!("{}/{}ms", ms(observed.as_ref().and_then(|x| x.ttft_ms)), sla.ttft_ms),
            itl: format!("{}/{}ms", ms(observed.as_ref().and_then(|x| x.itl_ms)), sla.itl_ms),
            sla: sla_state.into(),
        }),
        observed,
        last_decision,
        planner_memory: o
            .planner
            .map(|p| crate::planner::memory::encode(&p.decision.history))
            .unwrap_or_else(|| previous.and_then(|s| s.planner_memory.clone())),
    }
}

/// A condition: type, status (`True`, `False`, `Unknown`), reason, message.
type Found = (&'static str, &'static str, &'static str, String);
const TRUE: &str = "True";
const FALSE: &str = "False";
const UNKNOWN: &str = "Unknown";

/// SLAMet, MetricsAvailable, Degraded and ScalingLimited from the planner's latest evaluation.
fn sla_conditions(isvc: &InferenceService, levers: &Levers, planner: Option<&PlannerOutcome>) -> Vec<Found> {
    let preferred = isvc.spec.quantization.preferred();
    let degraded = if levers.tier == preferred {
        (
            conditions::DEGRADED,
            FALSE,
            reasons::PREFERRED_TIER,
            format!("running the preferred tier {preferred}"),
        )
    } else {
        (
            conditions::DEGRADED,
            TRUE,
            reasons::BELOW_PREFERRED_TIER,
            format!("running tier {} below the preferred {preferred} to hold the SLA", levers.tier),
        )
    };
    let Some(p) = planner else {
        let why =
            "the operator has no metrics source (--prometheus-url); the SLA is not evaluated".to_string();
        return vec![
            (conditions::SLA_MET, UNKNOWN, reasons::NO_METRICS_SOURCE, why.clone()),
            (conditions::METRICS_AVAILABLE, FALSE, reasons::NO_METRICS_SOURCE, why),
            degraded,
        ];
    };
    let d = &p.decision;
    let m = &p.observation.metrics;
    let has_signal = matches!(m.ttft, Quantile::Value { .. }) || matches!(m.itl, Quantile::Value { .. });
    let available = if d.reason.is_blind() || !has_signal {
        (conditions::METRICS_AVAILABLE, FALSE, d.reason.as_str(), d.message.clone())
    } else {
        let n = m.ttft.samples().unwrap_or(0.0);
        (
            conditions::METRICS_AVAILABLE,
            TRUE,
            reasons::METRICS_FRESH,
            format!("fresh metrics; the percentiles rest on {n:.0} requests"),
        )
    };
    let sla = &isvc.spec.sla;
    let targets = format!("TTFT ≤ {}ms and ITL ≤ {}ms at P{}", sla.ttft_ms, sla.itl_ms, sla.percentile);
    let met = match d.sla {
        SlaState::Met => (conditions::SLA_MET, TRUE, reasons::WITHIN_TARGET, format!("{targets}: met")),
        SlaState::Violated => {
            (conditions::SLA_MET, FALSE, reasons::OVER_TARGET, format!("{targets}: {}", d.message))
        }
        SlaState::Unknown => (conditions::SLA_MET, UNKNOWN, d.reason.as_str(), d.message.clone()),
    };
    let limited = if d.scaling_limited {
        (conditions::SCALING_LIMITED, TRUE, d.reason.as_str(), d.message.clone())
    } else {
        (
            conditions::SCALING_LIMITED,
            FALSE,
            reasons::WITHIN_LIMITS,
            "the planner has room to act".to_string(),
        )
    };
    vec![met, available, degraded, limited]
}

/// The settings the engines report, for the status; `None` when none reports any.
fn engine_settings(applied: &AppliedSettings) -> Option<EngineSettings> {
    let text = |span: Option<Span>| span.map(|s| s.to_string());
    let settings = EngineSettings {
        max_batch_size: text(applied.max_batch_size),
        max_num_batched_tokens: text(applied.max_num_batched_tokens),
        batch_wait_ms: text(applied.batch_wait_ms),
    };
    (settings != EngineSettings::default()).then_some(settings)
}

/// SettingsApplied: whether every engine reports the batch settings the operator set.
fn settings_condition(levers: &Levers, applied: &AppliedSettings) -> Found {
    let settings = [
        ("maxBatchSize", applied.max_batch_size, levers.max_batch_size),
        ("maxNumBatchedTokens", applied.max_num_batched_tokens, levers.max_num_batched_tokens),
        ("batchWaitMs", applied.batch_wait_ms, levers.batch_wait_ms),
    ];
    let reported: Vec<_> =
        settings.iter().filter_map(|(name, span, set)| Some((*name, (*span)?, *set))).collect();
    if reported.is_empty() {
        return (
            conditions::SETTINGS_APPLIED,
            UNKNOWN,
            reasons::NOT_REPORTED,
            "no engine reports its batch settings (pacer_engine_setting): no fresh metrics yet, or a runtime that does not export them".into(),
        );
    }
    let differ: Vec<String> = reported
        .iter()
        .filter(|(_, span, set)| !span.is(f64::from(*set)))
        .map(|(name, span, set)| format!("{name} {span} where the settings say {set}"))
        .collect();
    if differ.is_empty() {
        let list: Vec<String> = reported.iter().map(|(name, span, _)| format!("{name} {span}")).collect();
        return (
            conditions::SETTINGS_APPLIED,
            TRUE,
            reasons::APPLIED,
            format!("the engines run the settings: {}", list.join(", ")),
        );
    }
    (
        conditions::SETTINGS_APPLIED,
        FALSE,
        reasons::NOT_APPLIED,
        format!(
            "the engines report {}; the settings ConfigMap reaches the pods within about a minute, and an engine that refuses a setting keeps its old one and logs why",
            differ.join(", ")
        ),
    )
}

fn observed_sla(isvc: &InferenceService, p: &PlannerOutcome) -> SlaReadings {
    let m = &p.observation.metrics;
    let ms = |q: &Quantile| q.seconds().map(|s| (s * 1e4).round() / 10.0);
    SlaReadings {
        time: p.at.0.to_string(),
        window: isvc.spec.sla.window.clone(),
        percentile: isvc.spec.sla.percentile,
        ttft_ms: ms(&m.ttft),
        itl_ms: ms(&m.itl),
        e2e_ms: ms(&m.e2e),
        ttft_samples: m.ttft.samples().map(f64::round),
        itl_samples: m.itl.samples().map(f64::round),
        request_rate: m.request_rate.map(|r| (r * 1000.0).round() / 1000.0),
        output_tokens_per_second: m.output_token_rate.map(|r| (r * 10.0).round() / 10.0),
    }
}

fn last_decision(p: &PlannerOutcome) -> Option<LastDecision> {
    let change = p.decision.change.as_ref()?;
    Some(LastDecision {
        time: p.at.0.to_string(),
        lever: change.lever.as_str().into(),
        direction: change.direction.as_str().into(),
        from: change.from.clone(),
        to: change.to.clone(),
        reason: p.decision.reason.as_str().into(),
        message: p.decision.message.clone(),
        applied: p.decision.levers == p.decision.recommended,
    })
}

/// Ready replicas, the Ready condition and the Progressing condition from the Deployment.
fn rollout(deployment: Option<&Deployment>, desired: i32) -> (i32, Found, Found) {
    let Some(d) = deployment else {
        let msg = "the engine Deployment does not exist yet".to_string();
        return (
            0,
            (conditions::READY, FALSE, reasons::DEPLOYMENT_PENDING, msg.clone()),
            (conditions::PROGRESSING, TRUE, reasons::DEPLOYMENT_PENDING, msg),
        );
    };
    let status = d.status.clone().unwrap_or_default();
    let current_generation = status.observed_generation >= d.metadata.generation;
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    // Ready means ready on the current template: a pod of the old tier does not count.
    let ready = status.ready_replicas.unwrap_or(0).min(updated);
    let name = d.name_any();

    let ready_cond = if !current_generation {
        (
            conditions::READY,
            FALSE,
            reasons::DEPLOYMENT_PENDING,
            format!("Deployment {name} has not observed the latest change yet"),
        )
    } else if ready >= desired && available >= desired {
        (
            conditions::READY,
            TRUE,
            reasons::REPLICAS_READY,
            format!("{ready}/{desired} engine replicas are ready"),
        )
    } else {
        (
            conditions::READY,
            FALSE,
            reasons::REPLICAS_NOT_READY,
            format!("{ready}/{desired} engine replicas are ready"),
        )
    };

    let deadline_exceeded = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let progressing = if deadline_exceeded {
        (
            conditions::PROGRESSING,
            FALSE,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!("Deployment {name} made no progress within its deadline; see its pods' events"),
        )
    } else if !current_generation || updated < desired || total > updated || available < desired {
        (
            conditions::PROGRESSING,
            TRUE,
            reasons::ROLLING_OUT,
            format!("rolling out: {updated}/{desired} replicas updated, {available} available"),
        )
    } else {
        (
            conditions::PROGRESSING,
            FALSE,
            reasons::ROLLOUT_COMPLETE,
            format!("{desired} replicas run the current template"),
        )
    };
    (ready, ready_cond, progressing)
}

/// Whether `next` differs from `previous` in anything but nothing: used to skip no-op writes.
pub fn changed(previous: Option<&InferenceServiceStatus>, next: &InferenceServiceStatus) -> bool {
    previous != Some(next)
}

/// The status of one condition type, if present.
pub fn condition<'a>(status: Option<&'a InferenceServiceStatus>, type_: &str) -> Option<&'a Condition> {
    status.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

#[cfg(test)]
mod tests;
