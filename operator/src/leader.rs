//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run and
//! exactly one acts. The protocol follows client-go's: the holder renews `renewTime` every
//! `retry` interval; a candidate takes the Lease over only after it has seen the same record
//! unchanged for a whole `lease_duration` by its *own* clock (no cross-node clock comparison);
//! every write carries the `resourceVersion` it read, so two candidates cannot both win. A holder
//! that fails to renew within `renew_deadline` gives up leadership and the process stops acting.

use crate::error::Error;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
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

/// One candidate for the Lease `name`.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The record last seen (resourceVersion) and when this candidate first saw it.
    observed: Option<(String, Instant)>,
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
        Elector { api, name: name.into(), identity: identity.into(), timing, observed: None }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&mut self) -> Result<(), Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => return Ok(()),
                Ok(Attempt::Following) => {}
                Err(e) => tracing::warn!(error = %e, "leader election attempt failed; retrying"),
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Renews the Lease until renewal fails for `renew_deadline` or `stop` fires; then sends
    /// `false` on `leading`. On `stop` the Lease is released so a standby takes over at once.
    pub async fn keep(mut self, leading: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timing.retry) => {}
                _ = stop.changed() => {
                    self.release().await;
                    let _ = leading.send(false);
                    return;
                }
            }
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => last_renewed = Instant::now(),
                Ok(Attempt::Following) => {
                    tracing::error!(identity = %self.identity, "lost the leader Lease to another replica");
                    let _ = leading.send(false);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the leader Lease failed");
                    if last_renewed.elapsed() >= self.timing.renew_deadline {
                        tracing::error!(
                            "could not renew the leader Lease within the deadline; stepping down"
                        );
                        let _ = leading.send(false);
                        return;
                    }
                }
            }
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
