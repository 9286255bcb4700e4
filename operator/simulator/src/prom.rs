//! Prometheus' arithmetic over the simulated engines: the engines' histograms with the engine's
//! bucket boundaries, scrapes at a fixed interval into per-pod series, and the queries the
//! operator runs — `histogram_quantile(q, sum by (le) (rate(..._bucket[w])))`, `rate()` of
//! counters with Prometheus' extrapolation, instant gauges — so a policy sees what it would see
//! from a real Prometheus, quantization error and lag included.

use pacer_planner::{Freshness, Observation, Quantile, ServiceMetrics, observation::SHORT_RATE_WINDOW};
use std::collections::{BTreeMap, VecDeque};

pub use pacer_planner::buckets::{
    ITL as ITL_BUCKETS, REQUEST as REQUEST_BUCKETS, TOKENS as TOKEN_BUCKETS, TTFT as TTFT_BUCKETS,
};

/// A Prometheus histogram as an engine keeps it: a count per bucket (the last is `+Inf`) and
/// the sum of observations.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    /// An empty histogram over `bounds` (upper bounds, ascending; `+Inf` is implied).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    /// Records one observation (`le` is inclusive, as in the Prometheus client).
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
    }

    /// The exposition's view: cumulative counts per `le`, the last being `+Inf` (the count).
    pub fn cumulative(&self) -> Vec<f64> {
        let mut acc = 0u64;
        self.counts
            .iter()
            .map(|c| {
                acc += c;
                acc as f64
            })
            .collect()
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// What one engine exposes at `/metrics` (the series the operator queries).
#[derive(Debug, Clone)]
pub struct EngineSeries {
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:request_prompt_tokens`.
    pub prompt_len: Histogram,
    /// `vllm:request_success_total`.
    pub success: f64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: f64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: f64,
}

impl Default for EngineSeries {
    fn default() -> Self {
        EngineSeries {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            prompt_len: Histogram::new(TOKEN_BUCKETS),
            success: 0.0,
            prompt_tokens: 0.0,
            generation_tokens: 0.0,
        }
    }
}

/// One scrape of one pod: every sample the queries need.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Scrape time.
    pub t: f64,
    /// Cumulative TTFT buckets (last = `+Inf`) and sum.
    pub ttft: (Vec<f64>, f64),
    /// Cumulative ITL buckets and sum.
    pub itl: (Vec<f64>, f64),
    /// Cumulative E2E buckets and sum.
    pub e2e: (Vec<f64>, f64),
    /// Cumulative prompt-length buckets and sum.
    pub prompt_len: (Vec<f64>, f64),
    /// Counters.
    pub success: f64,
    /// Counters.
    pub prompt_tokens: f64,
    /// Counters.
    pub generation_tokens: f64,
    /// Gauges.
    pub running: f64,
    /// Gauges.
    pub waiting: f64,
    /// Gauges.
    pub kv_usage: f64,
    /// Gauges: `pacer_engine_queued_prompt_tokens`.
    pub queued_prompt_tokens: f64,
}

impl Sample {
    /// A scrape of `m` and the gauges at `t`.
    pub fn of(t: f64, m: &EngineSeries, running: f64, waiting: f64, kv_usage: f64) -> Sample {
        Sample {
            t,
            ttft: (m.ttft.cumulative(), m.ttft.sum()),
            itl: (m.itl.cumulative(), m.itl.sum()),
            e2e: (m.e2e.cumulative(), m.e2e.sum()),
            prompt_len: (m.prompt_len.cumulative(), m.prompt_len.sum()),
            success: m.success,
            prompt_tokens: m.prompt_tokens,
            generation_tokens: m.generation_tokens,
            running,
            waiting,
            kv_usage,
            queued_prompt_tokens: 0.0,
        }
    }
}

#[derive(Debug, Default)]
struct Series {
    samples: VecDeque<Sample>,
    /// The target went away: Prometheus wrote a staleness marker, so instant queries no longer
    /// see it, while range queries still use its earlier samples.
    stale: bool,
}

/// The scraped series of one service, per pod, with enough history for the longest window.
#[derive(Debug, Default)]
pub struct Prometheus {
    series: BTreeMap<usize, Series>,
    retention: f64,
}

/// A latency histogram's view over a window: quantile, observations, mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Windowed {
    /// `histogram_quantile` of the summed bucket rates (None when there are no observations).
    pub quantile: Option<f64>,
    /// `increase` of the count.
    pub samples: Option<f64>,
    /// `rate(sum) / rate(count)`.
    pub mean: Option<f64>,
}

/// What the simulator's Prometheus answers at one tick: the planner's observation plus the
/// means a mean-based baseline (Dynamo) reads; and, outside Prometheus, what each ready engine
/// reports of its scheduler (Dynamo's planner reads its workers' per-step records directly).
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The planner's view.
    pub observation: Observation,
    /// Mean TTFT over the rate window.
    pub ttft_mean: Option<f64>,
    /// Mean ITL over the rate window.
    pub itl_mean: Option<f64>,
    /// The ready and draining engines' scheduler reports (filled by the run, not by
    /// Prometheus).
    pub engines: Vec<EngineReport>,
}

/// One running engine's scheduler, as it reports itself at a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineReport {
    /// The pod.
    pub pod: usize,
    /// Whether it takes new requests (false while it drains before it stops).
    pub serving: bool,
    /// Its last finished step.
    pub last_step: super::replica::StepRecord,
    /// Steps it has finished (a new count means a new record).
    pub steps: u64,
    /// Prompt tokens not yet prefilled (waiting requests and the rest of prompts mid-prefill).
    pub queued_prefill_tokens: u64,
    /// Context tokens of the running requests.
    pub scheduled_kv_tokens: u64,
    /// Prompt tokens of the waiting requests (the context they bring once admitted).
    pub queued_kv_tokens: u64,
}

impl Prometheus {
    /// Keeps `retention` seconds of samples (at least the longest query window).
    pub fn new(retention: f64) -> Prometheus {
        Prometheus { series: BTreeMap::new(), retention }
    }

    /// Appends one scrape of pod `pod`.
    pub fn push(&mut self, pod: usize, sample: Sample) {
        let t = sample.t;
        let s = self.series.entry(pod).or_default();
        s.stale = false;
        s.samples.push_back(sample);
        while s.samples.front().is_some_and(|f| f.t < t - self.retention) {
            s.samples.pop_front();
        }
    }

    /// The pod's target is gone (terminated).
    pub fn mark_stale(&mut self, pod: usize) {
        if let Some(s) = self.series.get_mut(&pod) {
            s.stale = true;
        }
    }

    /// Drops series with no sample left in retention.
    pub fn compact(&mut self, now: f64) {
        let keep = self.retention;
        self.series.retain(|_, s| s.samples.back().is_some_and(|b| b.t >= now - keep));
    }

    /// Summed extrapolated increases over `(now - w, now]` of the values `f` picks from each
    /// sample (one value per bucket, or one counter), across series.
    fn extrapolated_increases(&self, now: f64, w: f64, f: impl Fn(&Sample) -> Vec<f64>) -> Option<Vec<f64>> {
        let mut total: Option<Vec<f64>> = None;
        for s in self.series.values() {
            let inside: Vec<&Sample> = s.samples.iter().filter(|x| x.t > now - w && x.t <= now).collect();
            if inside.len() < 2 {
                continue;
            }
            let values: Vec<Vec<f64>> = inside.iter().map(|x| f(x)).collect();
            let times: Vec<f64> = inside.iter().map(|x| x.t).collect();
            let n = values[0].len();
            let acc = total.get_or_insert_with(|| vec![0.0; n]);
            for (k, slot) in acc.iter_mut().enumerate() {
                let column: Vec<f64> = values.iter().map(|v| v[k]).collect();
                *slot += extrapolated_increase(&times, &column, now - w, now);
            }
        }
        total
    }

    /// A latency histogram over window `w`.
    fn windowed(
        &self,
        now: f64,
        (w, q): (f64, f64),
        bounds: &[f64],
        pick: fn(&Sample) -> &(Vec<f64>, f64),
    ) -> Windowed {
        let buckets = self.extrapolated_increases(now, w, |s| pick(s).0.clone());
        let sums = self.extrapolated_increases(now, w, |s| vec![pick(s).1]);
        let Some(buckets) = buckets else { return Windowed { quantile: None, samples: None, mean: None } };
        let count = buckets.last().copied().unwrap_or(0.0);
        let mean = sums.and_then(|s| (count > 0.0).then(|| s[0] / count));
        Windowed { quantile: histogram_quantile(q, bounds, &buckets), samples: Some(count), mean }
    }

    /// The per-second rate of a counter over `w`, summed over series.
    fn rate(&self, now: f64, w: f64, f: fn(&Sample) -> f64) -> Option<f64> {
        self.extrapolated_increases(now, w, |s| vec![f(s)]).map(|v| v[0] / w)
    }

    /// The sum over live series of a gauge's latest sample.
    fn gauge_sum(&self, f: fn(&Sample) -> f64) -> Option<f64> {
        let live: Vec<f64> =
            self.series.values().filter(|s| !s.stale).filter_map(|s| s.samples.back()).map(f).collect();
        (!live.is_empty()).then(|| live.iter().sum())
    }

    /// `sum(avg_over_time(gauge[w]))`: per series (a stale one too, as range queries still
    /// read its samples) the mean of its samples in `(now - w, now]`, summed.
    fn gauge_mean_sum(&self, now: f64, w: f64, f: fn(&Sample) -> f64) -> Option<f64> {
        let means: Vec<f64> = self
            .series
            .values()
            .filter_map(|s| {
                let inside: Vec<f64> =
                    s.samples.iter().filter(|x| x.t > now - w && x.t <= now).map(f).collect();
                (!inside.is_empty()).then(|| inside.iter().sum::<f64>() / inside.len() as f64)
            })
            .collect();
        (!means.is_empty()).then(|| means.iter().sum())
    }

    /// Everything the planner sees at `now`: percentiles over `window` at quantile `q`, rates
    /// and means over `rate_window`, gauges from the latest scrape of each live pod.
    pub fn observe(&self, now: f64, q: f64, window: f64, rate_window: f64, ready: i32, desired: i32) -> Seen {
        let live = self.series.values().filter(|s| !s.stale).count();
        let ttft = self.windowed(now, (window, q), TTFT_BUCKETS, |s| &s.ttft);
        let itl = self.windowed(now, (window, q), ITL_BUCKETS, |s| &s.itl);
        let e2e = self.windowed(now, (window, q), REQUEST_BUCKETS, |s| &s.e2e);
        let fast_ttft = self.windowed(now, (rate_window, q), TTFT_BUCKETS, |s| &s.ttft);
        let fast_itl = self.windowed(now, (rate_window, q), ITL_BUCKETS, |s| &s.itl);
        let prompts = self.windowed(now, (window, q), TOKEN_BUCKETS, |s| &s.prompt_len);
        let metrics = ServiceMetrics {
            ttft: Quantile::from_parts(ttft.quantile, ttft.samples),
            itl: Quantile::from_parts(itl.quantile, itl.samples),
            e2e: Quantile::from_parts(e2e.quantile, e2e.samples),
            request_rate: self.rate(now, rate_window, |s| s.success),
            // Scrapes and ticks fall on the same instants here, so a window of exactly two scrape
            // intervals would hold one sample; a real Prometheus' scrapes are offset and hold two.
            request_rate_short: self.rate(now, SHORT_RATE_WINDOW.min(rate_window) + 1e-3, |s| s.success),
            prompt_token_rate: self.rate(now, rate_window, |s| s.prompt_tokens),
            prompt_tokens_tail: prompts.quantile,
            output_token_rate: self.rate(now, rate_window, |s| s.generation_tokens),
            running: self.gauge_sum(|s| s.running),
            running_mean: self.gauge_mean_sum(now, rate_window, |s| s.running),
            waiting: self.gauge_sum(|s| s.waiting),
            queued_prompt_tokens: self.gauge_sum(|s| s.queued_prompt_tokens),
            kv_usage: self.gauge_sum(|s| s.kv_usage).map(|k| k / live.max(1) as f64),
            reporting_replicas: Some(live as f64),
            applied: Default::default(),
        };
        let freshness = if live == 0 {
            Freshness::Missing { reason: "no engine series".into() }
        } else {
            Freshness::Fresh
        };
        Seen {
            observation: Observation {
                at: now,
                freshness,
                metrics,
                ready_replicas: ready,
                desired_replicas: desired,
            },
            ttft_mean: fast_ttft.mean,
            itl_mean: fast_itl.mean,
            engines: Vec::new(),
        }
    }
}

/// Prometheus' `extrapolatedRate` for a counter without resets, as an increase over
/// `[start, end]`: the sampled delta stretched to the window edges, by at most half a scrape
/// interval past the outermost samples, and never below zero at the start.
pub fn extrapolated_increase(times: &[f64], values: &[f64], start: f64, end: f64) -> f64 {
    let n = times.len();
    if n < 2 {
        return 0.0;
    }
    let delta = values[n - 1] - values[0];
    let sampled = times[n - 1] - times[0];
    if sampled <= 0.0 {
        return 0.0;
    }
    let mut to_start = times[0] - start;
    let mut to_end = end - times[n - 1];
    let average = sampled / (n - 1) as f64;
    let threshold = average * 1.1;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    if delta > 0.0 && values[0] >= 0.0 {
        let to_zero = sampled * (values[0] / delta);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    delta * (sampled + to_start + to_end) / sampled
}

/// Prometheus' `histogram_quantile` over cumulative bucket counts (`cumulative[i]` for
/// `bounds[i]`, the last entry for `+Inf`), by the operator's own PromQL arithmetic; None when
/// there are no observations.
pub fn histogram_quantile(q: f64, bounds: &[f64], cumulative: &[f64]) -> Option<f64> {
    let buckets: Vec<(f64, f64)> = bounds
        .iter()
        .copied()
        .chain(std::iter::once(f64::INFINITY))
        .zip(cumulative.iter().copied())
        .collect();
    let v = pacer_planner::histogram::bucket_quantile(q, &buckets);
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantile_interpolates_inside_the_bucket() {
        let bounds = [0.1, 0.2, 0.4];
        // 10 observations ≤ 0.1, 10 in (0.1, 0.2], none above.
        let c = [10.0, 20.0, 20.0, 20.0];
        assert_eq!(histogram_quantile(0.5, &bounds, &c), Some(0.1));
        assert!((histogram_quantile(0.75, &bounds, &c).unwrap() - 0.15).abs() < 1e-12);
        assert!((histogram_quantile(0.25, &bounds, &c).unwrap() - 0.05).abs() < 1e-12);
        // The rank in +Inf: the highest finite bound.
        assert_eq!(histogram_quantile(0.99, &bounds, &[0.0, 0.0, 0.0, 5.0]), Some(0.4));
        assert_eq!(histogram_quantile(0.5, &bounds, &[0.0; 4]), None);
    }

    #[test]
    fn extrapolation_stretches_to_the_window_like_prometheus() {
        // Scrapes every 15 s at 5..=50 inside a 60 s window [0, 60]: 4 samples, delta 3 over
        // 45 s; 5 s to the start (< 1.1 × 15), but the counter would hit zero... it starts at
        // 10 so zero is 225 s away: stretch 5 s back; 10 s to the end: stretch 10 s.
        let inc = extrapolated_increase(&[5.0, 20.0, 35.0, 50.0], &[10.0, 11.0, 12.0, 13.0], 0.0, 60.0);
        assert!((inc - 3.0 * 60.0 / 45.0).abs() < 1e-12, "{inc}");
        // A counter that starts at 0 is not stretched before its start.
        let inc = extrapolated_increase(&[5.0, 20.0], &[0.0, 3.0], 0.0, 20.0);
        assert!((inc - 3.0).abs() < 1e-12, "{inc}");
    }

    #[test]
    fn quantiles_from_scrapes_match_a_direct_percentile_within_a_bucket() {
        let mut m = EngineSeries::default();
        let mut prom = Prometheus::new(600.0);
        let mut direct = Vec::new();
        let mut rng = pacer_bench::load::Rng::new(5);
        prom.push(0, Sample::of(0.0, &m, 0.0, 0.0, 0.0));
        for k in 1..=20 {
            for _ in 0..200 {
                let v = 0.02 + 0.3 * rng.uniform().powi(3);
                m.itl.observe(v);
                direct.push(v);
            }
            prom.push(0, Sample::of(15.0 * k as f64, &m, 0.0, 0.0, 0.0));
        }
        direct.sort_by(f64::total_cmp);
        let exact = pacer_bench::metrics::percentile(&direct, 95.0).unwrap();
        let seen = prom.observe(300.0, 0.95, 300.0, 60.0, 1, 1);
        let p95 = seen.observation.metrics.itl.seconds().unwrap();
        let bucket = ITL_BUCKETS.partition_point(|b| *b < exact);
        let (lo, hi) = (ITL_BUCKETS[bucket - 1], ITL_BUCKETS[bucket]);
        assert!((lo..=hi).contains(&p95), "P95 {p95} not in the bucket ({lo}, {hi}] of the exact {exact}");
        let n = seen.observation.metrics.itl.samples().unwrap();
        assert!((n - 4000.0).abs() < 1e-6, "{n}");
    }
}
