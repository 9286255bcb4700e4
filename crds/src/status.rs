//! The `InferenceService` status: conditions, replicas, live lever values and a summary for
//! `kubectl get`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What the operator observed and did, written with server-side apply by one field manager.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InferenceServiceStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The latest observations, one per type (see [`crate::conditions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Desired engine replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Engine replicas that are ready (passing `/ready`) and run the current template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The quantization tier of the current pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The live `maxBatchSize` in the engines' settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_size: Option<u32>,
    /// The live `batchWaitMs` in the engines' settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_wait_ms: Option<u32>,
    /// The live `maxNumBatchedTokens` (the step's token budget) in the engines' settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u32>,
    /// The batch settings the engines report they run (`pacer_engine_setting`), as last
    /// observed: the settings above are what the operator set, these what the engines applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<EngineSettings>,
    /// The label selector of the engine pods, as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The SLA as last observed: percentiles against targets, sample counts, load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<SlaReadings>,
    /// The planner's last decision that moved (or, in Advisory mode, recommended moving) a lever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<LastDecision>,
    /// Short strings for `kubectl get` columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,
    /// The planner's memory as of its last decision (JSON, versioned; not an API): when the
    /// lever moves were, a scale-up still pending, the corrections it learned. A new leader
    /// starts from it instead of an empty history, so a failover does not undo the old
    /// leader's moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner_memory: Option<String>,
}

/// The batch settings the engines report: each one value, or `least-greatest` while replicas
/// differ (a change still reaching them, or refused by some); absent while none reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EngineSettings {
    /// `maxBatchSize`, e.g. `16` or `8-16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_size: Option<String>,
    /// `maxNumBatchedTokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<String>,
    /// `batchWaitMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_wait_ms: Option<String>,
}

/// Display strings for the printer columns (each also derivable from the fields above).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusSummary {
    /// Ready / desired replicas, e.g. `2/3`.
    pub replicas: String,
    /// Observed TTFT at the SLA percentile / target, e.g. `312ms/400ms` (`-` when unobserved).
    pub ttft: String,
    /// Observed ITL at the SLA percentile / target, e.g. `41ms/60ms` (`-` when unobserved).
    pub itl: String,
    /// `Met`, `Violated`, or `Unknown` while there are no fresh metrics.
    pub sla: String,
}

/// The SLA dimensions as the planner last saw them, over `window` at `percentile`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SlaReadings {
    /// When the metrics were read (RFC 3339).
    pub time: String,
    /// The window the percentiles cover, e.g. `5m`.
    pub window: String,
    /// The percentile, e.g. 95.
    pub percentile: f64,
    /// Time to first token at the percentile, ms (absent without enough samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Inter-token latency at the percentile, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms: Option<f64>,
    /// End-to-end latency at the percentile, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<f64>,
    /// Requests the TTFT percentile rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_samples: Option<f64>,
    /// Token gaps the ITL percentile rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_samples: Option<f64>,
    /// Finished requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<f64>,
    /// Generated tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_second: Option<f64>,
}

/// One planner decision: when, which lever, from and to, why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastDecision {
    /// When it was decided (RFC 3339).
    pub time: String,
    /// `replicas`, `batch` or `tier`.
    pub lever: String,
    /// `up` or `down`.
    pub direction: String,
    /// The value before.
    pub from: String,
    /// The value after.
    pub to: String,
    /// A machine-readable reason, e.g. `TTFTViolated`.
    pub reason: String,
    /// One sentence for people.
    pub message: String,
    /// False in Advisory mode, where the decision is only recommended.
    pub applied: bool,
}
