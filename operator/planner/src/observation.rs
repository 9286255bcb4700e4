//! What the planner sees of one InferenceService at one tick: windowed latency percentiles with
//! their sample counts, request and token rates, scheduler state and replica counts. Missing,
//! stale and too-thin data are explicit states, never zeros.

use serde::{Deserialize, Serialize};

/// Seconds on the clock the caller keeps (wall time in the operator, virtual time in the
/// simulator). The planner never reads a clock; it only compares these.
pub type Seconds = f64;

/// One windowed percentile of a latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Quantile {
    /// Enough observations in the window: the percentile, in seconds, and how many
    /// observations it rests on.
    Value {
        /// The percentile, in seconds.
        seconds: f64,
        /// Observations in the window (the histogram count increase).
        samples: f64,
    },
    /// The series exist but hold fewer observations than [`MIN_SAMPLES`]: a P95 of three
    /// requests is not a signal.
    TooFewSamples {
        /// Observations in the window.
        samples: f64,
    },
    /// No series, or the value is NaN/infinite.
    Missing,
}

/// Fewest observations in the window for a percentile to count as a signal.
pub const MIN_SAMPLES: f64 = 20.0;

/// The window of the short request rate, seconds: the leading signal beside the rate window's.
/// Two scrapes at the usual 15 s interval, so `rate()` always has two samples in it.
pub const SHORT_RATE_WINDOW: Seconds = 30.0;

impl Quantile {
    /// Classifies a computed percentile and its sample count.
    pub fn from_parts(seconds: Option<f64>, samples: Option<f64>) -> Quantile {
        match (seconds, samples) {
            (_, Some(n)) if n.is_finite() && n < MIN_SAMPLES => {
                Quantile::TooFewSamples { samples: n.max(0.0) }
            }
            (Some(s), Some(n)) if s.is_finite() && s >= 0.0 && n.is_finite() => {
                Quantile::Value { seconds: s, samples: n }
            }
            _ => Quantile::Missing,
        }
    }

    /// The percentile in seconds when it is a signal.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Quantile::Value { seconds, .. } => Some(*seconds),
            _ => None,
        }
    }

    /// Observations in the window, when known.
    pub fn samples(&self) -> Option<f64> {
        match self {
            Quantile::Value { samples, .. } | Quantile::TooFewSamples { samples } => Some(*samples),
            Quantile::Missing => None,
        }
    }
}

/// Whether the metrics behind an observation can be trusted at all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Freshness {
    /// The source answered and the newest samples are recent.
    Fresh,
    /// The source answered, but the newest sample is older than the source's staleness bound.
    Stale {
        /// Age of the newest sample, in seconds.
        age: f64,
    },
    /// The source did not answer, or had no series for this service.
    Missing {
        /// Why, for the condition message.
        reason: String,
    },
}

/// Metrics of one InferenceService over the SLA window (rates over the source's rate window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceMetrics {
    /// Time to first token at the SLA percentile.
    pub ttft: Quantile,
    /// Inter-token latency at the SLA percentile.
    pub itl: Quantile,
    /// End-to-end request latency at the SLA percentile.
    pub e2e: Quantile,
    /// Finished requests per second, over the rate window.
    pub request_rate: Option<f64>,
    /// Finished requests per second over the short window ([`SHORT_RATE_WINDOW`]): with the
    /// rate window's, the load's level now and its trend.
    #[serde(default)]
    pub request_rate_short: Option<f64>,
    /// Prompt tokens per second.
    pub prompt_token_rate: Option<f64>,
    /// The prompt length at the SLA percentile (`vllm:request_prompt_tokens`): TTFT's tail
    /// prefills the long prompts, not the mean one.
    #[serde(default)]
    pub prompt_tokens_tail: Option<f64>,
    /// Generated tokens per second.
    pub output_token_rate: Option<f64>,
    /// Sequences in running batches, summed over replicas.
    pub running: Option<f64>,
    /// Sequences in running batches averaged over the rate window, summed over replicas: with
    /// the output rate over the same window, each replica's mean step ([`crate::online`]). The
    /// gauge of one instant divided by a window's rate is no step time: a batch of 8 caught at
    /// the scrape after a quiet window reads as a step eight times too long.
    #[serde(default)]
    pub running_mean: Option<f64>,
    /// Requests waiting for a batch slot, summed over replicas.
    pub waiting: Option<f64>,
    /// Prompt tokens not yet prefilled (waiting requests and partly prefilled prompts), summed
    /// over replicas (`pacer_engine_queued_prompt_tokens`; vLLM has no such gauge).
    #[serde(default)]
    pub queued_prompt_tokens: Option<f64>,
    /// Mean KV-cache usage over replicas, 0..1.
    pub kv_usage: Option<f64>,
    /// Engine replicas reporting metrics.
    pub reporting_replicas: Option<f64>,
    /// The batch settings the engines report they run (`pacer_engine_setting`), least and
    /// greatest over replicas; not known for engines that do not report them (vLLM).
    #[serde(default)]
    pub applied: AppliedSettings,
}

/// A setting's least and greatest value over the replicas that report it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// The least.
    pub least: f64,
    /// The greatest.
    pub greatest: f64,
}

impl Span {
    /// The span of `least` and `greatest` when both are known.
    pub fn of(least: Option<f64>, greatest: Option<f64>) -> Option<Span> {
        Some(Span { least: least?, greatest: greatest? })
    }

    /// Whether every replica runs `value`.
    pub fn is(&self, value: f64) -> bool {
        self.least == value && self.greatest == value
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.least == self.greatest {
            write!(f, "{}", self.least)
        } else {
            write!(f, "{}-{}", self.least, self.greatest)
        }
    }
}

/// The batch settings the engines report, each over the replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AppliedSettings {
    /// `max_batch_size`.
    pub max_batch_size: Option<Span>,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<Span>,
    /// `batch_wait_ms`.
    pub batch_wait_ms: Option<Span>,
}

impl ServiceMetrics {
    /// Nothing known.
    pub fn missing() -> ServiceMetrics {
        ServiceMetrics {
            ttft: Quantile::Missing,
            itl: Quantile::Missing,
            e2e: Quantile::Missing,
            request_rate: None,
            request_rate_short: None,
            prompt_token_rate: None,
            prompt_tokens_tail: None,
            output_token_rate: None,
            running: None,
            running_mean: None,
            waiting: None,
            queued_prompt_tokens: None,
            kv_usage: None,
            reporting_replicas: None,
            applied: AppliedSettings::default(),
        }
    }
}

/// Everything the planner sees at one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// When the metrics were evaluated.
    pub at: Seconds,
    /// Whether the metrics are usable at all.
    pub freshness: Freshness,
    /// The metrics (all `Missing`/`None` when `freshness` is `Missing`).
    pub metrics: ServiceMetrics,
    /// Replicas that are ready and run the current pod template.
    pub ready_replicas: i32,
    /// Replicas that exist (ready or starting), the Deployment's desired count when acting.
    pub desired_replicas: i32,
}

/// An InferenceService, as the `namespace` and `inferenceservice` labels of its series name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceKey {
    /// The service `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one service needs observed: its SLA percentile over its SLA window, and rates over a
/// rate window. Services that share these values share queries.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRequest {
    /// The service.
    pub service: ServiceKey,
    /// The SLA percentile as a quantile, 0..1 (0.95 for P95).
    pub quantile: f64,
    /// The SLA window percentiles and sample counts are computed over, seconds.
    pub window: f64,
    /// The window request and token rates are computed over, seconds.
    pub rate_window: f64,
}
