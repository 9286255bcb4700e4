//! The InferenceService controller. Each reconcile is a pipeline:
//! observe (the object and its children, from the watch caches) → decide the levers (pure) →
//! build the children (pure) → server-side apply what differs (one field manager) → status.
//! A steady state costs no API call; a change to the spec or to any owned child triggers a
//! reconcile through the watches, and a healthy object is requeued on its evaluation interval.

#![warn(clippy::too_many_lines)]

use crate::apply::{Outcome, apply};
use crate::build::{self, Levers, MANAGED_BY, PodMonitor};
use crate::error::Error;
use crate::leader::Leadership;
use crate::planner::Reason;
use crate::scope::ScopeFilter;
use crate::sla::{Evaluation, SlaLoop};
use crate::status::{self, StatusInputs};
use crate::telemetry::Metrics;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use pacer_crds::{InferenceService, conditions};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// Everything a reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Events about InferenceServices.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Watch caches of the children.
    pub stores: Stores,
    /// Whether the monitoring.coreos.com PodMonitor kind is served.
    pub pod_monitors: bool,
    /// The clock, injectable for tests.
    pub now: fn() -> Time,
    /// The SLA planner and its metrics; `None` without a metrics source (levers stay as set).
    pub sla: Option<Arc<SlaLoop>>,
    /// The leader fence: every write checks it first.
    pub leadership: Leadership,
    /// Where the operator acts: an InferenceService elsewhere is left alone.
    pub scope: ScopeFilter,
    /// Consecutive failures per object, for the retry backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<ObjectRef<InferenceService>, u32>>,
}

/// Watch caches of the owned kinds (only objects labelled as managed by the operator).
#[derive(Clone)]
pub struct Stores {
    /// Engine Deployments.
    pub deployments: Store<Deployment>,
    /// Engine Services.
    pub services: Store<Service>,
    /// Settings ConfigMaps.
    pub configmaps: Store<ConfigMap>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// PodMonitors, when the cluster serves that kind.
    pub pod_monitors: Option<Store<PodMonitor>>,
    /// Set once every cache is filled.
    filled: Arc<tokio::sync::OnceCell<()>>,
}

impl Stores {
    /// Resolves once every cache holds its first full list. The controller polls the watch
    /// streams itself, so this must be awaited inside a reconcile, never before the controller
    /// runs.
    pub async fn ready(&self) {
        // One task waits on the stores; everyone else waits on the cell, which wakes them all
        // (a store's own readiness future is not meant for many concurrent waiters).
        self.filled
            .get_or_init(|| async {
                let _ = futures::join!(
                    self.deployments.wait_until_ready(),
                    self.services.wait_until_ready(),
                    self.configmaps.wait_until_ready(),
                    self.pdbs.wait_until_ready(),
                    async {
                        if let Some(store) = &self.pod_monitors {
                            let _ = store.wait_until_ready().await;
                        }
                    },
                );
            })
            .await;
    }
}

pub use crate::scope::Scope;

/// An [`Api`] for `K` in `namespace`, or across every namespace.
fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// How often an InferenceService out of scope is looked at again. A namespace that gains the
/// selector's label triggers its reconciles at once; this only bounds how long a trigger lost
/// to a watch restart can delay them, and keeps a large cluster's out-of-scope objects cheap.
const OUT_OF_SCOPE_RECHECK: Duration = Duration::from_secs(300);

/// How often state of deleted InferenceServices is swept (see [`sweep`]).
const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

mod reconcile;
mod record;
mod sweep;
mod wiring;

use reconcile::publish;
pub use reconcile::{error_policy, reconcile};
use record::{forget_gauges, record_decision};
use sweep::sweep;
pub use wiring::run;

#[cfg(test)]
mod tests;
