//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run and
//! exactly one acts. The protocol follows client-go's: the holder renews `renewTime` every
//! `retry` interval; a candidate takes the Lease over only after it has seen the same record
//! unchanged for a whole `lease_duration` by its *own* clock (no cross-node clock comparison);
//! every write carries the `resourceVersion` it read, so two candidates cannot both win. A holder
//! that fails to renew within `renew_deadline` gives up leadership and the process stops acting.
//!
//! A renewal that hangs (an apiserver that stalls, a network that drops packets) must not keep
//! the old leader acting while a standby takes the Lease over: every renewal is bounded by what
//! is left of the renew deadline, and the [`Leadership`] fence that every write checks expires
//! by itself `renew_deadline` after the start of the last renewal that succeeded, whether or
//! not the renewing task is still waiting. `renew_deadline < lease_duration`, so the fence is
//! down before any standby, counting `lease_duration` from when it saw that renewal, can lead.

use crate::error::Error;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Timing of the election.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// The interval between attempts.
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        // client-go's defaults for controllers.
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// Whether this process may act as the leader now: the fence every write of the controller
/// checks. It holds a deadline, not a flag, so it falls by itself when renewals stop
/// succeeding, even while a renewal request hangs.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// `None`: always leading (no election). `Some(None)`: not leading.
    until: Option<Arc<Mutex<Option<Instant>>>>,
}

impl Leadership {
    /// A process that runs without leader election: it always acts.
    pub fn always() -> Leadership {
        Leadership { until: None }
    }

    /// A process in an election that has not won it yet: it writes nothing until it does.
    pub(crate) fn elected() -> Leadership {
        Leadership { until: Some(Arc::new(Mutex::new(None))) }
    }

    /// Whether this process may write now.
    pub fn is_leading(&self) -> bool {
        match &self.until {
            None => true,
            Some(until) => until.lock().is_ok_and(|u| u.is_some_and(|t| Instant::now() < t)),
        }
    }

    /// Leading until `deadline`, unless it was given up.
    fn lead_until(&self, deadline: Instant) {
        if let Some(until) = &self.until
            && let Ok(mut u) = until.lock()
        {
            *u = Some(deadline);
        }
    }

    fn give_up(&self) {
        if let Some(until) = &self.until
            && let Ok(mut u) = until.lock()
        {
            *u = None;
        }
    }
}

/// One candidate for the Lease `name`.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The record last seen (resourceVersion) and when this candidate first saw it.
    observed: Option<(String, Instant)>,
    /// The fence this candidate raises while it holds the Lease.
    leadership: Leadership,
}

/// The result of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    Leading,
    Following,
}

impl Elector {
    /// A candidate named `identity` for the Lease `name` in `api`'s namespace.
    pub fn new(
        api: Api<Lease>,
        name: impl Into<String>,
        identity: impl Into<String>,
        timing: Timing,
    ) -> Elector {
        Elector {
            api,
            name: name.into(),
            identity: identity.into(),
            timing,
            observed: None,
            leadership: Leadership::elected(),
        }
    }

    /// The fence that is up while this candidate holds the Lease.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this candidate holds the Lease. Each attempt is bounded by the renew
    /// deadline, so a hung request is retried rather than waited on.
    pub async fn acquire(&mut self) -> Result<(), Error> {
        loop {
            let started = Instant::now();
            match tokio::time::timeout(self.timing.renew_deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Leading)) => {
                    self.leadership.lead_until(started + self.timing.renew_deadline);
                    return Ok(());
                }
                Ok(Ok(Attempt::Following)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election attempt failed; retrying"),
                Err(_) => tracing::warn!("leader election attempt timed out; retrying"),
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Renews the Lease until renewal fails for `renew_deadline` or `stop` fires; then lowers
    /// the fence and sends `false` on `leading`. On `stop` the Lease is released so a standby
    /// takes over at once. A renewal gets only what is left of the deadline: one that hangs
    /// is abandoned at the deadline, not awaited.
    pub async fn keep(mut self, leading: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        // The deadline by which a renewal must have succeeded; the fence falls at the same time.
        let mut deadline = Instant::now() + self.timing.renew_deadline;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timing.retry) => {}
                _ = stop.changed() => {
                    self.leadership.give_up();
                    self.release().await;
                    let _ = leading.send(false);
                    return;
                }
            }
            let started = Instant::now();
            let left = deadline.saturating_duration_since(started);
            let attempt = tokio::time::timeout(left, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(Attempt::Leading)) => {
                    deadline = started + self.timing.renew_deadline;
                    self.leadership.lead_until(deadline);
                    continue;
                }
                Ok(Ok(Attempt::Following)) => {
                    tracing::error!(identity = %self.identity, "lost the leader Lease to another replica");
                }
                Ok(Err(e)) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "renewing the leader Lease failed; retrying");
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "could not renew the leader Lease within the deadline; stepping down");
                }
                Err(_) => {
                    tracing::error!(
                        deadline_s = self.timing.renew_deadline.as_secs_f64(),
                        "renewing the leader Lease hung past the deadline; stepping down"
                    );
                }
            }
            self.leadership.give_up();
            let _ = leading.send(false);
            return;
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, Error> {
        let now = MicroTime(Timestamp::now());
        let duration_secs = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(kube_err)? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                // Another candidate created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following),
                Err(e) => Err(kube_err(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if !mine {
            // Track how long this exact record has stood still, by the local clock.
            let seen_since = match &self.observed {
                Some((v, since)) if *v == version => *since,
                _ => {
                    self.observed = Some((version.clone(), Instant::now()));
                    Instant::now()
                }
            };
            let held_for =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_secs).max(1) as u64);
            if holder.is_some() && seen_since.elapsed() < held_for {
                return Ok(Attempt::Following);
            }
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: if mine { spec.acquire_time } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        // `replace` sends the resourceVersion read above: a concurrent winner makes this a 409.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                self.observed = updated.metadata.resource_version.map(|v| (v, Instant::now()));
                if !mine {
                    tracing::info!(identity = %self.identity, "acquired the leader Lease");
                }
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following),
            Err(e) => Err(kube_err(e)),
        }
    }

    /// Gives the Lease up (empty holder), so a standby need not wait for it to expire.
    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!("released the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "releasing the leader Lease failed; it expires on its own"),
        }
    }
}

fn kube_err(e: kube::Error) -> Error {
    Error::Lease(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_falls_at_its_deadline_or_when_given_up() {
        assert!(Leadership::always().is_leading());
        let fence = Leadership::elected();
        assert!(!fence.is_leading(), "a candidate that never led is fenced");
        fence.lead_until(Instant::now() + Duration::from_secs(60));
        assert!(fence.is_leading() && fence.clone().is_leading());
        fence.give_up();
        assert!(!fence.is_leading());
        // A deadline in the past: fenced without anyone giving up (a renewal that hangs).
        fence.lead_until(Instant::now() - Duration::from_millis(1));
        assert!(!fence.is_leading());
    }
}
