//! Every metric name Pacer exports or records, in one list ([`ALL`]): the engine's (vLLM's names,
//! so existing dashboards, routers and autoscalers work unchanged, plus `pacer_engine_*` for what
//! vLLM lacks), the operator's own (`pacer_operator_*`), local mode's router's (`pacer_router_*`),
//! and the series the recording rules in
//! `config/prometheus/` derive (`inferenceservice:*`). The exporters register from these
//! constants, the queries are written with them, and a test holds `config/`, `charts/` and
//! `docs/metrics.md` to exactly these names.

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic counter (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A histogram (`_bucket`, `_sum`, `_count` series).
    Histogram,
}

/// Who writes a metric's series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `pacer-engine`'s `/metrics` (vLLM names are also a vLLM pod's).
    Engine,
    /// `pacer-operator`'s `/metrics`.
    Operator,
    /// A recording rule in `config/prometheus/recording-rules.yaml`.
    Recorded,
    /// Local mode's router (`pacer-operator local`, at the router's `/metrics`).
    Router,
}

/// One metric of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The series name (a histogram's without `_bucket`, `_sum` or `_count`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Who writes it.
    pub source: Source,
    /// The help text the exporter registers it with.
    pub help: &'static str,
}

const fn engine(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric { name, kind, source: Source::Engine, help }
}
const fn operator(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric { name, kind, source: Source::Operator, help }
}
const fn router(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric { name, kind, source: Source::Router, help }
}
const fn recorded(name: &'static str, help: &'static str) -> Metric {
    Metric { name, kind: Gauge, source: Source::Recorded, help }
}

use Kind::{Counter, Gauge, Histogram};

/// The label every engine series carries: the served model's name.
pub const MODEL_NAME_LABEL: &str = "model_name";

// The engine: vLLM's names.
/// Request accepted → first token handed to the response stream.
pub const TTFT: Metric = engine("vllm:time_to_first_token_seconds", Histogram, "Time to first token.");
/// Every gap between consecutive tokens of a sequence.
pub const ITL: Metric = engine("vllm:inter_token_latency_seconds", Histogram, "Inter-token latency.");
/// [`ITL`] under vLLM's older name.
pub const ITL_LEGACY: Metric =
    engine("vllm:time_per_output_token_seconds", Histogram, "Inter-token latency (vLLM's older name).");
/// Per request: decode time / (N − 1).
pub const TPOT: Metric = engine(
    "vllm:request_time_per_output_token_seconds",
    Histogram,
    "Per-request decode time per output token.",
);
/// Request accepted → last token.
pub const E2E: Metric = engine("vllm:e2e_request_latency_seconds", Histogram, "End-to-end request latency.");
/// Request accepted → first scheduled.
pub const QUEUE_TIME: Metric =
    engine("vllm:request_queue_time_seconds", Histogram, "Time waiting before scheduling.");
/// First scheduled → first token.
pub const PREFILL_TIME: Metric =
    engine("vllm:request_prefill_time_seconds", Histogram, "Prefill phase time.");
/// First token → last token.
pub const DECODE_TIME: Metric = engine("vllm:request_decode_time_seconds", Histogram, "Decode phase time.");
/// Prompt tokens per request.
pub const PROMPT_LENGTH: Metric =
    engine("vllm:request_prompt_tokens", Histogram, "Prompt tokens per request.");
/// Generated tokens per request.
pub const GENERATION_LENGTH: Metric =
    engine("vllm:request_generation_tokens", Histogram, "Generated tokens per request.");
/// Sequences in the running batch.
pub const RUNNING: Metric = engine("vllm:num_requests_running", Gauge, "Sequences in the running batch.");
/// Requests waiting to be scheduled.
pub const WAITING: Metric = engine("vllm:num_requests_waiting", Gauge, "Requests waiting to be scheduled.");
/// KV-cache usage, 0 to 1.
pub const KV_USAGE: Metric = engine("vllm:kv_cache_usage_perc", Gauge, "KV-cache usage, 0 to 1.");
/// [`KV_USAGE`] under vLLM's older name.
pub const KV_USAGE_LEGACY: Metric =
    engine("vllm:gpu_cache_usage_perc", Gauge, "KV-cache usage, 0 to 1 (vLLM's older name).");
/// Prompt tokens processed.
pub const PROMPT_TOKENS: Metric = engine("vllm:prompt_tokens_total", Counter, "Prompt tokens processed.");
/// Tokens generated.
pub const GENERATION_TOKENS: Metric = engine("vllm:generation_tokens_total", Counter, "Tokens generated.");
/// Sequences preempted because the KV pool ran out.
pub const PREEMPTIONS: Metric = engine(
    "vllm:num_preemptions_total",
    Counter,
    "Sequences preempted (KV cache freed, to be recomputed) because the KV pool ran out.",
);
/// Prompt tokens looked up in the prefix cache.
pub const PREFIX_QUERIES: Metric =
    engine("vllm:prefix_cache_queries_total", Counter, "Prompt tokens looked up in the prefix cache.");
/// Of those, tokens found (not computed again).
pub const PREFIX_HITS: Metric =
    engine("vllm:prefix_cache_hits_total", Counter, "Prompt tokens found in the prefix cache.");
/// Finished requests by `finished_reason` (`stop`, `length`, `abort`).
pub const REQUEST_SUCCESS: Metric =
    engine("vllm:request_success_total", Counter, "Finished requests by finish reason.");

// The engine: what vLLM lacks.
/// Prompt tokens not yet prefilled (the prefill work ahead).
pub const QUEUED_PROMPT_TOKENS: Metric = engine(
    "pacer_engine_queued_prompt_tokens",
    Gauge,
    "Prompt tokens not yet prefilled: waiting, preempted and partly prefilled requests.",
);
/// Rows per scheduler step.
pub const BATCH_SIZE: Metric = engine("pacer_engine_batch_size", Histogram, "Rows per scheduler step.");
/// Requests refused before scheduling, by `reason`.
pub const REJECTED: Metric =
    engine("pacer_engine_requests_rejected_total", Counter, "Requests refused before scheduling, by reason.");
/// The live settings as labels (value always 1).
pub const INFO: Metric = engine("pacer_engine_info", Gauge, "Live engine settings (value is always 1).");
/// A live batch setting as a number, by `setting`.
pub const SETTING: Metric = engine(
    "pacer_engine_setting",
    Gauge,
    "A live batch setting as a number (setting: max_batch_size, max_num_batched_tokens, batch_wait_ms, max_step_ms, prefill_hold_ms), for min/max over replicas.",
);

// The operator.
/// Reconciles by `result`.
pub const RECONCILES: Metric =
    operator("pacer_operator_reconciles_total", Counter, "Reconciles of InferenceServices by result");
/// Failed reconciles by error `kind`.
pub const RECONCILE_ERRORS: Metric =
    operator("pacer_operator_reconcile_errors_total", Counter, "Failed reconciles by error kind");
/// Time one reconcile takes.
pub const RECONCILE_DURATION: Metric =
    operator("pacer_operator_reconcile_duration_seconds", Histogram, "Time one reconcile takes");
/// Writes to the API server by `kind`.
pub const WRITES: Metric =
    operator("pacer_operator_writes_total", Counter, "Writes to the API server (applies, status) by kind");
/// Requests to the Kubernetes API by `method` and `resource`.
pub const API_REQUESTS: Metric = operator(
    "pacer_operator_api_requests_total",
    Counter,
    "Requests to the Kubernetes API by method and resource",
);
/// 1 while this replica holds the leader Lease.
pub const LEADER: Metric =
    operator("pacer_operator_leader", Gauge, "1 while this replica holds the leader Lease");
/// Planner decisions by `lever`, `direction` and `reason`.
pub const DECISIONS: Metric = operator(
    "pacer_operator_decisions_total",
    Counter,
    "Planner decisions that moved or recommended moving a lever",
);
/// 1 met, 0 violated, -1 unknown, per service.
pub const SLA_MET: Metric = operator(
    "pacer_operator_sla_met",
    Gauge,
    "1 when the InferenceService meets its SLA, 0 when violated, -1 when unknown",
);
/// The observed percentile by `dimension`, per service.
pub const OBSERVED_LATENCY: Metric = operator(
    "pacer_operator_observed_latency_seconds",
    Gauge,
    "The latency percentile the planner observed, by SLA dimension",
);
/// Failed ticks of the metrics source by `kind`.
pub const METRICS_SOURCE_ERRORS: Metric = operator(
    "pacer_operator_metrics_source_errors_total",
    Counter,
    "Failed ticks of the metrics source by kind",
);
/// The spec's SLA target by `dimension`, per service.
pub const SLA_TARGET: Metric = operator(
    "pacer_operator_sla_target_seconds",
    Gauge,
    "The SLA target of the InferenceService's spec, by dimension (ttft, itl, e2e)",
);
/// 1 while the planner is out of levers.
pub const SCALING_LIMITED: Metric = operator(
    "pacer_operator_scaling_limited",
    Gauge,
    "1 while the planner is out of levers (at replicas.max, no faster tier allowed), else 0",
);
/// 1 while a service runs below its preferred tier.
pub const BELOW_PREFERRED_TIER: Metric = operator(
    "pacer_operator_below_preferred_tier",
    Gauge,
    "1 while the InferenceService runs a tier other than its preferred one, else 0",
);

// Local mode's router.
/// Requests passed to a replica, by `replica` and `status`.
pub const ROUTER_REQUESTS: Metric =
    router("pacer_router_requests_total", Counter, "Requests passed to a replica, by replica and status.");
/// Requests in flight, by `replica`.
pub const ROUTER_OUTSTANDING: Metric =
    router("pacer_router_outstanding_requests", Gauge, "Requests in flight, by replica.");
/// Requests the router answered or cut itself, by `reason`.
pub const ROUTER_ERRORS: Metric = router(
    "pacer_router_errors_total",
    Counter,
    "Requests the router answered or cut itself: no_ready_replica (503), upstream (502), timeout (504, or a stream gone silent), stream_broken.",
);
/// Replicas requests may go to.
pub const ROUTER_READY: Metric = router("pacer_router_ready_replicas", Gauge, "Replicas requests may go to.");

// The recording rules.
/// TTFT percentiles over 5 m, by `quantile`, per service.
pub const RECORDED_TTFT: Metric =
    recorded("inferenceservice:ttft_seconds:quantile_rate5m", "TTFT percentiles over 5 m, by quantile.");
/// ITL percentiles over 5 m.
pub const RECORDED_ITL: Metric =
    recorded("inferenceservice:itl_seconds:quantile_rate5m", "ITL percentiles over 5 m, by quantile.");
/// E2E percentiles over 5 m.
pub const RECORDED_E2E: Metric =
    recorded("inferenceservice:e2e_seconds:quantile_rate5m", "E2E percentiles over 5 m, by quantile.");
/// Finished requests per second over 5 m.
pub const RECORDED_REQUESTS: Metric =
    recorded("inferenceservice:requests:rate5m", "Finished requests per second over 5 m.");
/// Prompt tokens per second over 5 m.
pub const RECORDED_PROMPT_TOKENS: Metric =
    recorded("inferenceservice:prompt_tokens:rate5m", "Prompt tokens per second over 5 m.");
/// Generated tokens per second over 5 m.
pub const RECORDED_GENERATION_TOKENS: Metric =
    recorded("inferenceservice:generation_tokens:rate5m", "Generated tokens per second over 5 m.");
/// P99 TTFT averaged over a day (the baseline alert's reference).
pub const RECORDED_TTFT_P99_DAY: Metric =
    recorded("inferenceservice:ttft_seconds:p99_avg1d", "P99 TTFT averaged over one day.");
/// Generated tokens per second averaged over a day.
pub const RECORDED_GENERATION_TOKENS_DAY: Metric = recorded(
    "inferenceservice:generation_tokens:rate5m_avg1d",
    "Generated tokens per second averaged over one day.",
);

/// Every metric of the contract.
pub const ALL: &[Metric] = &[
    TTFT,
    ITL,
    ITL_LEGACY,
    TPOT,
    E2E,
    QUEUE_TIME,
    PREFILL_TIME,
    DECODE_TIME,
    PROMPT_LENGTH,
    GENERATION_LENGTH,
    RUNNING,
    WAITING,
    KV_USAGE,
    KV_USAGE_LEGACY,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREEMPTIONS,
    PREFIX_QUERIES,
    PREFIX_HITS,
    REQUEST_SUCCESS,
    QUEUED_PROMPT_TOKENS,
    BATCH_SIZE,
    REJECTED,
    INFO,
    SETTING,
    RECONCILES,
    RECONCILE_ERRORS,
    RECONCILE_DURATION,
    WRITES,
    API_REQUESTS,
    LEADER,
    DECISIONS,
    SLA_MET,
    OBSERVED_LATENCY,
    METRICS_SOURCE_ERRORS,
    SLA_TARGET,
    SCALING_LIMITED,
    BELOW_PREFERRED_TIER,
    ROUTER_REQUESTS,
    ROUTER_OUTSTANDING,
    ROUTER_ERRORS,
    ROUTER_READY,
    RECORDED_TTFT,
    RECORDED_ITL,
    RECORDED_E2E,
    RECORDED_REQUESTS,
    RECORDED_PROMPT_TOKENS,
    RECORDED_GENERATION_TOKENS,
    RECORDED_TTFT_P99_DAY,
    RECORDED_GENERATION_TOKENS_DAY,
];

/// The metric named `name` (a histogram's `_bucket`, `_sum` and `_count` series name it too).
pub fn named(name: &str) -> Option<&'static Metric> {
    ALL.iter().find(|m| m.name == name).or_else(|| {
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s))?;
        ALL.iter().find(|m| m.name == base && m.kind == Histogram)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_follow_the_conventions() {
        let mut names: Vec<_> = ALL.iter().map(|m| m.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name is listed twice");
        for m in ALL {
            let prefix_ok = match m.source {
                Source::Engine => m.name.starts_with("vllm:") || m.name.starts_with("pacer_engine_"),
                Source::Operator => m.name.starts_with("pacer_operator_"),
                Source::Recorded => m.name.starts_with("inferenceservice:"),
                Source::Router => m.name.starts_with("pacer_router_"),
            };
            assert!(prefix_ok, "{} does not carry its source's prefix", m.name);
            assert_eq!(m.kind == Counter, m.name.ends_with("_total"), "{}: counters end in _total", m.name);
            assert!(!m.help.is_empty(), "{} has no help", m.name);
        }
    }

    #[test]
    fn histogram_series_resolve_to_their_metric() {
        assert_eq!(named("vllm:time_to_first_token_seconds_bucket"), Some(&TTFT));
        assert_eq!(named("vllm:e2e_request_latency_seconds_count"), Some(&E2E));
        assert_eq!(named("vllm:num_requests_running_count"), None, "a gauge has no _count series");
        assert_eq!(named("vllm:unknown"), None);
    }
}
