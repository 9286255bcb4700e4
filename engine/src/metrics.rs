//! The engine's Prometheus metrics, under vLLM's names (so existing dashboards, routers and
//! autoscalers work unchanged) plus `pacer_engine_*` for what vLLM lacks. Every series carries
//! `model_name`. Latency buckets add 1–5 ms steps below vLLM's, which CPU-scale inter-token
//! latencies need.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use pacer_engine_api::buckets::{
    BATCH as BATCH_BUCKETS, ITL as ITL_BUCKETS, REQUEST as REQUEST_BUCKETS, TOKENS as TOKEN_BUCKETS,
    TTFT as TTFT_BUCKETS,
};
use pacer_engine_api::metrics::{self as names, MODEL_NAME_LABEL, Metric};

/// All metrics of one engine process.
#[derive(Clone)]
pub struct EngineMetrics {
    registry: Registry,
    /// Request accepted → first token handed to the response stream.
    pub ttft: Histogram,
    /// Gap between consecutive tokens of a sequence.
    pub itl: Histogram,
    itl_legacy: Histogram,
    /// Per request: decode time / (N − 1).
    pub tpot: Histogram,
    /// Request accepted → last token.
    pub e2e: Histogram,
    /// Request accepted → first scheduled.
    pub queue_time: Histogram,
    /// First scheduled → first token.
    pub prefill_time: Histogram,
    /// First token → last token.
    pub decode_time: Histogram,
    /// Prompt length per request.
    pub prompt_len: Histogram,
    /// Generated length per request.
    pub generation_len: Histogram,
    /// Sequences in the running batch.
    pub running: IntGauge,
    /// Requests waiting to be scheduled.
    pub waiting: IntGauge,
    /// `pacer_engine_queued_prompt_tokens`: prompt tokens not yet prefilled, of waiting,
    /// preempted and partly prefilled sequences (the prefill work ahead; vLLM has no such gauge).
    pub queued_prompt_tokens: IntGauge,
    kv_usage: Gauge,
    kv_usage_legacy: Gauge,
    /// Prompt tokens processed.
    pub prompt_tokens: IntCounter,
    /// Tokens generated.
    pub generation_tokens: IntCounter,
    /// `vllm:num_preemptions_total`: sequences preempted because the KV pool ran out.
    pub preemptions: IntCounter,
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up in the prefix cache.
    pub prefix_queries: IntCounter,
    /// `vllm:prefix_cache_hits_total`: of those, tokens found (not computed again).
    pub prefix_hits: IntCounter,
    success: IntCounterVec,
    /// Rows per scheduler step.
    pub batch_size: Histogram,
    rejected: IntCounterVec,
    info: IntGaugeVec,
    /// The live batch settings as numbers: the operator reads what the engines applied.
    setting: IntGaugeVec,
    model_name: String,
}

impl std::fmt::Debug for EngineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineMetrics").field("model_name", &self.model_name).finish_non_exhaustive()
    }
}

fn histogram(registry: &Registry, metric: Metric, buckets: &[f64], model: &str) -> Histogram {
    let Metric { name, help, .. } = metric;
    let vec = prometheus::HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &[MODEL_NAME_LABEL],
    )
    .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry.register(Box::new(vec.clone())).unwrap_or_else(|e| panic!("register {name}: {e}"));
    vec.with_label_values(&[model])
}

fn counter(registry: &Registry, metric: Metric, model: &str) -> IntCounter {
    let Metric { name, help, .. } = metric;
    let vec = IntCounterVec::new(Opts::new(name, help), &[MODEL_NAME_LABEL])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    registry.register(Box::new(vec.clone())).unwrap_or_else(|e| panic!("register {name}: {e}"));
    vec.with_label_values(&[model])
}

fn int_gauge(registry: &Registry, metric: Metric, model: &str) -> IntGauge {
    let Metric { name, help, .. } = metric;
    let vec = IntGaugeVec::new(Opts::new(name, help), &[MODEL_NAME_LABEL])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    registry.register(Box::new(vec.clone())).unwrap_or_else(|e| panic!("register {name}: {e}"));
    vec.with_label_values(&[model])
}

fn gauge(registry: &Registry, metric: Metric, model: &str) -> Gauge {
    let Metric { name, help, .. } = metric;
    let vec = prometheus::GaugeVec::new(Opts::new(name, help), &[MODEL_NAME_LABEL])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    registry.register(Box::new(vec.clone())).unwrap_or_else(|e| panic!("register {name}: {e}"));
    vec.with_label_values(&[model])
}

impl EngineMetrics {
    /// Registers every metric for `model_name`. Names are static and valid, so a failure here
    /// is a programming error (and panics at start-up, never later).
    pub fn new(model_name: &str) -> Self {
        let r = Registry::new();
        let m = model_name;
        let success = IntCounterVec::new(
            Opts::new(names::REQUEST_SUCCESS.name, names::REQUEST_SUCCESS.help),
            &[MODEL_NAME_LABEL, "finished_reason"],
        )
        .unwrap_or_else(|e| panic!("success: {e}"));
        r.register(Box::new(success.clone())).unwrap_or_else(|e| panic!("register success: {e}"));
        // Every finish reason exists from the start at 0, as vLLM's do: an idle engine then
        // reports a request rate of 0, not no rate, and `increase()` counts the first request.
        for reason in ["stop", "length", "abort"] {
            success.with_label_values(&[m, reason]);
        }
        let rejected = IntCounterVec::new(
            Opts::new(names::REJECTED.name, names::REJECTED.help),
            &[MODEL_NAME_LABEL, "reason"],
        )
        .unwrap_or_else(|e| panic!("rejected: {e}"));
        r.register(Box::new(rejected.clone())).unwrap_or_else(|e| panic!("register rejected: {e}"));
        let info = IntGaugeVec::new(
            Opts::new(names::INFO.name, names::INFO.help),
            &[
                MODEL_NAME_LABEL,
                "tier",
                "max_batch_size",
                "batch_wait_ms",
                "max_num_batched_tokens",
                "version",
            ],
        )
        .unwrap_or_else(|e| panic!("info: {e}"));
        r.register(Box::new(info.clone())).unwrap_or_else(|e| panic!("register info: {e}"));
        let setting = IntGaugeVec::new(
            Opts::new(names::SETTING.name, names::SETTING.help),
            &[MODEL_NAME_LABEL, "setting"],
        )
        .unwrap_or_else(|e| panic!("setting: {e}"));
        r.register(Box::new(setting.clone())).unwrap_or_else(|e| panic!("register setting: {e}"));
        EngineMetrics {
            ttft: histogram(&r, names::TTFT, TTFT_BUCKETS, m),
            itl: histogram(&r, names::ITL, ITL_BUCKETS, m),
            itl_legacy: histogram(&r, names::ITL_LEGACY, ITL_BUCKETS, m),
            tpot: histogram(&r, names::TPOT, ITL_BUCKETS, m),
            e2e: histogram(&r, names::E2E, REQUEST_BUCKETS, m),
            queue_time: histogram(&r, names::QUEUE_TIME, REQUEST_BUCKETS, m),
            prefill_time: histogram(&r, names::PREFILL_TIME, REQUEST_BUCKETS, m),
            decode_time: histogram(&r, names::DECODE_TIME, REQUEST_BUCKETS, m),
            prompt_len: histogram(&r, names::PROMPT_LENGTH, TOKEN_BUCKETS, m),
            generation_len: histogram(&r, names::GENERATION_LENGTH, TOKEN_BUCKETS, m),
            running: int_gauge(&r, names::RUNNING, m),
            waiting: int_gauge(&r, names::WAITING, m),
            queued_prompt_tokens: int_gauge(&r, names::QUEUED_PROMPT_TOKENS, m),
            kv_usage: gauge(&r, names::KV_USAGE, m),
            kv_usage_legacy: gauge(&r, names::KV_USAGE_LEGACY, m),
            prompt_tokens: counter(&r, names::PROMPT_TOKENS, m),
            generation_tokens: counter(&r, names::GENERATION_TOKENS, m),
            preemptions: counter(&r, names::PREEMPTIONS, m),
            prefix_queries: counter(&r, names::PREFIX_QUERIES, m),
            prefix_hits: counter(&r, names::PREFIX_HITS, m),
            batch_size: histogram(&r, names::BATCH_SIZE, BATCH_BUCKETS, m),
            success,
            rejected,
            info,
            setting,
            registry: r,
            model_name: model_name.to_string(),
        }
    }

    /// Records one inter-token gap under both of vLLM's names.
    pub fn observe_itl(&self, seconds: f64) {
        self.itl.observe(seconds);
        self.itl_legacy.observe(seconds);
    }

    /// Sets the KV-cache usage gauges.
    pub fn set_kv_usage(&self, fraction: f64) {
        self.kv_usage.set(fraction);
        self.kv_usage_legacy.set(fraction);
    }

    /// Counts a finished request by reason (`stop`, `length`, `abort`).
    pub fn finished(&self, reason: &str) {
        self.success.with_label_values(&[&self.model_name, reason]).inc();
    }

    /// Counts a refused request by reason (`queue_full`, `draining`, `invalid`, ...).
    pub fn rejected(&self, reason: &str) {
        self.rejected.with_label_values(&[&self.model_name, reason]).inc();
    }

    /// Publishes the live settings: the info gauge (one series at a time) and each setting as a
    /// number (`pacer_engine_setting`).
    pub fn set_info(&self, tier: &str, settings: &crate::scheduler::BatchSettings) {
        self.info.reset();
        let (mb, bw, bt) = (
            settings.max_batch_size.to_string(),
            settings.batch_wait_ms.to_string(),
            settings.max_num_batched_tokens.to_string(),
        );
        self.info
            .with_label_values(&[&self.model_name, tier, &mb, &bw, &bt, env!("CARGO_PKG_VERSION")])
            .set(1);
        let number = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for (name, value) in [
            ("max_batch_size", settings.max_batch_size as u64),
            ("max_num_batched_tokens", settings.max_num_batched_tokens as u64),
            ("batch_wait_ms", settings.batch_wait_ms),
            ("max_step_ms", settings.max_step_ms),
            ("prefill_hold_ms", settings.prefill_hold_ms),
        ] {
            self.setting.with_label_values(&[&self.model_name, name]).set(number(value));
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_vllm_names_with_the_model_label() {
        let m = EngineMetrics::new("smol");
        m.ttft.observe(0.003);
        m.observe_itl(0.002);
        m.finished("stop");
        m.rejected("queue_full");
        m.set_info(
            "q4_0",
            &crate::scheduler::BatchSettings {
                max_batch_size: 8,
                batch_wait_ms: 5,
                max_num_batched_tokens: 256,
                max_step_ms: 80,
                prefill_hold_ms: 250,
            },
        );
        let text = m.render();
        for name in [
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\",le=\"0.005\"} 1",
            "vllm:inter_token_latency_seconds_count{model_name=\"smol\"} 1",
            "vllm:time_per_output_token_seconds_count{model_name=\"smol\"} 1",
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"smol\"} 1",
            "pacer_engine_requests_rejected_total{model_name=\"smol\",reason=\"queue_full\"} 1",
            "pacer_engine_info{batch_wait_ms=\"5\",max_batch_size=\"8\",max_num_batched_tokens=\"256\",model_name=\"smol\",tier=\"q4_0\"",
            "pacer_engine_setting{model_name=\"smol\",setting=\"max_batch_size\"} 8",
            "pacer_engine_setting{model_name=\"smol\",setting=\"max_num_batched_tokens\"} 256",
            "pacer_engine_setting{model_name=\"smol\",setting=\"batch_wait_ms\"} 5",
            "pacer_engine_setting{model_name=\"smol\",setting=\"max_step_ms\"} 80",
            "pacer_engine_setting{model_name=\"smol\",setting=\"prefill_hold_ms\"} 250",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn every_finish_reason_starts_at_zero() {
        let text = EngineMetrics::new("smol").render();
        for reason in ["stop", "length", "abort"] {
            let line =
                format!("vllm:request_success_total{{finished_reason=\"{reason}\",model_name=\"smol\"}} 0");
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
    }
}
