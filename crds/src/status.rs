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
    /// The label selector of the engine pods, as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Short strings for `kubectl get` columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,
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
