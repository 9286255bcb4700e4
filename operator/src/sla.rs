//! The SLA loop inside a reconcile: the metrics poller's latest readings for this InferenceService and
//! its Deployment's ready replicas go to the planner's driver ([`Planner`], one per service)
//! once per evaluation interval, or sooner when the driver sees a leading signal cross in a
//! fresh observation (reconciles requeue on the poller's tick for that); the decision's levers
//! are what the children are built for. Between evaluations the last decision stands.

use crate::metrics_source::ServiceKey;
use crate::planner::{self, CapacityModel, History, Levers, Observation, Planner};
use crate::poller::MetricsPoller;
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
    pub poller: Arc<MetricsPoller>,
    /// Step times per tier, from the engine profiles.
    pub model: CapacityModel,
    states: Mutex<HashMap<ObjectRef<InferenceService>, State>>,
}

struct State {
    /// The uid of the object this state belongs to: a re-created service of the same name
    /// starts afresh instead of inheriting the deleted one's history.
    uid: Option<String>,
    /// The planner's driver, with its memory.
    planner: Planner,
    outcome: PlannerOutcome,
    at: f64,
    generation: Option<i64>,
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
    /// A loop over `poller` with `model`.
    pub fn new(poller: Arc<MetricsPoller>, model: CapacityModel) -> SlaLoop {
        SlaLoop { poller, model, states: Mutex::default() }
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
        let spec = isvc.spec.planner_spec();
        let t = seconds(now);
        let mut states = self.states.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let uid = isvc.metadata.uid.clone();
        if states.get(&key).is_some_and(|s| s.uid != uid) {
            states.remove(&key);
        }
        let generation = isvc.metadata.generation;
        let service = ServiceKey::new(isvc.namespace().unwrap_or_default(), isvc.name_any());
        let (at, freshness, metrics) = self.poller.metrics_of(&service, t);
        let (ready, desired) = replica_counts(deployment, current.replicas);
        let observation =
            Observation { at, freshness, metrics, ready_replicas: ready, desired_replicas: desired };
        // Between evaluations the driver notes a fresh observation, and decides early when a
        // leading signal crossed (the waiting queue grew over two observations).
        let mut early = None;
        if let Some(s) = states.get_mut(&key)
            && s.generation == generation
            && t - s.at < spec.evaluation_interval - 0.5
        {
            match s.planner.tick(&self.model, &observation, &current, t) {
                Some(decision) => early = Some(decision),
                None => {
                    return Evaluation {
                        levers: s.outcome.decision.levers,
                        outcome: s.outcome.clone(),
                        decided_now: false,
                        previous_recommendation: Some(s.outcome.decision.recommended),
                    };
                }
            }
        }
        // Due by the interval, or the spec changed; a service this process has no state for (it
        // just became the leader, or restarted) starts from the memory the last leader left in
        // the status.
        let (mut planner, previous) = match states.remove(&key) {
            Some(s) => (s.planner, Some(s.outcome.decision.recommended)),
            None => (Planner::resume(spec.clone(), remembered(isvc, t)), None),
        };
        planner.set_spec(spec.clone());
        let history = planner.history().clone();
        let mut decision = match early {
            Some(decision) => decision,
            None => planner.decide_now(&self.model, &observation, &current, t),
        };
        let mut at = t;
        // A new leader whose predecessor evaluated less than an interval ago (for this spec)
        // keeps the levers until that interval ends, as the predecessor would have: the
        // decision above gives the verdict for the status, the remembered history carries on.
        let resumed = previous.is_none()
            && isvc.status.as_ref().and_then(|s| s.observed_generation) == generation
            && history.evaluated_at.is_some_and(|e| e <= t)
            && !planner::due(&spec, &observation, &history, t);
        if resumed {
            let mut kept = history.clone();
            planner::decide::note(&observation, &mut kept);
            planner.replace_history(kept.clone());
            at = history.evaluated_at.unwrap_or(t);
            decision = resume(decision, current, kept, t - at);
        }
        let outcome = PlannerOutcome { decision, observation, at: now.clone() };
        states.insert(key, State { uid, planner, outcome: outcome.clone(), at, generation });
        Evaluation {
            levers: outcome.decision.levers,
            outcome,
            decided_now: !resumed,
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

/// `decision` turned into a hold at `current` with `history`: what a leader that took over
/// `ago` seconds after its predecessor's evaluation reports until its own is due.
fn resume(decision: planner::Decision, current: Levers, history: History, ago: f64) -> planner::Decision {
    let message = if decision.changes.is_empty() {
        format!(
            "took over as leader {ago:.0}s after the last evaluation; holding until the next: {}",
            decision.message
        )
    } else {
        format!("took over as leader {ago:.0}s after the last evaluation; holding until the next")
    };
    planner::Decision {
        levers: current,
        recommended: current,
        change: None,
        changes: Vec::new(),
        reason: planner::Reason::Resumed,
        message,
        history,
        ..decision
    }
}

/// The planner's memory in `isvc`'s status, when there is one it can trust at `now`.
fn remembered(isvc: &InferenceService, now: f64) -> History {
    let text = isvc.status.as_ref().and_then(|s| s.planner_memory.as_deref());
    let Some(text) = text else { return History::default() };
    planner::memory::decode(text, now).unwrap_or_else(|| {
        tracing::warn!("ignoring the planner memory in the status (another version, malformed or stamped ahead); starting afresh");
        History::default()
    })
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
    use crate::metrics_source::{MetricsReading, MetricsSource, WindowRequest};
    use futures::future::BoxFuture;
    use k8s_openapi::jiff::Timestamp;

    /// A source that never has series: the state bookkeeping is all these tests look at.
    struct Nothing;
    impl MetricsSource for Nothing {
        fn observe<'a>(&'a self, _: &'a [WindowRequest]) -> BoxFuture<'a, MetricsReading> {
            Box::pin(async { MetricsReading { at: 0.0, services: Default::default(), error: None } })
        }
        fn describe(&self) -> String {
            "nothing".into()
        }
    }

    fn sla_loop() -> SlaLoop {
        SlaLoop::new(
            MetricsPoller::new(Arc::new(Nothing), std::time::Duration::from_secs(5)),
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
            let e = sla.evaluate(isvc, isvc.current_levers(), None, &now);
            assert!(e.decided_now);
        }
        assert_eq!(sla.tracked(), 2);

        // The same name with another uid (deleted and re-created) starts afresh: no previous
        // recommendation, and a decision at once instead of the old one's interval.
        let mut recreated = fixtures::isvc();
        recreated.metadata.uid = Some("uid-recreated".into());
        let e = sla.evaluate(&recreated, recreated.current_levers(), None, &now);
        assert!(e.decided_now && e.previous_recommendation.is_none());
        // The old object's own evaluation within the interval would have reused its state.
        let again = sla.evaluate(&recreated, recreated.current_levers(), None, &now);
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

    #[test]
    fn a_new_leader_resumes_from_the_memory_in_the_status() {
        let now = Timestamp::now();
        let t = now.as_millisecond() as f64 / 1000.0;
        let mut isvc = fixtures::isvc();
        // The old leader decided 10 s ago, scaled up 40 s ago, and learned a correction.
        let mut history = History {
            evaluated_at: Some(t - 10.0),
            pending_scale_up: Some((3, t - 40.0)),
            ..History::default()
        };
        history.last_change.insert("replicas".into(), t - 40.0);
        history.changes.push(t - 40.0);
        history.correction.insert("native/8/512".into(), planner::Correction { ttft: 1.3, itl: 1.1 });
        isvc.status = Some(pacer_crds::InferenceServiceStatus {
            observed_generation: isvc.metadata.generation,
            replicas: Some(3),
            planner_memory: planner::memory::encode(&history),
            ..Default::default()
        });

        // The new leader holds (the interval is not over) and carries the memory on.
        let sla = sla_loop();
        let e = sla.evaluate(&isvc, isvc.current_levers(), None, &Time(now));
        assert!(!e.decided_now);
        assert_eq!(e.outcome.decision.reason, planner::Reason::Resumed);
        assert_eq!(e.levers, isvc.current_levers());
        let carried = &e.outcome.decision.history;
        assert_eq!(carried.last_change, history.last_change);
        assert_eq!(carried.pending_scale_up, history.pending_scale_up);
        assert_eq!(carried.correction, history.correction);
        // It decides on the old leader's schedule, with that history.
        let later = Time(now + std::time::Duration::from_secs(25));
        let e = sla.evaluate(&isvc, isvc.current_levers(), None, &later);
        assert!(e.decided_now);
        assert_eq!(e.outcome.decision.history.correction, history.correction);
        assert_eq!(e.outcome.decision.history.last_change, history.last_change);

        // A memory that cannot be trusted is ignored: the leader starts afresh and decides.
        for memory in ["{\"v\":99}".to_string(), "garbage".into()] {
            isvc.status.as_mut().expect("status").planner_memory = Some(memory);
            let e = sla_loop().evaluate(&isvc, isvc.current_levers(), None, &Time(now));
            assert!(e.decided_now);
            assert!(e.outcome.decision.history.correction.is_empty());
        }
        // So is one for another generation of the spec: a changed spec is evaluated at once.
        isvc.status.as_mut().expect("status").planner_memory = planner::memory::encode(&history);
        isvc.metadata.generation = Some(2);
        assert!(sla_loop().evaluate(&isvc, isvc.current_levers(), None, &Time(now)).decided_now);
    }
}
