//! Pure status computation: the InferenceService, the levers it runs at and its Deployment as
//! last seen → the status to write. Transition times are kept while a condition's status stays
//! the same, so an unchanged world produces an identical status and no write.

use crate::build::{self, Levers, SpecError};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use pacer_crds::conditions::{self, reasons};
use pacer_crds::{InferenceService, InferenceServiceStatus, StatusSummary};

/// What the status is computed from.
pub struct Observed<'a> {
    /// The InferenceService as read.
    pub isvc: &'a InferenceService,
    /// The levers the children were built for.
    pub levers: &'a Levers,
    /// The engine Deployment as last seen (after apply, when the operator applied it).
    pub deployment: Option<&'a Deployment>,
    /// Set when the spec cannot be built.
    pub spec_error: Option<&'a SpecError>,
    /// The time to stamp on conditions that change.
    pub now: Time,
}

/// The status for what was observed.
pub fn desired(o: &Observed<'_>) -> InferenceServiceStatus {
    let isvc = o.isvc;
    let generation = isvc.metadata.generation;
    let previous = isvc.status.as_ref();
    let sla = &isvc.spec.sla;
    let mut found: Vec<(&str, bool, &str, String)> = Vec::new();

    let (ready, desired_replicas) = match o.spec_error {
        Some(err) => {
            found.push((conditions::SPEC_VALID, false, err.reason(), err.to_string()));
            found.push((
                conditions::READY,
                false,
                err.reason(),
                format!("{err}; fix the spec and the operator retries"),
            ));
            (0, previous.and_then(|s| s.replicas).unwrap_or(0))
        }
        None => {
            found.push((conditions::SPEC_VALID, true, reasons::ACCEPTED, "the spec was accepted".into()));
            let (ready, ready_cond, progressing) = rollout(o.deployment, o.levers.replicas);
            found.push(ready_cond);
            found.push(progressing);
            (ready, o.levers.replicas)
        }
    };

    let conditions = found
        .into_iter()
        .map(|(type_, ok, reason, message)| {
            let status = if ok { "True" } else { "False" };
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

    InferenceServiceStatus {
        observed_generation: generation,
        conditions,
        replicas: Some(desired_replicas),
        ready_replicas: Some(ready),
        tier: Some(o.levers.tier.to_string()),
        max_batch_size: Some(o.levers.max_batch_size),
        batch_wait_ms: Some(o.levers.batch_wait_ms),
        selector: Some(build::selector_string(isvc)),
        summary: Some(StatusSummary {
            replicas: format!("{ready}/{desired_replicas}"),
            // Observed percentiles arrive with the planner; until a window is observed, say so.
            ttft: format!("-/{}ms", sla.ttft_ms),
            itl: format!("-/{}ms", sla.itl_ms),
            sla: "Unknown".into(),
        }),
    }
}

type Found = (&'static str, bool, &'static str, String);

/// Ready replicas, the Ready condition and the Progressing condition from the Deployment.
fn rollout(deployment: Option<&Deployment>, desired: i32) -> (i32, Found, Found) {
    let Some(d) = deployment else {
        let msg = "the engine Deployment does not exist yet".to_string();
        return (
            0,
            (conditions::READY, false, reasons::DEPLOYMENT_PENDING, msg.clone()),
            (conditions::PROGRESSING, true, reasons::DEPLOYMENT_PENDING, msg),
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
            false,
            reasons::DEPLOYMENT_PENDING,
            format!("Deployment {name} has not observed the latest change yet"),
        )
    } else if ready >= desired && available >= desired {
        (
            conditions::READY,
            true,
            reasons::REPLICAS_READY,
            format!("{ready}/{desired} engine replicas are ready"),
        )
    } else {
        (
            conditions::READY,
            false,
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
            false,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!("Deployment {name} made no progress within its deadline; see its pods' events"),
        )
    } else if !current_generation || updated < desired || total > updated || available < desired {
        (
            conditions::PROGRESSING,
            true,
            reasons::ROLLING_OUT,
            format!("rolling out: {updated}/{desired} replicas updated, {available} available"),
        )
    } else {
        (
            conditions::PROGRESSING,
            false,
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
        desired(&Observed { isvc, levers, deployment: d, spec_error: None, now: at(now) })
    }

    fn cond<'a>(s: &'a InferenceServiceStatus, t: &str) -> &'a Condition {
        condition(Some(s), t).expect(t)
    }

    #[test]
    fn ready_when_every_desired_replica_is_ready_on_the_current_template() {
        let isvc = fixtures::isvc();
        let levers = Levers { replicas: 2, ..Levers::initial(&isvc) };
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
        let levers = Levers::initial(&isvc);
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
        let levers = Levers::initial(&isvc);
        let s = desired(&Observed {
            isvc: &isvc,
            levers: &levers,
            deployment: None,
            spec_error: Some(&err),
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
        let s = status_of(&isvc, &Levers::initial(&isvc), Some(&d), 1);
        assert_eq!(cond(&s, conditions::PROGRESSING).reason, reasons::PROGRESS_DEADLINE_EXCEEDED);
    }
}
