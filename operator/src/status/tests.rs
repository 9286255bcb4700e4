//! Unit tests of `status.rs`.

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
