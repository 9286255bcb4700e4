//! What a reconcile records of the planner's evaluation: the per-service gauges (as methods of
//! [`Metrics`]), the log line, and an Event for a decision that moved a lever.

use super::*;

/// The operator's metrics, a log line and an Event for a decision the planner just made.
pub(super) async fn record_decision(ctx: &Context, isvc: &InferenceService, e: &Evaluation) {
    let d = &e.outcome.decision;
    ctx.metrics.record_evaluation(isvc, d, &e.outcome.observation.metrics);
    tracing::info!(reason = d.reason.as_str(), sla = d.sla.as_str(), message = %d.message, "evaluated the SLA");
    if d.changes.is_empty() {
        return;
    }
    let applied = d.levers == d.recommended;
    // In Advisory mode the same recommendation repeats every interval: announce it once.
    if !applied && e.previous_recommendation == Some(d.recommended) {
        return;
    }
    ctx.metrics.count_changes(d);
    let warning = matches!(d.reason, Reason::DegradedForLatency | Reason::AtMaxReplicas);
    let kind = if warning { EventType::Warning } else { EventType::Normal };
    let action = if applied { "Decide" } else { "Recommend" };
    publish(ctx, isvc, kind, d.reason.as_str(), action, d.message.clone()).await;
}

pub(super) fn forget_gauges(ctx: &Context, isvc: &InferenceService) {
    ctx.metrics.forget_service(&isvc.namespace().unwrap_or_default(), &isvc.name_any());
}
