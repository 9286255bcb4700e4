//! The sweep of deleted InferenceServices' state.

use super::*;

/// Forgets every InferenceService that is gone from the watch caches — or came back under the
/// same name with another uid: the planner's state, the per-service gauges and the retry
/// counts. A deletion in the background (the default propagation) removes the object without
/// a last reconcile that could do it, so this sweep is what keeps a long-running operator's
/// memory and `/metrics` bounded by the services that exist.
pub(super) fn sweep(
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
            metrics.forget_service(&ns, &gone.name);
        }
    }
    for ctx in contexts {
        if let Ok(mut failures) = ctx.failures.lock() {
            failures.retain(|key, _| alive.contains_key(key));
        }
    }
}
