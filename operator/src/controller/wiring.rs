//! The controller's wiring: the watches and caches per namespace (or across all), the scope
//! filter, the Event reporter, the periodic sweep, and the controller runtime that drives
//! [`reconcile`](super::reconcile) until shutdown.

use super::*;

/// Runs the controller until `shutdown` resolves (then finishes in-flight reconciles).
///
/// With a list of namespaces, each gets its own controller, watches and caches, so the
/// operator needs permissions in those namespaces only (Roles, no ClusterRole); they share
/// the metrics, the Event reporter and the SLA planner, whose one metrics poller asks about the
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
    // One poller task reads the metrics of every InferenceService the controllers know.
    let poller_task = sla.as_ref().map(|sla| {
        tracing::info!(source = %sla.poller.describe(), profiled_tiers = !sla.model.is_empty(), "SLA planner on");
        tokio::spawn(sla.poller.clone().run(isvc_stores, metrics.clone()))
    });
    // Ready once every child cache is filled (reconciles wait for the same, see `Stores::ready`).
    let readiness_metrics = metrics.clone();
    tokio::spawn(async move {
        futures::future::join_all(child_stores.iter().map(Stores::ready)).await;
        readiness_metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    futures::future::join_all(controllers).await;
    sweeper.abort();
    if let Some(task) = poller_task {
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
pub(super) async fn scope_filter(
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
pub(super) fn controller_in(
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
pub(super) fn cached<K>(
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

pub(super) async fn pod_monitor_served(client: &Client) -> bool {
    match client.list_api_group_resources("monitoring.coreos.com/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.kind == "PodMonitor"),
        Err(_) => false,
    }
}
