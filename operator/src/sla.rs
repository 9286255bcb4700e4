//! The SLA loop inside a reconcile: the observer's latest metrics for this InferenceService, its
//! Deployment's ready replicas and the planner's memory go into [`planner::decide`] once per
//! evaluation interval, or sooner when [`planner::due`] sees a leading signal cross in a fresh
//! observation (reconciles requeue on the observer's tick for that); the decision's levers are
//! what the children are built for. Between evaluations the last decision stands.

use crate::metrics_source::ServiceKey;
use crate::observer::Observer;
use crate::planner::{self, CapacityModel, History, Levers, Observation, PlannerSpec};
use crate::status::PlannerOutcome;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use pacer_crds::InferenceService;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The planner's context in the controller: where metrics come from, the capacity model, and
/// the memory of each InferenceService.
pub struct SlaLoop {
    /// The metrics, refreshed by its own task.
    pub observer: Arc<Observer>,
    /// Step times per tier, from the engine profiles.
    pub model: CapacityModel,
    states: Mutex<HashMap<ObjectRef<InferenceService>, State>>,
}

struct State {
    /// The uid of the object this state belongs to: a re-created service of the same name
    /// starts afresh instead of inheriting the deleted one's history.
    uid: Option<String>,
    history: History,
    outcome: PlannerOutcome,
    at: f64,
    generation: Option<i64>,
    /// When the last observation noted in the history was taken.
    noted_at: Option<f64>,
}

/// The result of one evaluation, or of the last one when none was due.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// The levers to build the children for.
    pub levers: Levers,
    /// The decision and what it saw.
    pub outcome: PlannerOutcome,
    /// Whether the planner decided in this reconcile (so its Event and metrics are new).
    pub decided_now: bool,
    /// What the planner recommended the previous time it decided.
    pub previous_recommendation: Option<Levers>,
}

/// Unix seconds of a timestamp.
pub fn seconds(t: &Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

impl SlaLoop {
    /// A loop over `observer` with `model`.
    pub fn new(observer: Arc<Observer>, model: CapacityModel) -> SlaLoop {
        SlaLoop { observer, model, states: Mutex::default() }
    }

    /// Evaluates `isvc` at `now` if an evaluation interval has passed since the last one (or
    /// the spec changed); otherwise returns the last decision again.
    pub fn evaluate(
        &self,
        isvc: &InferenceService,
        current: Levers,
        deployment: Option<&Deployment>,
        now: &Time,
    ) -> Evaluation {
        let key = ObjectRef::from_obj(isvc);
        let spec = PlannerSpec::from_spec(&isvc.spec);
        let t = seconds(now);
        let mut states = self.states.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let uid = isvc.metadata.uid.clone();
        if states.get(&key).is_some_and(|s| s.uid != uid) {
            states.remove(&key);
        }
        let generation = isvc.metadata.generation;
        let service = ServiceKey::new(isvc.namespace().unwrap_or_default(), isvc.name_any());
        let (at, freshness, metrics) = self.observer.metrics_of(&service, t);
        let (ready, desired) = replica_counts(deployment, current.replicas);
        let observation =
            Observation { at, freshness, metrics, ready_replicas: ready, desired_replicas: desired };
        if let Some(s) = states.get_mut(&key)
            && s.generation == generation
            && t - s.at < spec.evaluation_interval - 0.5
        {
            // Not due by the interval: a fresh observation is noted, and decides early when
            // a leading signal crossed (the waiting queue grew over two observations).
            let fresh = s.noted_at.is_none_or(|n| observation.at > n);
            let early = fresh && planner::due(&spec, &observation, &s.history, t);
            if fresh && !early {
                planner::decide::note(&observation, &mut s.history);
                s.noted_at = Some(observation.at);
            }
            if !early {
                return Evaluation {
                    levers: s.outcome.decision.levers,
                    outcome: s.outcome.clone(),
                    decided_now: false,
                    previous_recommendation: Some(s.outcome.decision.recommended),
                };
            }
        }
        let (history, previous) = states
            .get(&key)
            .map(|s| (s.history.clone(), Some(s.outcome.decision.recommended)))
            .unwrap_or_default();
        let observation_at = observation.at;
        let decision = planner::decide(&spec, &self.model, &observation, &current, &history, t);
        let outcome = PlannerOutcome { decision, observation, at: now.clone() };
        states.insert(
            key,
            State {
                uid,
                history: outcome.decision.history.clone(),
                outcome: outcome.clone(),
                at: t,
                generation,
                noted_at: Some(observation_at),
            },
        );
        Evaluation {
            levers: outcome.decision.levers,
            outcome,
            decided_now: true,
            previous_recommendation: previous,
        }
    }

    /// Forgets a deleted InferenceService.
    pub fn forget(&self, isvc: &InferenceService) {
        if let Ok(mut states) = self.states.lock() {
            states.remove(&ObjectRef::from_obj(isvc));
        }
    }

    /// Forgets every service that is not in `alive` (by reference and uid) and returns them:
    /// with background deletion (the default) an object vanishes without a last reconcile,
    /// so the controller sweeps its state against the watch caches instead.
    pub fn retain(
        &self,
        alive: &HashMap<ObjectRef<InferenceService>, Option<String>>,
    ) -> Vec<ObjectRef<InferenceService>> {
        let Ok(mut states) = self.states.lock() else { return Vec::new() };
        let gone: Vec<_> = states
            .iter()
            .filter(|(key, state)| alive.get(key).is_none_or(|uid| *uid != state.uid))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &gone {
            states.remove(key);
        }
        gone
    }

    /// How many services the loop holds state for.
    pub fn tracked(&self) -> usize {
        self.states.lock().map_or(0, |s| s.len())
    }
}

/// Ready replicas on the current template, and the replicas that exist, from the Deployment.
fn replica_counts(deployment: Option<&Deployment>, desired: i32) -> (i32, i32) {
    let Some(status) = deployment.and_then(|d| d.status.as_ref()) else { return (0, desired) };
    let ready = status.ready_replicas.unwrap_or(0).min(status.updated_replicas.unwrap_or(0));
    (ready, status.replicas.unwrap_or(desired).max(desired))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use crate::metrics_source::{MetricsSource, Observations, WindowRequest};
    use futures::future::BoxFuture;
    use k8s_openapi::jiff::Timestamp;

    /// A source that never has series: the state bookkeeping is all these tests look at.
    struct Nothing;
    impl MetricsSource for Nothing {
        fn observe<'a>(&'a self, _: &'a [WindowRequest]) -> BoxFuture<'a, Observations> {
            Box::pin(async { Observations { at: 0.0, services: Default::default(), error: None } })
        }
        fn describe(&self) -> String {
            "nothing".into()
        }
    }

    fn sla_loop() -> SlaLoop {
        SlaLoop::new(
            Observer::new(Arc::new(Nothing), std::time::Duration::from_secs(5)),
            CapacityModel::default(),
        )
    }

    #[test]
    fn deleted_and_recreated_services_do_not_keep_or_inherit_state() {
        let sla = sla_loop();
        let now = Time(Timestamp::now());
        let old = fixtures::isvc();
        let mut other = fixtures::isvc();
        other.metadata.name = Some("other".into());
        other.metadata.uid = Some("uid-other".into());
        for isvc in [&old, &other] {
            let e = sla.evaluate(isvc, Levers::current(isvc), None, &now);
            assert!(e.decided_now);
        }
        assert_eq!(sla.tracked(), 2);

        // The same name with another uid (deleted and re-created) starts afresh: no previous
        // recommendation, and a decision at once instead of the old one's interval.
        let mut recreated = fixtures::isvc();
        recreated.metadata.uid = Some("uid-recreated".into());
        let e = sla.evaluate(&recreated, Levers::current(&recreated), None, &now);
        assert!(e.decided_now && e.previous_recommendation.is_none());
        // The old object's own evaluation within the interval would have reused its state.
        let again = sla.evaluate(&recreated, Levers::current(&recreated), None, &now);
        assert!(!again.decided_now);

        // A sweep against the watch cache drops what is gone (`other`, deleted in the
        // background) and what is there under another uid.
        let alive: HashMap<_, _> = [(ObjectRef::from_obj(&old), old.metadata.uid.clone())].into();
        let mut gone = sla.retain(&alive);
        gone.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(gone.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["other", "smol"]);
        assert_eq!(sla.tracked(), 0);
        assert!(sla.retain(&HashMap::new()).is_empty());
    }
}
