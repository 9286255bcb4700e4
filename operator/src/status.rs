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
mod tests {
    use super::*;
    use crate::build::fixtures;
    use crate::planner::Reason;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    fn deployment(generation: i64, observed: i64, updated: i32, ready: i32, total: i32) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.name = Some("smol".into());
        d.metadata.generation = Some(generation);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(observed),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            replicas: Some(total),
            ..DeploymentStatus::default()
        });
        d
    }

    fn status_of(
        isvc: &InferenceService,
        levers: &Levers,
        d: Option<&Deployment>,
        now: i64,
    ) -> InferenceServiceStatus {
        desired(&StatusInputs { isvc, levers, deployment: d, spec_error: None, planner: None, now: at(now) })
    }

    fn cond<'a>(s: &'a InferenceServiceStatus, t: &str) -> &'a Condition {
        condition(Some(s), t).expect(t)
    }

    #[test]
    fn ready_when_every_desired_replica_is_ready_on_the_current_template() {
        let isvc = fixtures::isvc();
        let levers = Levers { replicas: 2, ..isvc.initial_levers() };
        let s = status_of(&isvc, &levers, Some(&deployment(3, 3, 2, 2, 2)), 10);
        assert_eq!(cond(&s, conditions::READY).status, "True");
        assert_eq!(cond(&s, conditions::PROGRESSING).status, "False");
        assert_eq!(s.summary.as_ref().map(|x| x.replicas.as_str()), Some("2/2"));
        assert_eq!(s.observed_generation, Some(1));

        // A rollout: two old pods ready, one new one not yet.
        let s = status_of(&isvc, &levers, Some(&deployment(4, 4, 1, 2, 3)), 10);
        assert_eq!(cond(&s, conditions::READY).status, "False");
        assert_eq!(cond(&s, conditions::READY).reason, reasons::REPLICAS_NOT_READY);
        assert_eq!(cond(&s, conditions::PROGRESSING).reason, reasons::ROLLING_OUT);
        // The Deployment controller has not seen the change yet.
        let s = status_of(&isvc, &levers, Some(&deployment(5, 4, 2, 2, 2)), 10);
        assert_eq!(cond(&s, conditions::READY).reason, reasons::DEPLOYMENT_PENDING);
    }

    #[test]
    fn transition_times_survive_while_the_status_holds() {
        let mut isvc = fixtures::isvc();
        let levers = isvc.initial_levers();
        let d = deployment(1, 1, 1, 1, 1);
        let first = status_of(&isvc, &levers, Some(&d), 10);
        isvc.status = Some(first.clone());
        let again = status_of(&isvc, &levers, Some(&d), 99);
        assert_eq!(first, again, "an unchanged world writes nothing");
        assert!(!changed(isvc.status.as_ref(), &again));
        let not_ready = status_of(&isvc, &levers, Some(&deployment(1, 1, 1, 0, 1)), 120);
        assert_eq!(cond(&not_ready, conditions::READY).last_transition_time, at(120));
        assert_eq!(cond(&not_ready, conditions::SPEC_VALID).last_transition_time, at(10));
    }

    #[test]
    fn an_invalid_spec_is_reported_not_ready() {
        let isvc = fixtures::isvc();
        let err = SpecError::Name("x".into());
        let levers = isvc.initial_levers();
        let s = desired(&StatusInputs {
            isvc: &isvc,
            levers: &levers,
            deployment: None,
            spec_error: Some(&err),
            planner: None,
            now: at(1),
        });
        assert_eq!(cond(&s, conditions::SPEC_VALID).status, "False");
        assert!(cond(&s, conditions::SPEC_VALID).message.contains("DNS-1035"));
        assert_eq!(cond(&s, conditions::READY).status, "False");
    }

    #[test]
    fn a_stuck_rollout_says_so() {
        use k8s_openapi::api::apps::v1::DeploymentCondition;
        let isvc = fixtures::isvc();
        let mut d = deployment(2, 2, 1, 0, 1);
        if let Some(s) = d.status.as_mut() {
            s.conditions = Some(vec![DeploymentCondition {
                type_: "Progressing".into(),
                status: "False".into(),
                reason: Some("ProgressDeadlineExceeded".into()),
                ..DeploymentCondition::default()
            }]);
        }
        let s = status_of(&isvc, &isvc.initial_levers(), Some(&d), 1);
        assert_eq!(cond(&s, conditions::PROGRESSING).reason, reasons::PROGRESS_DEADLINE_EXCEEDED);
    }

    fn outcome(sla: SlaState, ttft: f64, reason: Reason, change: bool, applied: bool) -> PlannerOutcome {
        use crate::planner::{Change, Direction, Freshness, History, Lever, Observation, ServiceMetrics};
        let isvc = fixtures::isvc();
        let current = isvc.initial_levers();
        let recommended = if change { Levers { replicas: 2, ..current } } else { current };
        let mut metrics = ServiceMetrics::missing();
        metrics.ttft = Quantile::from_parts(Some(ttft), Some(300.0));
        metrics.itl = Quantile::from_parts(Some(0.02), Some(9000.0));
        PlannerOutcome {
            decision: Decision {
                levers: if applied { recommended } else { current },
                recommended,
                change: change.then(|| Change {
                    lever: Lever::Replicas,
                    direction: Direction::Up,
                    from: "1".into(),
                    to: "2".into(),
                }),
                changes: if change {
                    vec![Change {
                        lever: Lever::Replicas,
                        direction: Direction::Up,
                        from: "1".into(),
                        to: "2".into(),
                    }]
                } else {
                    Vec::new()
                },
                reason,
                message: "TTFT is at 150% of target: replicas 1 → 2".into(),
                sla,
                degraded: false,
                scaling_limited: false,
                history: History::default(),
            },
            observation: Observation {
                at: 5.0,
                freshness: Freshness::Fresh,
                metrics,
                ready_replicas: 1,
                desired_replicas: 1,
            },
            at: at(5),
        }
    }

    /// SettingsApplied and `status.applied`: what the engines report against what was set —
    /// unknown until they report, false with the difference while they differ, true when all
    /// run the settings; the last report is kept while metrics are missing.
    #[test]
    fn the_status_says_whether_the_engines_run_the_settings() {
        let isvc = fixtures::isvc();
        let levers = isvc.initial_levers();
        let with = |applied: AppliedSettings| {
            let mut p = outcome(SlaState::Met, 0.2, Reason::SlaMet, false, true);
            p.observation.metrics.applied = applied;
            p
        };
        let status = |isvc: &InferenceService, p: &PlannerOutcome| {
            desired(&StatusInputs {
                isvc,
                levers: &levers,
                deployment: Some(&deployment(1, 1, 1, 1, 1)),
                spec_error: None,
                planner: Some(p),
                now: at(5),
            })
        };
        let none = status(&isvc, &with(AppliedSettings::default()));
        assert_eq!(cond(&none, conditions::SETTINGS_APPLIED).reason, reasons::NOT_REPORTED);
        assert_eq!(none.applied, None);

        let span = |least: u32, greatest: u32| Some(Span { least: least.into(), greatest: greatest.into() });
        let set = |b: u32| AppliedSettings {
            max_batch_size: span(levers.max_batch_size.min(b), b),
            max_num_batched_tokens: span(levers.max_num_batched_tokens, levers.max_num_batched_tokens),
            batch_wait_ms: span(levers.batch_wait_ms, levers.batch_wait_ms),
        };
        let ok = status(&isvc, &with(set(levers.max_batch_size)));
        let c = cond(&ok, conditions::SETTINGS_APPLIED);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reasons::APPLIED));
        let applied = ok.applied.clone().expect("applied");
        assert_eq!(applied.max_batch_size, Some(levers.max_batch_size.to_string()));

        // One replica still on an older, larger batch.
        let bigger = levers.max_batch_size + 8;
        let mid = status(&isvc, &with(set(bigger)));
        let c = cond(&mid, conditions::SETTINGS_APPLIED);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reasons::NOT_APPLIED));
        let want = format!(
            "maxBatchSize {}-{bigger} where the settings say {}",
            levers.max_batch_size, levers.max_batch_size
        );
        assert!(c.message.contains(&want), "{}", c.message);
        assert_eq!(
            mid.applied.and_then(|a| a.max_batch_size),
            Some(format!("{}-{bigger}", levers.max_batch_size))
        );

        // Metrics gone: the last report stays in status, the condition says nothing is reported.
        let mut later = isvc.clone();
        later.status = Some(ok.clone());
        let gone = status(&later, &with(AppliedSettings::default()));
        assert_eq!(gone.applied, ok.applied);
        assert_eq!(cond(&gone, conditions::SETTINGS_APPLIED).status, "Unknown");
    }

    #[test]
    fn the_sla_conditions_and_columns_tell_what_the_planner_saw() {
        use crate::planner::Reason;
        let isvc = fixtures::isvc();
        let levers = isvc.initial_levers();
        let p = outcome(SlaState::Violated, 0.6, Reason::TtftViolated, true, true);
        let s = desired(&StatusInputs {
            isvc: &isvc,
            levers: &levers,
            deployment: Some(&deployment(1, 1, 1, 1, 1)),
            spec_error: None,
            planner: Some(&p),
            now: at(5),
        });
        assert_eq!(cond(&s, conditions::SLA_MET).status, "False");
        assert_eq!(cond(&s, conditions::METRICS_AVAILABLE).status, "True");
        assert_eq!(cond(&s, conditions::DEGRADED).status, "False");
        assert_eq!(cond(&s, conditions::SCALING_LIMITED).status, "False");
        let summary = s.summary.clone().expect("summary");
        assert_eq!(
            (summary.ttft.as_str(), summary.itl.as_str(), summary.sla.as_str()),
            ("600ms/400ms", "20ms/60ms", "Violated")
        );
        let observed = s.observed.clone().expect("observed");
        assert_eq!((observed.ttft_ms, observed.ttft_samples), (Some(600.0), Some(300.0)));
        let last = s.last_decision.clone().expect("a decision");
        assert_eq!(
            (last.lever.as_str(), last.to.as_str(), last.reason.as_str(), last.applied),
            ("replicas", "2", "TTFTViolated", true)
        );

        // A later evaluation that holds keeps the last decision in status.
        let mut later = isvc.clone();
        later.status = Some(s);
        let hold = outcome(SlaState::Met, 0.2, Reason::SlaMet, false, true);
        let s2 = desired(&StatusInputs {
            isvc: &later,
            levers: &levers,
            deployment: Some(&deployment(1, 1, 1, 1, 1)),
            spec_error: None,
            planner: Some(&hold),
            now: at(6),
        });
        assert_eq!(cond(&s2, conditions::SLA_MET).status, "True");
        assert_eq!(s2.last_decision, later.status.as_ref().and_then(|x| x.last_decision.clone()));

        // Advisory: recommended, not applied.
        let advisory = outcome(SlaState::Violated, 0.6, Reason::TtftViolated, true, false);
        let s3 = desired(&StatusInputs {
            isvc: &isvc,
            levers: &levers,
            deployment: None,
            spec_error: None,
            planner: Some(&advisory),
            now: at(7),
        });
        assert!(!s3.last_decision.expect("recommendation").applied);
    }

    #[test]
    fn without_metrics_the_sla_is_unknown_and_says_why() {
        use crate::planner::Reason;
        let isvc = fixtures::isvc();
        let levers = isvc.initial_levers();
        let s = status_of(&isvc, &levers, Some(&deployment(1, 1, 1, 1, 1)), 1);
        assert_eq!(cond(&s, conditions::SLA_MET).status, "Unknown");
        assert_eq!(cond(&s, conditions::METRICS_AVAILABLE).reason, reasons::NO_METRICS_SOURCE);
        assert_eq!(s.summary.expect("summary").sla, "Unknown");
        let mut blind = outcome(SlaState::Unknown, 0.6, Reason::MetricsMissing, false, true);
        blind.decision.message = "holding: no metrics (connection refused)".into();
        let s = desired(&StatusInputs {
            isvc: &isvc,
            levers: &levers,
            deployment: None,
            spec_error: None,
            planner: Some(&blind),
            now: at(1),
        });
        let available = cond(&s, conditions::METRICS_AVAILABLE);
        assert_eq!((available.status.as_str(), available.reason.as_str()), ("False", "MetricsMissing"));
        assert!(available.message.contains("connection refused"));
    }
}
