//! The PromQL the Prometheus source sends, and how its answers become [`ServiceMetrics`]. Pure:
//! no client, no clock, so the query plan and the result mapping are unit-tested.
//!
//! Every query aggregates `by (namespace, inferenceservice)` and selects no service, so one
//! query answers for every InferenceService: a tick sends one query per metric per distinct
//! (percentile, window) group, however many services there are.

use super::{ServiceKey, WindowRequest};
use crate::planner::observation::SHORT_RATE_WINDOW;
use crate::planner::{AppliedSettings, Freshness, Quantile, ServiceMetrics, Span};
use pacer_engine_api::metrics as names;
use std::collections::{BTreeMap, BTreeSet};

/// The labels every query groups by (set by the scrape config's relabelling, `docs/metrics.md`).
pub const GROUP_LABELS: &str = "namespace, inferenceservice";

/// The scrape job whose series the planner reads: `config/prometheus/prometheus.yaml`'s engine
/// job, and the job label the PodMonitors the operator writes set. Any other job's series are
/// ignored, so a pod scraped by another job (one that honours the labels it exposes) cannot
/// publish series of the engines' metric names under another service's name and steer its
/// scaling.
pub const ENGINE_JOB: &str = "pacer-engines";

/// `metric` restricted to the engine job.
fn engine(metric: &str) -> String {
    format!("{metric}{{job=\"{ENGINE_JOB}\"}}")
}

/// vLLM's TTFT histogram (the engine exports the same name).
pub const TTFT: &str = names::TTFT.name;
/// vLLM's inter-token latency histogram.
pub const ITL: &str = names::ITL.name;
/// vLLM's end-to-end request latency histogram.
pub const E2E: &str = names::E2E.name;

/// Which latency histogram a percentile or sample count is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Latency {
    /// Time to first token.
    Ttft,
    /// Inter-token latency.
    Itl,
    /// End-to-end latency.
    E2e,
}

impl Latency {
    /// All three, in the order of [`ServiceMetrics`].
    pub const ALL: [Latency; 3] = [Latency::Ttft, Latency::Itl, Latency::E2e];

    /// The histogram's metric name.
    pub fn metric(self) -> &'static str {
        match self {
            Latency::Ttft => TTFT,
            Latency::Itl => ITL,
            Latency::E2e => E2E,
        }
    }
}

/// What one query measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Measure {
    /// A percentile of a latency histogram over a window.
    Quantile {
        /// Which histogram.
        latency: Latency,
        /// The quantile in millionths (950000 = P95), so it can key a map.
        quantile_ppm: u64,
        /// The window in milliseconds.
        window_ms: u64,
    },
    /// MetricsReading of a latency histogram in a window (`increase` of `_count`).
    Samples {
        /// Which histogram.
        latency: Latency,
        /// The window in milliseconds.
        window_ms: u64,
    },
    /// Finished requests per second.
    RequestRate {
        /// The rate window in milliseconds.
        window_ms: u64,
    },
    /// Prompt length at a quantile over the SLA window.
    PromptTokensQuantile {
        /// The quantile in millionths.
        quantile_ppm: u64,
        /// The window in milliseconds.
        window_ms: u64,
    },
    /// Prompt tokens per second.
    PromptTokenRate {
        /// The rate window in milliseconds.
        window_ms: u64,
    },
    /// Generated tokens per second.
    OutputTokenRate {
        /// The rate window in milliseconds.
        window_ms: u64,
    },
    /// Running sequences, summed over replicas.
    Running,
    /// Running sequences averaged over the rate window, summed over replicas.
    RunningMean {
        /// The rate window in milliseconds.
        window_ms: u64,
    },
    /// Waiting requests, summed over replicas.
    Waiting,
    /// Prompt tokens not yet prefilled, summed over replicas (Pacer's engine only).
    QueuedPromptTokens,
    /// KV-cache usage, averaged over replicas.
    KvUsage,
    /// Scrape targets (replicas) that report the engine's gauges.
    Replicas,
    /// A live batch setting the engines report (`pacer_engine_setting`), least or greatest
    /// over replicas.
    Applied {
        /// Which setting.
        setting: Setting,
        /// The greatest (else the least).
        greatest: bool,
    },
    /// Unix time of the newest sample.
    NewestSample,
}

/// A batch setting the engine reports as a number (`pacer_engine_setting{setting}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Setting {
    /// `max_batch_size`.
    MaxBatchSize,
    /// `max_num_batched_tokens`.
    MaxNumBatchedTokens,
    /// `batch_wait_ms`.
    BatchWaitMs,
}

impl Setting {
    /// All three.
    pub const ALL: [Setting; 3] = [Setting::MaxBatchSize, Setting::MaxNumBatchedTokens, Setting::BatchWaitMs];

    /// The `setting` label's value.
    pub fn label(self) -> &'static str {
        match self {
            Setting::MaxBatchSize => "max_batch_size",
            Setting::MaxNumBatchedTokens => "max_num_batched_tokens",
            Setting::BatchWaitMs => "batch_wait_ms",
        }
    }
}

/// One PromQL query and what it measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// What the answer means.
    pub measure: Measure,
    /// The PromQL text.
    pub promql: String,
}

/// A PromQL range duration: whole seconds when exact, milliseconds otherwise.
pub fn duration(ms: u64) -> String {
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

/// A quantile in millionths, as a PromQL number (`950000` → `0.95`, `999000` → `0.999`).
pub fn quantile_text(ppm: u64) -> String {
    let text = format!("{}.{:06}", ppm / 1_000_000, ppm % 1_000_000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The PromQL for `measure`.
pub fn promql(measure: Measure) -> String {
    let g = GROUP_LABELS;
    match measure {
        Measure::Quantile { latency, quantile_ppm, window_ms } => format!(
            "histogram_quantile({}, sum by ({g}, le) (rate({}[{}])))",
            quantile_text(quantile_ppm),
            engine(&format!("{}_bucket", latency.metric())),
            duration(window_ms)
        ),
        Measure::Samples { latency, window_ms } => format!(
            "sum by ({g}) (increase({}[{}]))",
            engine(&format!("{}_count", latency.metric())),
            duration(window_ms)
        ),
        Measure::RequestRate { window_ms } => {
            format!("sum by ({g}) (rate({}[{}]))", engine(names::REQUEST_SUCCESS.name), duration(window_ms))
        }
        Measure::PromptTokensQuantile { quantile_ppm, window_ms } => format!(
            "histogram_quantile({}, sum by ({g}, le) (rate({}[{}])))",
            quantile_text(quantile_ppm),
            engine(&format!("{}_bucket", names::PROMPT_LENGTH.name)),
            duration(window_ms)
        ),
        Measure::PromptTokenRate { window_ms } => {
            format!("sum by ({g}) (rate({}[{}]))", engine(names::PROMPT_TOKENS.name), duration(window_ms))
        }
        Measure::OutputTokenRate { window_ms } => {
            format!("sum by ({g}) (rate({}[{}]))", engine(names::GENERATION_TOKENS.name), duration(window_ms))
        }
        Measure::Running => format!("sum by ({g}) ({})", engine(names::RUNNING.name)),
        Measure::RunningMean { window_ms } => {
            format!("sum by ({g}) (avg_over_time({}[{}]))", engine(names::RUNNING.name), duration(window_ms))
        }
        Measure::Waiting => format!("sum by ({g}) ({})", engine(names::WAITING.name)),
        Measure::QueuedPromptTokens => {
            format!("sum by ({g}) ({})", engine(names::QUEUED_PROMPT_TOKENS.name))
        }
        Measure::KvUsage => format!("avg by ({g}) ({})", engine(names::KV_USAGE.name)),
        // One series per scrape target (vLLM adds an `engine` label per engine core; a pod is
        // one target), counted per service. A target that stops answering gets staleness
        // markers, so it drops out here at the next scrape.
        Measure::Replicas => {
            format!("count by ({g}) (max by ({g}, instance) ({}))", engine(names::RUNNING.name))
        }
        Measure::Applied { setting, greatest } => format!(
            "{} by ({g}) ({}{{job=\"{ENGINE_JOB}\",setting=\"{}\"}})",
            if greatest { "max" } else { "min" },
            names::SETTING.name,
            setting.label()
        ),
        Measure::NewestSample => {
            format!("max by ({g}) (timestamp({}))", engine(names::RUNNING.name))
        }
    }
}

/// The (quantile, window, rate window) of one request, as map keys.
fn keys(request: &WindowRequest) -> (u64, u64, u64) {
    let ms = |seconds: f64| (seconds.max(0.0) * 1000.0).round() as u64;
    ((request.quantile.clamp(0.0, 1.0) * 1e6).round() as u64, ms(request.window), ms(request.rate_window))
}

/// The short rate window of one request, in milliseconds: the planner's leading rate.
fn short_key(request: &WindowRequest) -> u64 {
    (SHORT_RATE_WINDOW.min(request.rate_window).max(0.0) * 1000.0).round() as u64
}

/// Every query one tick needs for `requests`: per distinct (quantile, window) the three
/// percentiles, per distinct window the three sample counts, per distinct rate window the three
/// rates (and the short request rate), per distinct (percentile, window) the prompt length's
/// percentile, and the six gauges and the three live settings' least and greatest once. Sorted
/// and free of duplicates.
pub fn plan(requests: &[WindowRequest]) -> Vec<Query> {
    let mut measures = BTreeSet::new();
    for request in requests {
        let (quantile_ppm, window_ms, rate_ms) = keys(request);
        for latency in Latency::ALL {
            measures.insert(Measure::Quantile { latency, quantile_ppm, window_ms });
            measures.insert(Measure::Samples { latency, window_ms });
        }
        measures.insert(Measure::RequestRate { window_ms: rate_ms });
        measures.insert(Measure::RequestRate { window_ms: short_key(request) });
        measures.insert(Measure::PromptTokenRate { window_ms: rate_ms });
        measures.insert(Measure::PromptTokensQuantile { quantile_ppm, window_ms });
        measures.insert(Measure::OutputTokenRate { window_ms: rate_ms });
        measures.insert(Measure::RunningMean { window_ms: rate_ms });
    }
    if !requests.is_empty() {
        measures.extend([
            Measure::Running,
            Measure::Waiting,
            Measure::QueuedPromptTokens,
            Measure::KvUsage,
            Measure::Replicas,
            Measure::NewestSample,
        ]);
        for setting in Setting::ALL {
            measures.extend([false, true].map(|greatest| Measure::Applied { setting, greatest }));
        }
    }
    measures.into_iter().map(|measure| Query { measure, promql: promql(measure) }).collect()
}

/// The answers of one tick: per measure, the value of each service that has a series.
pub type Answers = BTreeMap<Measure, BTreeMap<ServiceKey, f64>>;

/// Builds each requested service's freshness and metrics from `answers`, evaluated at `now`
/// (unix seconds); samples older than `staleness` seconds make the service stale.
///
/// No series for a service means [`Freshness::Missing`]; so does any implausible answer
/// (infinite, negative, beyond [`IMPLAUSIBLE`]): garbage never reaches a decision. NaN values
/// are missing values, never zeros; a percentile on fewer than [`crate::planner::MIN_SAMPLES`] observations
/// is [`Quantile::TooFewSamples`].
pub fn assemble(
    requests: &[WindowRequest],
    answers: &Answers,
    now: f64,
    staleness: f64,
) -> BTreeMap<ServiceKey, (Freshness, ServiceMetrics)> {
    let value = |measure: Measure, key: &ServiceKey| -> Option<f64> {
        answers.get(&measure).and_then(|m| m.get(key)).copied().filter(|v| v.is_finite())
    };
    let mut out = BTreeMap::new();
    for request in requests {
        let key = &request.service;
        if let Some((measure, v)) = implausible(answers, key) {
            let reason = format!(
                "Prometheus answered {v} for {measure:?} of {}/{}, which no engine can report: holding",
                key.namespace, key.name
            );
            out.insert(key.clone(), (Freshness::Missing { reason }, ServiceMetrics::missing()));
            continue;
        }
        let Some(newest) = value(Measure::NewestSample, key) else {
            let reason = format!(
                "Prometheus has no engine series for {}/{} (namespace and inferenceservice labels)",
                key.namespace, key.name
            );
            out.insert(key.clone(), (Freshness::Missing { reason }, ServiceMetrics::missing()));
            continue;
        };
        let (quantile_ppm, window_ms, rate_ms) = keys(request);
        let quantile = |latency: Latency| {
            Quantile::from_parts(
                value(Measure::Quantile { latency, quantile_ppm, window_ms }, key),
                value(Measure::Samples { latency, window_ms }, key),
            )
        };
        let metrics = ServiceMetrics {
            ttft: quantile(Latency::Ttft),
            itl: quantile(Latency::Itl),
            e2e: quantile(Latency::E2e),
            request_rate: value(Measure::RequestRate { window_ms: rate_ms }, key),
            request_rate_short: value(Measure::RequestRate { window_ms: short_key(request) }, key),
            prompt_token_rate: value(Measure::PromptTokenRate { window_ms: rate_ms }, key),
            prompt_tokens_tail: value(Measure::PromptTokensQuantile { quantile_ppm, window_ms }, key),
            output_token_rate: value(Measure::OutputTokenRate { window_ms: rate_ms }, key),
            running: value(Measure::Running, key),
            running_mean: value(Measure::RunningMean { window_ms: rate_ms }, key),
            waiting: value(Measure::Waiting, key),
            queued_prompt_tokens: value(Measure::QueuedPromptTokens, key),
            kv_usage: value(Measure::KvUsage, key),
            reporting_replicas: value(Measure::Replicas, key),
            applied: {
                let span = |setting| {
                    Span::of(
                        value(Measure::Applied { setting, greatest: false }, key),
                        value(Measure::Applied { setting, greatest: true }, key),
                    )
                };
                AppliedSettings {
                    max_batch_size: span(Setting::MaxBatchSize),
                    max_num_batched_tokens: span(Setting::MaxNumBatchedTokens),
                    batch_wait_ms: span(Setting::BatchWaitMs),
                }
            },
        };
        let age = (now - newest).max(0.0);
        let freshness = if age > staleness { Freshness::Stale { age } } else { Freshness::Fresh };
        out.insert(key.clone(), (freshness, metrics));
    }
    out
}

/// Above this, no measure of an engine is plausible (latencies in seconds, rates, counts,
/// and sample timestamps in unix seconds alike).
pub const IMPLAUSIBLE: f64 = 1e12;

/// The first answer for `key` that no engine can produce: infinite, negative or beyond
/// [`IMPLAUSIBLE`]. NaN is not among them: it is what PromQL answers for a window without
/// observations, and reads as a missing value.
fn implausible(answers: &Answers, key: &ServiceKey) -> Option<(Measure, f64)> {
    answers.iter().find_map(|(measure, by_service)| {
        let v = *by_service.get(key)?;
        (!v.is_nan() && !(0.0..=IMPLAUSIBLE).contains(&v)).then_some((*measure, v))
    })
}

/// Every requested service as [`Freshness::Missing`] with `reason` (the source failed).
pub fn all_missing(
    requests: &[WindowRequest],
    reason: &str,
) -> BTreeMap<ServiceKey, (Freshness, ServiceMetrics)> {
    requests
        .iter()
        .map(|r| {
            (
                r.service.clone(),
                (Freshness::Missing { reason: reason.to_string() }, ServiceMetrics::missing()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ns: &str, name: &str, quantile: f64, window: f64) -> WindowRequest {
        WindowRequest { service: ServiceKey::new(ns, name), quantile, window, rate_window: 60.0 }
    }

    #[test]
    fn the_query_count_does_not_grow_with_the_services() {
        let one = plan(&[request("a", "s0", 0.95, 300.0)]);
        let many: Vec<_> =
            (0..500).map(|i| request(&format!("ns{}", i % 7), &format!("s{i}"), 0.95, 300.0)).collect();
        assert_eq!(plan(&many), one);
        // 3 percentiles + 3 sample counts + 3 rates + the short request rate + the prompt
        // length's percentile + the running gauge's mean over the rate window + 6 gauges + 3
        // settings' least and greatest.
        assert_eq!(one.len(), 24);
        // A second percentile on the same window adds its 3 percentiles and its prompt-length
        // percentile; a second window adds those 4 and 3 counts.
        let two_q = plan(&[request("a", "x", 0.95, 300.0), request("a", "y", 0.99, 300.0)]);
        assert_eq!(two_q.len(), 28);
        let two_w = plan(&[request("a", "x", 0.95, 300.0), request("a", "y", 0.95, 120.0)]);
        assert_eq!(two_w.len(), 31);
        assert!(plan(&[]).is_empty());
    }

    #[test]
    fn queries_group_by_service_and_match_the_metric_contract() {
        let queries = plan(&[request("a", "x", 0.95, 300.0)]);
        let text: Vec<&str> = queries.iter().map(|q| q.promql.as_str()).collect();
        assert!(text.contains(
            &"sum by (namespace, inferenceservice) \
              (avg_over_time(vllm:num_requests_running{job=\"pacer-engines\"}[60s]))"
        ));
        assert!(text.contains(
            &"histogram_quantile(0.95, sum by (namespace, inferenceservice, le) \
              (rate(vllm:time_to_first_token_seconds_bucket{job=\"pacer-engines\"}[300s])))"
        ));
        assert!(text.contains(
            &"sum by (namespace, inferenceservice) \
              (increase(vllm:inter_token_latency_seconds_count{job=\"pacer-engines\"}[300s]))"
        ));
        assert!(text.contains(
            &"sum by (namespace, inferenceservice) (rate(vllm:request_success_total{job=\"pacer-engines\"}[60s]))"
        ));
        assert!(text.contains(
            &"avg by (namespace, inferenceservice) (vllm:kv_cache_usage_perc{job=\"pacer-engines\"})"
        ));
        // Every series read is the engine job's: another job's cannot speak for a service.
        assert!(text.iter().all(|q| q.contains("{job=\"pacer-engines\"")), "{text:?}");
        assert!(text.contains(
            &"max by (namespace, inferenceservice) (pacer_engine_setting{job=\"pacer-engines\",setting=\"max_batch_size\"})"
        ));
        assert!(text.iter().all(|q| q.contains("by (namespace, inferenceservice")));
    }

    #[test]
    fn quantiles_and_durations_print_as_promql() {
        assert_eq!(quantile_text(950_000), "0.95");
        assert_eq!(quantile_text(999_000), "0.999");
        assert_eq!(quantile_text(1_000_000), "1");
        assert_eq!(quantile_text(500_000), "0.5");
        assert_eq!(duration(300_000), "300s");
        assert_eq!(duration(1_500), "1500ms");
        let r = request("a", "x", 99.9 / 100.0, 30.0);
        assert_eq!(keys(&r).0, 999_000);
    }

    fn answers(entries: &[(Measure, &str, f64)]) -> Answers {
        let mut a = Answers::new();
        for (m, name, v) in entries {
            a.entry(*m).or_default().insert(ServiceKey::new("ns", *name), *v);
        }
        a
    }

    #[test]
    fn answers_map_to_services_with_explicit_missing_states() {
        let reqs = [
            request("ns", "busy", 0.95, 300.0),
            request("ns", "idle", 0.95, 300.0),
            request("ns", "gone", 0.95, 300.0),
        ];
        let q = |latency| Measure::Quantile { latency, quantile_ppm: 950_000, window_ms: 300_000 };
        let n = |latency| Measure::Samples { latency, window_ms: 300_000 };
        let a = answers(&[
            (q(Latency::Ttft), "busy", 0.4),
            (n(Latency::Ttft), "busy", 120.0),
            (q(Latency::Itl), "busy", 0.03),
            (n(Latency::Itl), "busy", 4000.0),
            // E2E: a NaN percentile on enough samples is missing, not zero.
            (q(Latency::E2e), "busy", f64::NAN),
            (n(Latency::E2e), "busy", 120.0),
            (Measure::RequestRate { window_ms: 60_000 }, "busy", 2.0),
            (Measure::Running, "busy", 5.0),
            (Measure::RunningMean { window_ms: 60_000 }, "busy", 3.5),
            (Measure::Replicas, "busy", 2.0),
            (Measure::NewestSample, "busy", 1000.0),
            // Mid-rollout of a batch change: one replica runs 8, the other 16.
            (Measure::Applied { setting: Setting::MaxBatchSize, greatest: false }, "busy", 8.0),
            (Measure::Applied { setting: Setting::MaxBatchSize, greatest: true }, "busy", 16.0),
            (Measure::Applied { setting: Setting::MaxNumBatchedTokens, greatest: false }, "busy", 512.0),
            (Measure::Applied { setting: Setting::MaxNumBatchedTokens, greatest: true }, "busy", 512.0),
            // Idle: series exist, no traffic in the window.
            (q(Latency::Ttft), "idle", f64::NAN),
            (n(Latency::Ttft), "idle", 0.0),
            (Measure::RequestRate { window_ms: 60_000 }, "idle", 0.0),
            (Measure::NewestSample, "idle", 900.0),
        ]);
        let out = assemble(&reqs, &a, 1001.0, 60.0);
        let (fresh, busy) = &out[&ServiceKey::new("ns", "busy")];
        assert_eq!(*fresh, Freshness::Fresh);
        assert_eq!(busy.ttft, Quantile::Value { seconds: 0.4, samples: 120.0 });
        assert_eq!(busy.itl.seconds(), Some(0.03));
        assert_eq!(busy.e2e, Quantile::Missing);
        assert_eq!((busy.request_rate, busy.running, busy.waiting), (Some(2.0), Some(5.0), None));
        assert_eq!(busy.running_mean, Some(3.5), "the window's mean beside the gauge of now");
        assert_eq!(busy.reporting_replicas, Some(2.0));
        let applied = busy.applied;
        assert_eq!(applied.max_batch_size, Some(Span { least: 8.0, greatest: 16.0 }));
        assert_eq!(applied.max_batch_size.map(|s| s.to_string()).as_deref(), Some("8-16"));
        assert!(applied.max_num_batched_tokens.is_some_and(|s| s.is(512.0)));
        assert_eq!(applied.batch_wait_ms, None, "not reported: unknown, not zero");

        let (stale, idle) = &out[&ServiceKey::new("ns", "idle")];
        assert_eq!(*stale, Freshness::Stale { age: 101.0 });
        assert_eq!(idle.ttft, Quantile::TooFewSamples { samples: 0.0 });
        assert_eq!(idle.itl, Quantile::Missing);
        assert_eq!(idle.request_rate, Some(0.0));

        let (missing, gone) = &out[&ServiceKey::new("ns", "gone")];
        assert!(matches!(missing, Freshness::Missing { reason } if reason.contains("ns/gone")));
        assert_eq!(*gone, ServiceMetrics::missing());
    }

    #[test]
    fn implausible_answers_leave_the_service_missing_and_the_planner_holding() {
        use crate::planner::{self, CapacityModel, History, Observation, Reason};
        let q = Measure::Quantile { latency: Latency::Ttft, quantile_ppm: 950_000, window_ms: 300_000 };
        let n = Measure::Samples { latency: Latency::Ttft, window_ms: 300_000 };
        for (measure, garbage) in [
            (q, f64::INFINITY),
            (q, f64::NEG_INFINITY),
            (Measure::Waiting, -3.0),
            (Measure::RequestRate { window_ms: 60_000 }, 1e300),
            (Measure::NewestSample, f64::INFINITY),
        ] {
            let mut values = vec![(q, "svc", 0.4), (n, "svc", 120.0), (Measure::NewestSample, "svc", 1000.0)];
            values.retain(|(m, _, _)| *m != measure);
            values.push((measure, "svc", garbage));
            let reqs = [request("ns", "svc", 0.95, 300.0)];
            let out = assemble(&reqs, &answers(&values), 1001.0, 60.0);
            let (freshness, metrics) = &out[&ServiceKey::new("ns", "svc")];
            assert!(
                matches!(freshness, Freshness::Missing { reason } if reason.contains("no engine can report")),
                "{measure:?} = {garbage}: {freshness:?}"
            );
            // What the planner does with it: hold, with the reason.
            let spec = crate::build::fixtures::isvc().spec.planner_spec();
            let observation = Observation {
                at: 1001.0,
                freshness: freshness.clone(),
                metrics: metrics.clone(),
                ready_replicas: 1,
                desired_replicas: 1,
            };
            let current = crate::build::fixtures::isvc().current_levers();
            let d = planner::decide(
                &spec,
                &CapacityModel::default(),
                &observation,
                &current,
                &History::default(),
                1001.0,
            );
            assert_eq!((d.reason, d.levers), (Reason::MetricsMissing, current), "{measure:?} = {garbage}");
        }
    }

    #[test]
    fn a_failed_source_leaves_every_service_missing() {
        let out = all_missing(&[request("a", "x", 0.95, 300.0), request("b", "y", 0.9, 60.0)], "down");
        assert_eq!(out.len(), 2);
        assert!(
            out.values()
                .all(|(f, m)| matches!(f, Freshness::Missing { .. }) && *m == ServiceMetrics::missing())
        );
    }
}
