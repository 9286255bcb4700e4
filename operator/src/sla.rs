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
}

/// Ready replicas on the current template, and the replicas that exist, from the Deployment.
fn replica_counts(deployment: Option<&Deployment>, desired: i32) -> (i32, i32) {
    let Some(status) = deployment.and_then(|d| d.status.as_ref()) else { return (0, desired) };
    let ready = status.ready_replicas.unwrap_or(0).min(status.updated_replicas.unwrap_or(0));
    (ready, status.replicas.unwrap_or(desired).max(desired))
}
