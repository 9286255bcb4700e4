//! The engine pods of one service as Kubernetes would run them: pods start (container start plus
//! the profile's load and warm-up) before they are ready, a scale-in drains the removed pods
//! (no new requests, in-flight ones finish), a tier change is a rolling update with surge 1 and
//! no unavailability, and a least-outstanding-requests router spreads requests over ready pods.

use super::prom::EngineReport;
use super::replica::{Engine, Finished, Seq, Settings};
use pacer_planner::{EngineProfile, Levers};
use std::collections::VecDeque;

/// Where a pod is in its life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PodState {
    /// Created; ready at the given time.
    Starting {
        /// When it becomes ready.
        ready_at: f64,
    },
    /// Serving.
    Ready,
    /// Removed from the Service; finishing its in-flight requests.
    Draining,
}

/// One engine pod.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Unique id (also its Prometheus series).
    pub id: usize,
    /// Index of its tier's profile.
    pub tier: usize,
    /// The batch settings it started with, where the engines read them only at start (vLLM):
    /// its template's; `None` where they take the live settings.
    pub pinned: Option<Settings>,
    /// Its state.
    pub state: PodState,
    /// The engine inside.
    pub engine: Engine,
}

/// The service's pods and router.
#[derive(Debug)]
pub struct Fleet {
    /// Live pods (terminated ones are removed).
    pub pods: Vec<Pod>,
    profiles: Vec<EngineProfile>,
    container_start: f64,
    next_id: usize,
    /// Requests that arrived while no pod was ready.
    pending: VecDeque<Seq>,
    /// Pods terminated since the last call to [`Fleet::take_terminated`].
    terminated: Vec<usize>,
    /// The batch settings of the pod template, where the engines read them only at start:
    /// pods started with others are old and roll as a tier change does ([`Fleet::pin`]).
    pin: Option<Settings>,
    /// Tokens each engine's KV cache holds.
    kv_tokens: u32,
}

/// Seconds from creating a pod whose engine has `profile` to its readiness: the container's
/// start, the model's load, the warm-up.
pub fn start_delay(container_start: f64, profile: &EngineProfile) -> f64 {
    container_start + profile.load_seconds + profile.warmup_seconds
}

impl Fleet {
    /// `replicas` ready pods of tier `tier` at time 0 (a service already running), each with
    /// `pacer-engine`'s default KV cache.
    pub fn new(profiles: Vec<EngineProfile>, container_start: f64, replicas: i32, tier: usize) -> Fleet {
        Fleet::with_kv(profiles, container_start, replicas, tier, super::replica::KV_CACHE_TOKENS)
    }

    /// As [`Fleet::new`], with engines whose KV cache holds `kv_tokens`.
    pub fn with_kv(
        profiles: Vec<EngineProfile>,
        container_start: f64,
        replicas: i32,
        tier: usize,
        kv_tokens: u32,
    ) -> Fleet {
        let mut fleet = Fleet {
            pods: Vec::new(),
            profiles,
            container_start,
            next_id: 0,
            pending: VecDeque::new(),
            terminated: Vec::new(),
            pin: None,
            kv_tokens,
        };
        for _ in 0..replicas.max(0) {
            fleet.create(tier, PodState::Ready);
        }
        fleet
    }

    fn create(&mut self, tier: usize, state: PodState) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let engine = Engine::with_kv(self.profiles[tier].step, self.kv_tokens);
        self.pods.push(Pod { id, tier, pinned: self.pin, state, engine });
        id
    }

    /// Seconds from creating a pod of `tier` to its readiness.
    pub fn start_delay(&self, tier: usize) -> f64 {
        start_delay(self.container_start, &self.profiles[tier])
    }

    /// What each running engine (ready or draining) reports of its scheduler: its last step and
    /// its queue.
    pub fn reports(&self) -> Vec<EngineReport> {
        self.pods
            .iter()
            .filter(|p| !matches!(p.state, PodState::Starting { .. }))
            .map(|p| {
                let (last_step, steps) = p.engine.last_step();
                EngineReport {
                    pod: p.id,
                    serving: p.state == PodState::Ready,
                    last_step,
                    steps,
                    queued_prefill_tokens: p.engine.queued_prompt_tokens(),
                    scheduled_kv_tokens: p.engine.running_kv_tokens(),
                    queued_kv_tokens: p.engine.waiting_prompt_tokens(),
                }
            })
            .collect()
    }

    /// Pods that serve or will serve (not draining).
    pub fn active(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter().filter(|p| p.state != PodState::Draining)
    }

    /// Ready pods running `tier`.
    pub fn ready_at_tier(&self, tier: usize) -> i32 {
        self.pods.iter().filter(|p| p.state == PodState::Ready && p.tier == tier).count() as i32
    }

    /// Ready pods of any tier.
    pub fn ready(&self) -> i32 {
        self.pods.iter().filter(|p| p.state == PodState::Ready).count() as i32
    }

    /// Sets the batch settings the pod template carries (`Some` where the engines read them only
    /// at start, as vLLM does): the next [`Fleet::reconcile`] rolls pods started with other
    /// ones. The pods running when the fleet was made count as started with these.
    pub fn pin(&mut self, settings: Option<Settings>) {
        if self.pods.iter().all(|p| p.pinned.is_none()) {
            for p in &mut self.pods {
                p.pinned = settings;
            }
        }
        self.pin = settings;
    }

    /// Brings the pods toward `n` replicas of `tier`, as the Deployment controller would with
    /// maxSurge 1 and maxUnavailable 0. Returns the pods created (id, ready time).
    pub fn reconcile(&mut self, now: f64, n: i32, tier: usize) -> Vec<(usize, f64)> {
        let mut created = Vec::new();
        loop {
            let pin = self.pin;
            let current: Vec<&Pod> = self.active().filter(|p| p.tier == tier && p.pinned == pin).collect();
            let old: Vec<&Pod> = self.active().filter(|p| p.tier != tier || p.pinned != pin).collect();
            let (cur_n, old_n) = (current.len() as i32, old.len() as i32);
            let ready_total = self.active().filter(|p| p.state == PodState::Ready).count() as i32;
            if old_n == 0 {
                if cur_n < n {
                    let ready_at = now + self.start_delay(tier);
                    created.push((self.create(tier, PodState::Starting { ready_at }), ready_at));
                    continue;
                }
                if cur_n > n {
                    // Scale in: starting pods go first, then the newest ready ones.
                    let victim = current
                        .iter()
                        .rev()
                        .find(|p| matches!(p.state, PodState::Starting { .. }))
                        .or(current.last())
                        .map(|p| p.id);
                    if let Some(id) = victim {
                        self.drain(id);
                        continue;
                    }
                }
                break;
            }
            // A rollout: old pods that are not ready are removed at once; a ready old pod
            // leaves only while enough others are ready; a new pod starts while the total
            // stays within n + 1.
            if let Some(id) = old.iter().find(|p| matches!(p.state, PodState::Starting { .. })).map(|p| p.id)
            {
                self.drain(id);
                continue;
            }
            if (ready_total > n || cur_n + old_n > n + 1)
                && let Some(id) = old.first().map(|p| p.id)
            {
                self.drain(id);
                continue;
            }
            if cur_n < n && cur_n + old_n < n + 1 {
                let ready_at = now + self.start_delay(tier);
                created.push((self.create(tier, PodState::Starting { ready_at }), ready_at));
                continue;
            }
            if cur_n > n
                && let Some(id) = current.last().map(|p| p.id)
            {
                self.drain(id);
                continue;
            }
            break;
        }
        created
    }

    fn drain(&mut self, id: usize) {
        if let Some(p) = self.pods.iter_mut().find(|p| p.id == id) {
            p.state = PodState::Draining;
        }
        self.reap();
    }

    /// Removes draining pods that have nothing left to do.
    pub fn reap(&mut self) {
        let terminated = &mut self.terminated;
        self.pods.retain(|p| {
            let done = p.state == PodState::Draining && p.engine.outstanding() == 0;
            if done {
                terminated.push(p.id);
            }
            !done
        });
    }

    /// Pods terminated since the last call.
    pub fn take_terminated(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.terminated)
    }

    /// Marks pod `id` ready if it is still starting; hands it the requests that waited for a
    /// ready pod.
    pub fn mark_ready(&mut self, id: usize, now: f64, settings: Settings) -> bool {
        let Some(p) = self.pods.iter_mut().find(|p| p.id == id) else { return false };
        if !matches!(p.state, PodState::Starting { .. }) {
            return false;
        }
        p.state = PodState::Ready;
        while let Some(seq) = self.pending.pop_front() {
            self.route(seq, now, settings);
        }
        true
    }

    /// Sends a request to the ready pod with the fewest outstanding requests (the first such
    /// pod on ties); holds it when none is ready. Returns the pod's id.
    pub fn route(&mut self, seq: Seq, now: f64, settings: Settings) -> Option<usize> {
        let best = self
            .pods
            .iter_mut()
            .filter(|p| p.state == PodState::Ready)
            .min_by_key(|p| p.engine.outstanding());
        match best {
            Some(p) => {
                p.engine.submit(seq, now, p.pinned.unwrap_or(settings));
                Some(p.id)
            }
            None => {
                self.pending.push_back(seq);
                None
            }
        }
    }

    /// Advances pod `id`'s engine to `now`.
    pub fn poll(&mut self, id: usize, now: f64, settings: Settings, done: &mut Vec<Finished>) {
        if let Some(p) = self.pods.iter_mut().find(|p| p.id == id) {
            p.engine.poll(now, p.pinned.unwrap_or(settings), done);
        }
    }

    /// When pod `id`'s engine next needs the clock.
    pub fn next_event(&self, id: usize) -> Option<f64> {
        self.pods.iter().find(|p| p.id == id).and_then(|p| p.engine.next_event())
    }

    /// Requests held for want of a ready pod.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Requests failed by engines (too large for their KV cache).
    pub fn failed(&self) -> u64 {
        self.pods.iter().map(|p| p.engine.failed).sum()
    }

    /// The tier index of `levers`' tier among the profiles.
    pub fn tier_index(&self, levers: &Levers) -> Option<usize> {
        self.profiles.iter().position(|p| p.tier == levers.tier)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_profile;
    use super::*;
    use pacer_crds::Tier;

    fn fleet() -> Fleet {
        Fleet::new(vec![test_profile(Tier::Q8_0), test_profile(Tier::Q4_0)], 20.0, 2, 0)
    }

    #[test]
    fn a_tier_change_rolls_with_surge_one_and_never_drops_capacity() {
        let mut f = fleet();
        let created = f.reconcile(0.0, 2, 1);
        assert_eq!(created.len(), 1, "surge 1: one new pod at a time");
        assert_eq!(f.ready(), 2);
        let settings = Settings::new(8, 0.0);
        let (id, at) = created[0];
        f.mark_ready(id, at, settings);
        let created = f.reconcile(at, 2, 1);
        // One old pod left as the new one became ready; the next new pod starts.
        assert_eq!(f.ready(), 2);
        assert_eq!(created.len(), 1);
        let (id, at) = created[0];
        f.mark_ready(id, at, settings);
        assert!(f.reconcile(at, 2, 1).is_empty());
        assert_eq!(f.ready_at_tier(1), 2);
        assert_eq!(f.pods.len(), 2);
    }

    #[test]
    fn pinned_batch_settings_roll_like_a_tier_and_each_pod_runs_its_own() {
        let mut f = fleet();
        let old = Settings::new(8, 0.0);
        f.pin(Some(old));
        assert!(f.reconcile(0.0, 2, 0).is_empty(), "the running pods carry the template");
        let new = Settings::new(16, 0.0);
        f.pin(Some(new));
        let created = f.reconcile(0.0, 2, 0);
        assert_eq!(created.len(), 1, "surge 1: one new pod at a time");
        assert_eq!(f.ready(), 2, "no ready pod leaves first");
        let (id, at) = created[0];
        f.mark_ready(id, at, old);
        let created = f.reconcile(at, 2, 0);
        let (id2, at2) = created[0];
        f.mark_ready(id2, at2, old);
        assert!(f.reconcile(at2, 2, 0).is_empty());
        assert!(f.active().all(|p| p.pinned == Some(new)));
        // A pod runs the settings it started with, whatever the caller passes as live ones.
        let first = f.route(Seq::new(0, at2, 10, 10), at2, old).expect("routed");
        let pod = f.pods.iter().find(|p| p.id == first).expect("pod");
        assert_eq!(pod.pinned, Some(new));
    }

    #[test]
    fn scale_in_drains_and_routing_prefers_the_least_loaded_pod() {
        let mut f = fleet();
        let settings = Settings::new(8, 0.0);
        let a = f.route(Seq::new(0, 0.0, 100, 100), 0.0, settings).unwrap();
        let b = f.route(Seq::new(1, 0.0, 100, 100), 0.0, settings).unwrap();
        assert_ne!(a, b);
        f.reconcile(0.0, 1, 0);
        // The drained pod keeps its request until it finishes.
        assert_eq!(f.pods.len(), 2);
        assert_eq!(f.active().count(), 1);
        let c = f.route(Seq::new(2, 0.0, 100, 100), 0.0, settings).unwrap();
        assert_eq!(c, a);
    }
}
