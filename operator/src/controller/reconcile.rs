//! One reconcile: observe (the object and its children, from the watch caches) → decide the
//! levers (pure) → build the children (pure) → server-side apply what differs → status; and
//! what a failed one does (the retry backoff).

use super::*;

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

    let next = status::desired(&StatusInputs {
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
    let every = ctx.sla.as_ref().map_or(every, |sla| every.min(sla.poller.tick_interval()));
    Ok(Action::requeue(every))
}

/// Reports a spec that cannot become pods (Ready=False with the reason, a Warning Event when the
/// status changes) and waits for the next change of the object.
pub(super) async fn refuse(
    ctx: &Context,
    isvc: &InferenceService,
    ns: &str,
    levers: &Levers,
    now: Time,
    spec_error: &build::SpecError,
) -> Result<Action, Error> {
    let next = status::desired(&StatusInputs {
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
pub(super) async fn apply_children(
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
pub(super) async fn apply_child<K>(
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

pub(super) async fn write_status(
    ctx: &Context,
    isvc: &InferenceService,
    ns: &str,
    next: &pacer_crds::InferenceServiceStatus,
) -> Result<(), Error> {
    fence(ctx)?;
    let api: Api<InferenceService> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": pacer_crds::API_VERSION,
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

pub(super) async fn publish(
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
pub(super) fn fence(ctx: &Context) -> Result<(), Error> {
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
pub(super) fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}
