//! The client-side latency vocabulary, computed from what one request observed. Pure functions
//! over timestamps, so every definition is tested exactly.
//!
//! t0 = request written, ts = its scheduled send time, c1..cK = arrival times of SSE events that
//! carry content (role-only and usage-only chunks do not count), N = output tokens.
//! - TTFT = c1 − t0 (and the queue-inclusive c1 − ts)
//! - E2E = cK − t0
//! - TPOT = (cK − c1) / (N − 1), for N ≥ 2
//! - ITL = every gap c(j+1) − c(j), pooled over requests
//! - goodput: requests meeting every SLO given, per second of the measured window

use serde::{Deserialize, Serialize};

/// Where a request's output token count came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage` chunk.
    Usage,
    /// Counting content events (one token each), when the server sent no usage.
    #[default]
    Events,
    /// A local tokenizer over the generated text (`--tokenizer`), when the server sent no usage.
    Tokenizer,
}

/// What one request observed, in seconds since the run started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Scheduled send time.
    pub scheduled: f64,
    /// When the request was written.
    pub sent: f64,
    /// Arrival time of each content-bearing event.
    pub content_events: Vec<f64>,
    /// When the stream closed.
    pub closed: f64,
    /// Prompt tokens (server usage, else local count).
    pub prompt_tokens: usize,
    /// Output tokens.
    pub output_tokens: usize,
    /// Where `output_tokens` came from.
    pub token_source: TokenSource,
    /// The error, for a failed request.
    pub error: Option<String>,
    /// Times the request was sent again because its connection could not be opened (it had
    /// never reached the server). Nothing else is retried.
    #[serde(default)]
    pub retries: u32,
}

impl RequestRecord {
    /// Whether the request finished without error and produced content.
    pub fn ok(&self) -> bool {
        self.error.is_none() && !self.content_events.is_empty()
    }
    /// Time to first token from the write, seconds.
    pub fn ttft(&self) -> Option<f64> {
        self.content_events.first().map(|c| c - self.sent)
    }
    /// Time to first token from the scheduled send time (includes client-side lag).
    pub fn ttft_from_schedule(&self) -> Option<f64> {
        self.content_events.first().map(|c| c - self.scheduled)
    }
    /// End-to-end latency to the last content event, seconds.
    pub fn e2e(&self) -> Option<f64> {
        self.content_events.last().map(|c| c - self.sent)
    }
    /// Time per output token after the first, seconds; needs N ≥ 2.
    pub fn tpot(&self) -> Option<f64> {
        let (first, last) = (self.content_events.first()?, self.content_events.last()?);
        (self.output_tokens >= 2).then(|| (last - first) / (self.output_tokens - 1) as f64)
    }
    /// Gaps between consecutive content events, seconds.
    pub fn itls(&self) -> impl Iterator<Item = f64> + '_ {
        self.content_events.windows(2).map(|w| w[1] - w[0])
    }
    /// Lag between scheduled and actual send, seconds.
    pub fn schedule_lag(&self) -> f64 {
        self.sent - self.scheduled
    }
}

/// Service-level objectives, in milliseconds; an absent one is not checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    /// TTFT bound.
    pub ttft_ms: Option<f64>,
    /// TPOT bound.
    pub tpot_ms: Option<f64>,
    /// E2E bound.
    pub e2e_ms: Option<f64>,
    /// Bound on every inter-token gap of the request.
    pub itl_ms: Option<f64>,
}

impl Slo {
    /// Whether any objective is set.
    pub fn any(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some() || self.itl_ms.is_some()
    }

    /// Per-objective verdicts for `r` (ttft, tpot, e2e, itl); `None` where not set.
    pub fn verdicts(&self, r: &RequestRecord) -> [Option<bool>; 4] {
        let within =
            |v: Option<f64>, bound: Option<f64>| bound.map(|b| r.ok() && v.is_some_and(|v| v * 1e3 <= b));
        let max_itl = r.itls().fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
        [
            within(r.ttft(), self.ttft_ms),
            // A one-token answer has no TPOT; it cannot violate the bound.
            self.tpot_ms.map(|b| r.ok() && r.tpot().is_none_or(|t| t * 1e3 <= b)),
            within(r.e2e(), self.e2e_ms),
            self.itl_ms.map(|b| r.ok() && max_itl.is_none_or(|g| g * 1e3 <= b)),
        ]
    }

    /// A request is good when it succeeded and meets every objective given.
    pub fn good(&self, r: &RequestRecord) -> bool {
        r.ok() && self.verdicts(r).iter().all(|v| v.unwrap_or(true))
    }
}

/// Percentile `q` (0..=100) with linear interpolation between closest ranks; `None` if empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = q / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Summary statistics of one latency, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Standard deviation (population).
    pub std: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile (only meaningful when n ≥ 1000).
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Distribution {
    /// Statistics of `seconds`, reported in milliseconds.
    pub fn of_seconds(seconds: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = seconds.into_iter().map(|s| s * 1e3).filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Distribution::default();
        }
        let mean = v.iter().sum::<f64>() / n as f64;
        let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        let p = |q| percentile(&v, q).unwrap_or(f64::NAN);
        Distribution {
            n,
            mean,
            std,
            p50: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            p999: p(99.9),
            max: v[n - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sent: f64, events: &[f64], tokens: usize) -> RequestRecord {
        RequestRecord {
            scheduled: sent - 0.01,
            sent,
            content_events: events.to_vec(),
            closed: events.last().copied().unwrap_or(sent),
            prompt_tokens: 10,
            output_tokens: tokens,
            token_source: TokenSource::Usage,
            error: None,
            retries: 0,
        }
    }

    #[test]
    fn definitions_follow_the_metric_contract() {
        let r = record(1.0, &[1.2, 1.25, 1.35, 1.4], 4);
        assert!((r.ttft().unwrap() - 0.2).abs() < 1e-12);
        assert!((r.ttft_from_schedule().unwrap() - 0.21).abs() < 1e-12);
        assert!((r.e2e().unwrap() - 0.4).abs() < 1e-12);
        assert!((r.tpot().unwrap() - 0.2 / 3.0).abs() < 1e-12);
        let itl: Vec<f64> = r.itls().collect();
        assert_eq!(itl.len(), 3);
        assert!((itl[1] - 0.1).abs() < 1e-12);
        // E2E ≈ TTFT + (N − 1)·TPOT holds by construction.
        assert!((r.e2e().unwrap() - (r.ttft().unwrap() + 3.0 * r.tpot().unwrap())).abs() < 1e-12);
    }

    #[test]
    fn tpot_needs_two_tokens_and_counts_tokens_not_events() {
        assert_eq!(record(0.0, &[0.1], 1).tpot(), None);
        // Two events carrying 5 tokens: TPOT divides by N − 1 = 4.
        let r = record(0.0, &[0.1, 0.5], 5);
        assert!((r.tpot().unwrap() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn percentiles_interpolate_linearly() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        assert!((percentile(&v, 95.0).unwrap() - 3.85).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), None);
        let d = Distribution::of_seconds([0.001, 0.002, 0.003]);
        assert_eq!((d.n, d.p50, d.max), (3, 2.0, 3.0));
    }

    #[test]
    fn goodput_needs_every_given_slo_and_success() {
        let slo = Slo { ttft_ms: Some(250.0), tpot_ms: Some(50.0), e2e_ms: None, itl_ms: Some(90.0) };
        let good = record(0.0, &[0.2, 0.25, 0.3], 3);
        assert!(slo.good(&good));
        let slow_first = record(0.0, &[0.3, 0.31], 2);
        assert_eq!(slo.verdicts(&slow_first), [Some(false), Some(true), None, Some(true)]);
        let one_gap_too_long = record(0.0, &[0.1, 0.11, 0.21], 3);
        assert!(!slo.good(&one_gap_too_long), "max ITL 100 ms > 90 ms");
        let failed = RequestRecord { error: Some("boom".into()), ..good.clone() };
        assert!(!slo.good(&failed));
    }
}
