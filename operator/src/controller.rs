//! The InferenceService controller. Each reconcile is a pipeline:
//! observe (the object and its children, from the watch caches) → decide the levers (pure) →
//! build the children (pure) → server-side apply what differs (one field manager) → status.
//! A steady state costs no API call; a change to the spec or to any owned child triggers a
//! reconcile through the watches, and a healthy object is requeued on its evaluation interval.

use crate::apply::{Outcome, apply};
use crate::build::{self, Levers, MANAGED_BY, PodMonitor};
use crate::error::Error;
use crate::leader::Leadership;
use crate::planner::{Quantile, Reason, SlaState};
use crate::scope::ScopeFilter;
use crate::sla::{Evaluation, SlaLoop};
use crate::status::{self, Observed};
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

/// Runs the controller until `shutdown` resolves (then finishes in-flight reconciles).
///
/// With a list of namespaces, each gets its own controller, watches and caches, so the
/// operator needs permissions in those namespaces only (Roles, no ClusterRole); they share
/// the metrics, the Event reporter and the SLA planner, whose one observer asks about the
/// InferenceServices of all of them in one tick.
pub async fn run(
    client: Client,
    scope: Scope,
    metrics: Arc<Metrics>,
    instance: String,
    sla: Option<SlaLoop>,
    leadership: Leadership,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let pod_monitors = pod_monitor_served(&client).await;
    tracing::info!(
        pod_monitors,
        namespaces = ?scope.namespaces,
        excluded = ?scope.excluded,
        selector = scope.selector.as_deref().unwrap_or(""),
        "starting the InferenceService controller"
    );
    // With a selector the operator runs one controller (cluster mode), which takes the
    // namespace watch's changes as triggers.
    let (filter, mut namespace_events) = scope_filter(&client, scope.clone()).await?;
    let namespaces: Vec<Option<&str>> = if scope.namespaces.is_empty() {
        vec![None]
    } else {
        scope.namespaces.iter().map(|ns| Some(ns.as_str())).collect()
    };
    let sla = sla.map(Arc::new);
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let reporter = Reporter { controller: "pacer-operator".into(), instance: Some(instance) };
    let mut isvc_stores = Vec::new();
    let mut child_stores = Vec::new();
    let mut controllers = Vec::new();
    let mut contexts = Vec::new();
    for namespace in namespaces {
        let (stores, isvcs, controller, context) = controller_in(
            &client,
            namespace,
            pod_monitors,
            namespace_events.take(),
            |stores| Context {
                recorder: Recorder::new(client.clone(), reporter.clone()),
                client: client.clone(),
                metrics: metrics.clone(),
                stores,
                pod_monitors,
                now: || Time(Timestamp::now()),
                sla: sla.clone(),
                leadership: leadership.clone(),
                scope: filter.clone(),
                failures: Default::default(),
            },
            shutdown.clone(),
        );
        isvc_stores.push(isvcs);
        child_stores.push(stores);
        controllers.push(controller);
        contexts.push(context);
    }
    let sweeper = {
        let (stores, sla, metrics) = (isvc_stores.clone(), sla.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                sweep(&stores, &contexts, sla.as_deref(), &metrics);
            }
        })
    };
    // One observer task reads the metrics of every InferenceService the controllers know.
    let observer_task = sla.as_ref().map(|sla| {
        tracing::info!(source = %sla.observer.describe(), profiled_tiers = !sla.model.is_empty(), "SLA planner on");
        tokio::spawn(sla.observer.clone().run(isvc_stores, metrics.clone()))
    });
    // Ready once every child cache is filled (reconciles wait for the same, see `Stores::ready`).
    let readiness_metrics = metrics.clone();
    tokio::spawn(async move {
        futures::future::join_all(child_stores.iter().map(Stores::ready)).await;
        readiness_metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    futures::future::join_all(controllers).await;
    sweeper.abort();
    if let Some(task) = observer_task {
        task.abort();
    }
    Ok(())
}

/// A stream of the namespaces whose selection changed (they gained or lost the selector's
/// label), for the controller to look again at the InferenceServices in them.
type NamespaceEvents = futures::stream::BoxStream<'static, Result<Namespace, watcher::Error>>;

/// The scope's filter: in cluster mode with a selector, a cache of the namespaces it matches,
/// filled by a watch with that selector, and that watch's changes (a namespace that gains the
/// label is acted in at once). The selector is checked with one list first, so a malformed
/// selector or a missing `list namespaces` permission stops the start with the cause rather
/// than a watch that retries forever.
async fn scope_filter(
    client: &Client,
    scope: Scope,
) -> Result<(ScopeFilter, Option<NamespaceEvents>), Error> {
    let Some(selector) = scope.selector.clone().filter(|_| scope.namespaces.is_empty()) else {
        return Ok((ScopeFilter::new(scope, None), None));
    };
    let api: Api<Namespace> = Api::all(client.clone());
    api.list_metadata(&kube::api::ListParams::default().labels(&selector).limit(1)).await.map_err(|e| {
        Error::Scope(format!("listing the namespaces that --namespace-selector {selector:?} matches: {e}"))
    })?;
    let (reader, writer) = reflector::store();
    let events =
        reflector(writer, watcher(api, watcher::Config::default().labels(&selector)).default_backoff())
            .touched_objects()
            .inspect(|event| {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "watching the selected namespaces");
                }
            })
            .boxed();
    Ok((ScopeFilter::new(scope, Some(reader)), Some(events)))
}

/// The controller of one namespace (or of all): its child caches, its InferenceService cache,
/// and the future that runs it until `shutdown`, with the context `ctx` makes around the caches.
/// A namespace in `namespace_events` has every InferenceService in it reconciled.
fn controller_in(
    client: &Client,
    namespace: Option<&str>,
    pod_monitors: bool,
    namespace_events: Option<NamespaceEvents>,
    ctx: impl FnOnce(Stores) -> Context,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> (Stores, Store<InferenceService>, futures::future::BoxFuture<'static, ()>, Arc<Context>) {
    let owned = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
    let (deployments, deployment_events) = cached::<Deployment>(api_in(client, namespace), owned.clone());
    let (services, service_events) = cached::<Service>(api_in(client, namespace), owned.clone());
    let (configmaps, configmap_events) = cached::<ConfigMap>(api_in(client, namespace), owned.clone());
    let (pdbs, pdb_events) = cached::<PodDisruptionBudget>(api_in(client, namespace), owned.clone());
    // PodMonitors are cached and watched like the other children when the kind is served, so a
    // no-op reconcile costs no request for them either.
    let (pod_monitor_store, pod_monitor_events) =
        pod_monitors.then(|| cached::<PodMonitor>(api_in(client, namespace), owned)).unzip();
    let stores = Stores {
        deployments,
        services,
        configmaps,
        pdbs,
        pod_monitors: pod_monitor_store,
        filled: Arc::default(),
    };
    let ctx = ctx(stores.clone());

    let isvcs: Api<InferenceService> = api_in(client, namespace);
    let controller = Controller::new(isvcs, watcher::Config::default())
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .owns_stream(configmap_events)
        .owns_stream(pdb_events);
    let controller = match pod_monitor_events {
        Some(events) => controller.owns_stream(events),
        None => controller,
    };
    let isvc_store = controller.store();
    let controller = match namespace_events {
        Some(events) => {
            let isvcs = isvc_store.clone();
            controller.watches_stream(events, move |ns: Namespace| {
                let name = ns.name_any();
                isvcs
                    .state()
                    .iter()
                    .filter(|isvc| isvc.namespace().as_deref() == Some(name.as_str()))
                    .map(|isvc| ObjectRef::from_obj(isvc.as_ref()))
                    .collect::<Vec<_>>()
            })
        }
        None => controller,
    }
    .graceful_shutdown_on(shutdown);
    let ctx = Arc::new(ctx);
    let run = controller.run(reconcile, error_policy, ctx.clone()).for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(error = %e, "reconcile finished with an error");
        }
    });
    (stores, isvc_store, Box::pin(run), ctx)
}

/// A reflector for `K` (filling a store) and its stream of changed objects for `owns_stream`.
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Store<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, config).default_backoff()).touched_objects();
    (reader, stream)
}

async fn pod_monitor_served(client: &Client) -> bool {
    match client.list_api_group_resources("monitoring.coreos.com/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.kind == "PodMonitor"),
        Err(_) => false,
    }
}

/// One reconcile of one InferenceService.
#[tracing::instrument(skip(isvc, ctx), fields(namespace = isvc.namespace(), name = isvc.name_any()))]
pub async fn reconcile(isvc: Arc<InferenceService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.duration.start_timer();
    tracing::debug!("reconciling");
    if isvc.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove the children.
        if let Some(sla) = &ctx.sla {
            sla.forget(&isvc);
            forget_gauges(&ctx, &isvc);
        }
        return Ok(Action::await_change());
    }
    let ns = isvc.namespace().ok_or(Error::NoNamespace)?;
    ctx.scope.ready().await;
    if !ctx.scope.admits(&ns) {
        // Out of scope: no child, no status, no Event. A namespace that gains the selector's
        // label triggers a reconcile of what is in it (the namespace watch); the slow recheck
        // only covers a trigger lost to a watch restart.
        tracing::debug!("namespace out of scope (excluded, or not matching --namespace-selector)");
        return Ok(Action::requeue(OUT_OF_SCOPE_RECHECK));
    }
    // Before the child caches are filled every child would look missing and be re-applied.
    ctx.stores.ready().await;
    let current = isvc.current_levers();
    let now = (ctx.now)();

    if let Err(spec_error) = build::validate(&isvc) {
        return refuse(&ctx, &isvc, &ns, &current, now, &spec_error).await;
    }

    // Decide the levers from the SLA (on the evaluation interval), then build for them.
    let live = ctx.stores.deployments.get(&ObjectRef::new(&isvc.name_any()).within(&ns));
    let evaluation = ctx.sla.as_ref().map(|sla| sla.evaluate(&isvc, current, live.as_deref(), &now));
    let levers = evaluation.as_ref().map_or(current, |e| e.levers);
    let deployment = match apply_children(&ctx, &isvc, &ns, &levers).await {
        Ok(deployment) => deployment,
        // Retrying cannot help: say why in status and an Event, and wait for a spec change.
        Err(Error::Rejected { kind, name, message }) => {
            let rejected = build::SpecError::ChildRejected { kind, name, message };
            return refuse(&ctx, &isvc, &ns, &current, now, &rejected).await;
        }
        Err(e) => return Err(e),
    };

    let next = status::desired(&Observed {
        isvc: &isvc,
        levers: &levers,
        deployment: Some(&deployment),
        spec_error: None,
        planner: evaluation.as_ref().map(|e| &e.outcome),
        now,
    });
    if status::changed(isvc.status.as_ref(), &next) {
        let was = status::condition(isvc.status.as_ref(), conditions::READY).map(|c| c.status.clone());
        write_status(&ctx, &isvc, &ns, &next).await?;
        if let Some(ready) = status::condition(Some(&next), conditions::READY)
            && was.as_deref() != Some(ready.status.as_str())
        {
            let (kind, reason) = if ready.status == "True" {
                (EventType::Normal, "Ready")
            } else {
                (EventType::Normal, "NotReady")
            };
            publish(&ctx, &isvc, kind, reason, "Observe", ready.message.clone()).await;
        }
    }
    if let Some(e) = evaluation.as_ref().filter(|e| e.decided_now) {
        record_decision(&ctx, &isvc, e).await;
    }
    ctx.metrics.reconciles.with_label_values(&["ok"]).inc();
    tracing::debug!(replicas = levers.replicas, tier = %levers.tier, "reconciled");
    if let Ok(mut failures) = ctx.failures.lock() {
        failures.remove(&ObjectRef::from_obj(&*isvc));
    }
    // With an SLA loop, every fresh observation is looked at (for the planner's early
    // evaluation on a growing queue); the planner still decides once per evaluation interval
    // otherwise.
    let every = build::evaluation_interval(&isvc);
    let every = ctx.sla.as_ref().map_or(every, |sla| every.min(sla.observer.tick_interval()));
    Ok(Action::requeue(every))
}

/// The operator's metrics, a log line and an Event for a decision the planner just made.
async fn record_decision(ctx: &Context, isvc: &InferenceService, e: &Evaluation) {
    let d = &e.outcome.decision;
    let (ns, name) = (isvc.namespace().unwrap_or_default(), isvc.name_any());
    let sla_value = match d.sla {
        SlaState::Met => 1.0,
        SlaState::Violated => 0.0,
        SlaState::Unknown => -1.0,
    };
    ctx.metrics.sla_met.with_label_values(&[&ns, &name]).set(sla_value);
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    ctx.metrics.scaling_limited.with_label_values(&[&ns, &name]).set(flag(d.scaling_limited));
    let below = d.levers.tier != isvc.spec.quantization.preferred();
    ctx.metrics.below_preferred_tier.with_label_values(&[&ns, &name]).set(flag(below));
    let sla = &isvc.spec.sla;
    let targets = [("ttft", Some(sla.ttft_ms)), ("itl", Some(sla.itl_ms)), ("e2e", sla.e2e_ms)];
    for (dimension, ms) in targets {
        match ms {
            Some(ms) => {
                ctx.metrics.sla_target.with_label_values(&[&ns, &name, dimension]).set(f64::from(ms) / 1e3)
            }
            None => {
                let _ = ctx.metrics.sla_target.remove_label_values(&[&ns, &name, dimension]);
            }
        }
    }
    let m = &e.outcome.observation.metrics;
    for (dimension, q) in [("ttft", &m.ttft), ("itl", &m.itl), ("e2e", &m.e2e)] {
        match q {
            Quantile::Value { seconds, .. } => {
                ctx.metrics.observed.with_label_values(&[&ns, &name, dimension]).set(*seconds)
            }
            _ => {
                // No signal: no series, rather than a stale value that looks current.
                let _ = ctx.metrics.observed.remove_label_values(&[&ns, &name, dimension]);
            }
        }
    }
    tracing::info!(reason = d.reason.as_str(), sla = d.sla.as_str(), message = %d.message, "evaluated the SLA");
    if d.changes.is_empty() {
        return;
    }
    let applied = d.levers == d.recommended;
    // In Advisory mode the same recommendation repeats every interval: announce it once.
    if !applied && e.previous_recommendation == Some(d.recommended) {
        return;
    }
    for change in &d.changes {
        ctx.metrics
            .decisions
            .with_label_values(&[change.lever.as_str(), change.direction.as_str(), d.reason.as_str()])
            .inc();
    }
    let warning = matches!(d.reason, Reason::DegradedForLatency | Reason::AtMaxReplicas);
    let kind = if warning { EventType::Warning } else { EventType::Normal };
    let action = if applied { "Decide" } else { "Recommend" };
    publish(ctx, isvc, kind, d.reason.as_str(), action, d.message.clone()).await;
}

fn forget_gauges(ctx: &Context, isvc: &InferenceService) {
    forget_gauges_of(&ctx.metrics, &isvc.namespace().unwrap_or_default(), &isvc.name_any());
}

fn forget_gauges_of(metrics: &Metrics, ns: &str, name: &str) {
    let _ = metrics.sla_met.remove_label_values(&[ns, name]);
    let _ = metrics.scaling_limited.remove_label_values(&[ns, name]);
    let _ = metrics.below_preferred_tier.remove_label_values(&[ns, name]);
    for dimension in ["ttft", "itl", "e2e"] {
        let _ = metrics.observed.remove_label_values(&[ns, name, dimension]);
        let _ = metrics.sla_target.remove_label_values(&[ns, name, dimension]);
    }
}

/// How often an InferenceService out of scope is looked at again. A namespace that gains the
/// selector's label triggers its reconciles at once; this only bounds how long a trigger lost
/// to a watch restart can delay them, and keeps a large cluster's out-of-scope objects cheap.
const OUT_OF_SCOPE_RECHECK: Duration = Duration::from_secs(300);

/// How often state of deleted InferenceServices is swept (see [`sweep`]).
const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

/// Forgets every InferenceService that is gone from the watch caches — or came back under the
/// same name with another uid: the planner's state, the per-service gauges and the retry
/// counts. A deletion in the background (the default propagation) removes the object without
/// a last reconcile that could do it, so this sweep is what keeps a long-running operator's
/// memory and `/metrics` bounded by the services that exist.
fn sweep(
    stores: &[Store<InferenceService>],
    contexts: &[Arc<Context>],
    sla: Option<&SlaLoop>,
    metrics: &Metrics,
) {
    let alive: std::collections::HashMap<ObjectRef<InferenceService>, Option<String>> = stores
        .iter()
        .flat_map(Store::state)
        .map(|isvc| (ObjectRef::from_obj(&*isvc), isvc.metadata.uid.clone()))
        .collect();
    if let Some(sla) = sla {
        for gone in sla.retain(&alive) {
            let ns = gone.namespace.clone().unwrap_or_default();
            tracing::info!(namespace = %ns, name = %gone.name, "forgetting a deleted InferenceService");
            forget_gauges_of(metrics, &ns, &gone.name);
        }
    }
    for ctx in contexts {
        if let Ok(mut failures) = ctx.failures.lock() {
            failures.retain(|key, _| alive.contains_key(key));
        }
    }
}

/// Reports a spec that cannot become pods (Ready=False with the reason, a Warning Event when the
/// status changes) and waits for the next change of the object.
async fn refuse(
    ctx: &Context,
    isvc: &InferenceService,
    ns: &str,
    levers: &Levers,
    now: Time,
    spec_error: &build::SpecError,
) -> Result<Action, Error> {
    let next = status::desired(&Observed {
        isvc,
        levers,
        deployment: None,
        spec_error: Some(spec_error),
        planner: None,
        now,
    });
    if status::changed(isvc.status.as_ref(), &next) {
        write_status(ctx, isvc, ns, &next).await?;
        publish(ctx, isvc, EventType::Warning, spec_error.reason(), "Validate", spec_error.to_string()).await;
    }
    ctx.metrics.reconciles.with_label_values(&["invalid_spec"]).inc();
    Ok(Action::await_change())
}

/// Applies every child that drifted; returns the Deployment as it now is. The settings
/// ConfigMap goes first: new pods mount it and read their batch settings from it at start.
async fn apply_children(
    ctx: &Context,
    isvc: &InferenceService,
    ns: &str,
    levers: &Levers,
) -> Result<Deployment, Error> {
    let stores = &ctx.stores;
    let api = Api::namespaced(ctx.client.clone(), ns);
    apply_child(ctx, isvc, api, &build::configmap(isvc, levers), &stores.configmaps).await?;
    let api = Api::namespaced(ctx.client.clone(), ns);
    let deployment =
        apply_child(ctx, isvc, api, &build::deployment(isvc, levers), &stores.deployments).await?;
    let api = Api::namespaced(ctx.client.clone(), ns);
    apply_child(ctx, isvc, api, &build::service(isvc), &stores.services).await?;
    let api = Api::namespaced(ctx.client.clone(), ns);
    apply_child(ctx, isvc, api, &build::pdb(isvc), &stores.pdbs).await?;
    if let Some(pod_monitors) = &stores.pod_monitors {
        let api = Api::namespaced(ctx.client.clone(), ns);
        apply_child(ctx, isvc, api, &build::pod_monitor(isvc), pod_monitors).await?;
    }
    Ok(deployment)
}

/// Applies one typed child if it drifted from `desired`, with an Event when it changed.
async fn apply_child<K>(
    ctx: &Context,
    isvc: &InferenceService,
    api: Api<K>,
    desired: &K,
    store: &Store<K>,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let key = ObjectRef::<K>::new(&desired.name_any()).within(&isvc.namespace().unwrap_or_default());
    let live = store.get(&key);
    fence(ctx)?;
    let (object, outcome) = apply(&api, desired, live.as_deref(), &ctx.metrics).await?;
    let kind = K::kind(&());
    let name = desired.name_any();
    match outcome {
        // The action names the kind, so Events about different children are not merged.
        Outcome::Created => {
            publish(
                ctx,
                isvc,
                EventType::Normal,
                "Created",
                &format!("Apply{kind}"),
                format!("created {kind} {name}"),
            )
            .await
        }
        Outcome::Updated => {
            let note = format!("updated {kind} {name} to the spec");
            publish(ctx, isvc, EventType::Normal, "Updated", &format!("Apply{kind}"), note).await
        }
        Outcome::Unchanged => {}
    }
    Ok(object)
}

async fn write_status(
    ctx: &Context,
    isvc: &InferenceService,
    ns: &str,
    next: &pacer_crds::InferenceServiceStatus,
) -> Result<(), Error> {
    fence(ctx)?;
    let api: Api<InferenceService> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": "serving.pacer.dev/v1alpha1",
        "kind": "InferenceService",
        "status": next,
    });
    ctx.metrics.writes.with_label_values(&["InferenceService/status"]).inc();
    api.patch_status(
        &isvc.name_any(),
        &PatchParams::apply(build::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::Status)?;
    Ok(())
}

async fn publish(
    ctx: &Context,
    isvc: &InferenceService,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    if fence(ctx).is_err() {
        return;
    }
    let event =
        Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&event, &isvc.object_ref(&())).await {
        // Events are best effort: a failure must not fail the reconcile.
        tracing::warn!(error = %e, "publishing an Event failed");
    }
}

/// Refuses a write from a process that is not the leader now (its Lease may be another's).
/// Checked before every write, so a leader whose renewals hang stops writing at its renew
/// deadline, before a standby can take the Lease.
fn fence(ctx: &Context) -> Result<(), Error> {
    if ctx.leadership.is_leading() { Ok(()) } else { Err(Error::NotLeader) }
}

/// Transient errors back off exponentially per object, from 1 s up to 5 min; the metrics count
/// them by kind.
pub fn error_policy(isvc: Arc<InferenceService>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconciles.with_label_values(&["error"]).inc();
    ctx.metrics.errors.with_label_values(&[error.metric_label()]).inc();
    let attempt = ctx.failures.lock().map_or(0, |mut f| {
        let n = f.entry(ObjectRef::from_obj(&*isvc)).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    let delay = retry_delay(attempt);
    tracing::warn!(name = %isvc.name_any(), error = %error, attempt, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// 1 s, 2 s, 4 s, ... capped at 5 min.
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests;
