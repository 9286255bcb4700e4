//! Condition types and reasons of `InferenceService` status, in one place so the operator, the
//! alert rules and the tests agree on the spelling.

/// Every desired engine replica is ready and runs the current pod template.
pub const READY: &str = "Ready";
/// A rollout (new template or replica change) is under way.
pub const PROGRESSING: &str = "Progressing";
/// The spec could not be turned into engine pods; the operator waits for a change.
pub const SPEC_VALID: &str = "SpecValid";

/// Every SLA dimension is within its target at the SLA percentile (Unknown without metrics).
pub const SLA_MET: &str = "SLAMet";
/// The planner has fresh metrics with enough samples to judge the SLA.
pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
/// The engines run a faster, less precise tier than the preferred one.
pub const DEGRADED: &str = "Degraded";
/// Replicas are at their maximum (and the tier at its fastest allowed) and the SLA is still violated.
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// The engines report running the batch settings the operator set (Unknown until they report).
pub const SETTINGS_APPLIED: &str = "SettingsApplied";

/// Reasons, in CamelCase as the Kubernetes API conventions ask.
pub mod reasons {
    /// All desired replicas are ready.
    pub const REPLICAS_READY: &str = "ReplicasReady";
    /// Fewer ready replicas than desired.
    pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
    /// The Deployment has not reported on the current generation yet.
    pub const DEPLOYMENT_PENDING: &str = "DeploymentPending";
    /// New pods are being rolled out.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// The rollout finished.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// The Deployment exceeded its progress deadline.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// The spec was accepted.
    pub const ACCEPTED: &str = "Accepted";
    /// The tier is the preferred one.
    pub const PREFERRED_TIER: &str = "PreferredTier";
    /// Running below the preferred tier to hold the SLA.
    pub const BELOW_PREFERRED_TIER: &str = "BelowPreferredTier";
    /// Replicas below max, or the SLA met.
    pub const WITHIN_LIMITS: &str = "WithinLimits";
    /// No metrics source is configured for the operator.
    pub const NO_METRICS_SOURCE: &str = "NoMetricsSource";
    /// The spec passed the schema but cannot be built (e.g. a name too long for its children).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The API server refused a child built from the spec (its message is in the condition).
    pub const CHILD_REJECTED: &str = "ChildRejected";
    /// Every engine reports the batch settings the operator set.
    pub const APPLIED: &str = "Applied";
    /// Some engine reports other batch settings than the operator set.
    pub const NOT_APPLIED: &str = "NotApplied";
    /// No engine reports its batch settings (no metrics yet, or a runtime that does not).
    pub const NOT_REPORTED: &str = "NotReported";
    /// `MetricsAvailable=True`: the metrics are fresh.
    pub const METRICS_FRESH: &str = "MetricsFresh";
    /// `SLAMet=True`: every percentile is within its target.
    pub const WITHIN_TARGET: &str = "WithinTarget";
    /// `SLAMet=False`: a percentile is over its target.
    pub const OVER_TARGET: &str = "OverTarget";
}
