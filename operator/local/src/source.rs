//! Local mode's metrics source: it scrapes every replica's `/metrics` itself, keeps a ring of
//! timestamped scrapes per replica, and answers [`LocalSource::observe`] with the maths of
//! `histogram_quantile(q, sum by (le) (rate(h_bucket[w])))` over all replicas: per replica the
//! bucket increase over the window (a restart counts from zero, as `increase` does), summed by
//! `le`, then PromQL's interpolation ([`histogram`]). Sample counts are the `_count` increase;
//! rates are counter increases over the rate window; scheduler gauges come from each replica's
//! newest scrape.
//!
//! A replica that started inside the window counts from zero (its counters were zero at
//! start), so its first requests are not lost before its first scrape; a replica that is gone
//! keeps counting until its scrapes leave the window, as its series do in Prometheus.

use pacer_engine_api::metrics as names;
use pacer_planner::histogram::{Exposition, Histogram};
use pacer_planner::observation::SHORT_RATE_WINDOW;
use pacer_planner::observation::{ServiceKey, WindowRequest};
use pacer_planner::{Freshness, Quantile, ServiceMetrics};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// vLLM's histograms the planner reads: the three latencies in the order of
/// [`ServiceMetrics`], then prompt lengths.
pub const LATENCIES: [&str; 4] =
    [names::TTFT.name, names::ITL.name, names::E2E.name, names::PROMPT_LENGTH.name];
/// Finished requests, by `finished_reason`.
pub const REQUESTS: &str = names::REQUEST_SUCCESS.name;
/// Prompt tokens processed.
pub const PROMPT_TOKENS: &str = names::PROMPT_TOKENS.name;
/// Tokens generated.
pub const OUTPUT_TOKENS: &str = names::GENERATION_TOKENS.name;

/// What one scrape of one replica kept: the three histograms, three counters, three gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrape {
    /// When it was taken, unix seconds.
    pub at: f64,
    /// TTFT, ITL and E2E histograms and prompt lengths (summed over the replica's label sets).
    pub latencies: [Option<Histogram>; 4],
    /// Finished requests, prompt tokens, generated tokens.
    pub counters: [Option<f64>; 3],
    /// Running and waiting sequences, KV-cache usage.
    pub running: Option<f64>,
    /// Requests waiting for a batch slot.
    pub waiting: Option<f64>,
    /// Prompt tokens not yet prefilled.
    pub queued_prompt_tokens: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
}

impl Scrape {
    /// Keeps what the planner needs from one exposition.
    pub fn from_exposition(at: f64, e: &Exposition) -> Scrape {
        Scrape {
            at,
            latencies: LATENCIES.map(|name| e.histogram(name, &[])),
            counters: [REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS].map(|name| e.sum(name, &[])),
            running: e.sum(names::RUNNING.name, &[]),
            waiting: e.sum(names::WAITING.name, &[]),
            queued_prompt_tokens: e.sum(names::QUEUED_PROMPT_TOKENS.name, &[]),
            kv_usage: e.sum(names::KV_USAGE.name, &[]),
        }
    }

    /// The same series at zero: a process's counters when it started.
    fn zero(&self, at: f64) -> Scrape {
        let zero_h = |h: &Option<Histogram>| {
            h.as_ref().map(|h| Histogram {
                buckets: h.buckets.iter().map(|&(le, _)| (le, 0.0)).collect(),
                count: 0.0,
                sum: 0.0,
            })
        };
        Scrape {
            at,
            latencies: [
                zero_h(&self.latencies[0]),
                zero_h(&self.latencies[1]),
                zero_h(&self.latencies[2]),
                zero_h(&self.latencies[3]),
            ],
            counters: self.counters.map(|c| c.map(|_| 0.0)),
            running: None,
            waiting: None,
            queued_prompt_tokens: None,
            kv_usage: None,
        }
    }
}

/// The scrapes of one replica, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// When the replica started, unix seconds (its counters were zero then).
    pub started: f64,
    /// Its scrapes.
    pub scrapes: Vec<Scrape>,
    /// Whether it is still scraped (false once it is gone).
    pub live: bool,
}

impl Series {
    /// The scrape a window `[from, ..]` increases from: the newest at or before `from`; for a
    /// replica started after `from`, zero at its start.
    fn baseline(&self, from: f64) -> Option<Scrape> {
        if let Some(s) = self.scrapes.iter().rev().find(|s| s.at <= from) {
            return Some(s.clone());
        }
        let first = self.scrapes.first()?;
        if self.started >= from {
            Some(first.zero(self.started))
        } else {
            // Scraped first inside the window although started before it: the first scrape is
            // the best baseline there is (as Prometheus', whose window starts at it too).
            Some(first.clone())
        }
    }
}

/// Every replica's scrapes, and the maths over them. Pure: the scraper task feeds it.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    /// By replica id.
    pub series: BTreeMap<u32, Series>,
    /// Scrapes older than this many seconds before the newest are dropped.
    pub keep: f64,
}

/// The windowed view of a ring at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Windowed {
    /// The newest scrape's time, if any.
    pub newest: Option<f64>,
    /// The metrics.
    pub metrics: ServiceMetrics,
}

impl Ring {
    /// A ring that keeps `keep` seconds of scrapes.
    pub fn new(keep: f64) -> Ring {
        Ring { series: BTreeMap::new(), keep }
    }

    /// Records a scrape of replica `id` (started at `started`).
    pub fn push(&mut self, id: u32, started: f64, scrape: Scrape) {
        let at = scrape.at;
        let series =
            self.series.entry(id).or_insert_with(|| Series { started, scrapes: Vec::new(), live: true });
        series.live = true;
        series.scrapes.push(scrape);
        let keep = self.keep;
        // Keep one scrape older than the longest window: it is that window's baseline.
        while series.scrapes.len() > 1 && series.scrapes[1].at < at - keep {
            series.scrapes.remove(0);
        }
    }

    /// Marks replicas not in `live` as gone, and forgets gone ones with no recent scrape.
    pub fn retain_live(&mut self, live: &[u32], now: f64) {
        let keep = self.keep;
        for (id, s) in self.series.iter_mut() {
            s.live = live.contains(id);
        }
        self.series.retain(|_, s| s.live || s.scrapes.last().is_some_and(|l| l.at >= now - keep));
    }

    /// Percentile `quantile` over `window` seconds and rates over `rate_window` seconds, both
    /// ending at the newest scrape of each replica.
    pub fn windowed(&self, now: f64, quantile: f64, window: f64, rate_window: f64) -> Windowed {
        let newest = self.series.values().filter_map(|s| s.scrapes.last()).map(|s| s.at).reduce(f64::max);
        let mut latencies: [Option<Histogram>; 4] = [None, None, None, None];
        let (mut running, mut waiting, mut kv, mut reporting) = (None::<f64>, None::<f64>, Vec::new(), 0.0);
        let (mut queued, mut running_mean) = (None::<f64>, None::<f64>);
        for s in self.series.values() {
            let Some(last) = s.scrapes.last() else { continue };
            if last.at < now - window {
                continue;
            }
            if let Some(base) = s.baseline(now - window) {
                for (k, total) in latencies.iter_mut().enumerate() {
                    let (Some(now_h), Some(base_h)) = (&last.latencies[k], &base.latencies[k]) else {
                        continue;
                    };
                    let delta = now_h.since(base_h);
                    *total = Some(match total.take() {
                        None => delta,
                        Some(sum) => add(&sum, &delta),
                    });
                }
            }
            // `avg_over_time` of the gauge over the rate window, as the operator asks Prometheus.
            let seen: Vec<f64> = s
                .scrapes
                .iter()
                .filter(|x| x.at > now - rate_window && x.at <= now)
                .filter_map(|x| x.running)
                .collect();
            if !seen.is_empty() {
                running_mean =
                    Some(running_mean.unwrap_or(0.0) + seen.iter().sum::<f64>() / seen.len() as f64);
            }
            if s.live {
                reporting += 1.0;
                queued = sum_opt(queued, last.queued_prompt_tokens);
                running = sum_opt(running, last.running);
                waiting = sum_opt(waiting, last.waiting);
                kv.extend(last.kv_usage);
            }
        }
        let counters = self.rates(now, window, rate_window);
        let short_rate = self.rates(now, window, SHORT_RATE_WINDOW.min(rate_window))[0];
        let quantile_of = |h: &Option<Histogram>| match h {
            Some(h) => Quantile::from_parts(h.quantile(quantile), Some(h.count)),
            None => Quantile::Missing,
        };
        let metrics = ServiceMetrics {
            ttft: quantile_of(&latencies[0]),
            itl: quantile_of(&latencies[1]),
            e2e: quantile_of(&latencies[2]),
            prompt_tokens_tail: latencies[3]
                .as_ref()
                .and_then(|h| h.quantile(quantile))
                .filter(|v| v.is_finite()),
            request_rate: counters[0],
            request_rate_short: short_rate,
            prompt_token_rate: counters[1],
            output_token_rate: counters[2],
            running,
            running_mean,
            waiting,
            queued_prompt_tokens: queued,
            kv_usage: (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64),
            reporting_replicas: (reporting > 0.0).then_some(reporting),
            applied: Default::default(),
        };
        Windowed { newest, metrics }
    }

    /// The counters' rates over `rate_window` ending at each replica's newest scrape, over the
    /// replicas scraped within `window` of `now`: their increases summed, then divided by the
    /// longest span among them, as Prometheus' `sum(rate(..))` divides each series' increase by
    /// the whole range. Each replica's own span would overstate the rate whenever traffic moves
    /// between replicas: a drained replica's last completions over its last few seconds, or a
    /// new replica's share over the part of the window since its start, beside the old one's
    /// over the whole.
    fn rates(&self, now: f64, window: f64, rate_window: f64) -> [Option<f64>; 3] {
        let (mut increases, mut span) = ([None::<f64>; 3], 0.0_f64);
        for s in self.series.values() {
            let Some(last) = s.scrapes.last() else { continue };
            let Some(base) = s.baseline(now - rate_window) else { continue };
            if last.at < now - window || last.at <= base.at {
                continue;
            }
            span = span.max(last.at - base.at);
            for (k, total) in increases.iter_mut().enumerate() {
                let (Some(a), Some(b)) = (last.counters[k], base.counters[k]) else { continue };
                *total = Some(total.unwrap_or(0.0) + increase(a, b));
            }
        }
        increases.map(|i| i.map(|i| i / span))
    }
}

/// A counter's increase from `before` to `after`; a counter that went down was reset by a
/// restart, and counts from zero.
fn increase(after: f64, before: f64) -> f64 {
    if after >= before { after - before } else { after }
}

fn sum_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// `sum by (le)` of two increases.
fn add(a: &Histogram, b: &Histogram) -> Histogram {
    let mut buckets = a.buckets.clone();
    for &(le, count) in &b.buckets {
        match buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, total)) => *total += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    Histogram { buckets, count: a.count + b.count, sum: a.sum + b.sum }
}

/// A replica to scrape: its id, when it started (unix seconds) and its `/metrics` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Replica id.
    pub id: u32,
    /// Unix seconds at start.
    pub started: f64,
    /// `http://127.0.0.1:PORT/metrics`.
    pub url: String,
}

/// The local source: a ring fed by [`LocalSource::scrape`], read by [`LocalSource::observe`].
pub struct LocalSource {
    service: ServiceKey,
    ring: Mutex<Ring>,
    http: reqwest::Client,
    interval: Duration,
    clock: Arc<dyn Fn() -> f64 + Send + Sync>,
}

impl LocalSource {
    /// A source for `service` that is scraped every `interval` and keeps `keep` seconds;
    /// `clock` gives unix seconds.
    pub fn new(
        service: ServiceKey,
        interval: Duration,
        keep: f64,
        clock: Arc<dyn Fn() -> f64 + Send + Sync>,
    ) -> LocalSource {
        let http = reqwest::Client::builder()
            .timeout(interval.max(Duration::from_secs(1)))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        LocalSource { service, ring: Mutex::new(Ring::new(keep)), http, interval, clock }
    }

    /// How often it should be scraped.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Scrapes every target once, concurrently; a replica that does not answer is skipped
    /// this time (a dead one is noticed by the supervisor).
    pub async fn scrape(&self, targets: &[Target]) {
        let fetches = targets.iter().map(|t| async move {
            let text = self.http.get(&t.url).send().await.ok()?.error_for_status().ok()?.text().await.ok()?;
            let exposition = match Exposition::parse(&text) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(replica = t.id, error = %e, "a replica's /metrics did not parse");
                    return None;
                }
            };
            Some((t.id, t.started, Scrape::from_exposition((self.clock)(), &exposition)))
        });
        let scrapes = futures::future::join_all(fetches).await;
        let now = (self.clock)();
        let mut ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (id, started, scrape) in scrapes.into_iter().flatten() {
            ring.push(id, started, scrape);
        }
        let live: Vec<u32> = targets.iter().map(|t| t.id).collect();
        ring.retain_live(&live, now);
    }
}

/// What one observation saw of every requested service.
#[derive(Debug, Clone)]
pub struct Reading {
    /// When the metrics were evaluated, unix seconds.
    pub at: f64,
    /// Every requested service: its freshness and metrics. Another service than the one local
    /// mode runs, or one with no scrape yet, is [`Freshness::Missing`], so the planner holds.
    pub services: BTreeMap<ServiceKey, (Freshness, ServiceMetrics)>,
}

impl LocalSource {
    /// Observes every requested service from the scrapes kept, with the maths of PromQL's
    /// `histogram_quantile(rate(...))`.
    pub fn observe(&self, requests: &[WindowRequest]) -> Reading {
        let now = (self.clock)();
        let ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let stale_after = 3.0 * self.interval.as_secs_f64();
        let services = requests
            .iter()
            .map(|r| {
                let w = ring.windowed(now, r.quantile, r.window, r.rate_window);
                let freshness = match w.newest {
                    _ if r.service != self.service => {
                        Freshness::Missing { reason: format!("local mode runs {} only", self.service) }
                    }
                    None => Freshness::Missing { reason: "no replica has been scraped yet".into() },
                    Some(at) if now - at > stale_after => Freshness::Stale { age: now - at },
                    Some(_) => Freshness::Fresh,
                };
                (r.service.clone(), (freshness, w.metrics))
            })
            .collect();
        Reading { at: now, services }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LE: [f64; 4] = [0.1, 0.5, 1.0, f64::INFINITY];

    /// A scrape whose TTFT histogram holds `cumulative` counts per bound in [`LE`].
    fn scrape(at: f64, cumulative: [f64; 4], requests: f64) -> Scrape {
        let h = Histogram {
            buckets: LE.iter().copied().zip(cumulative).collect(),
            count: cumulative[3],
            sum: 0.0,
        };
        Scrape {
            at,
            latencies: [Some(h), None, None, None],
            counters: [Some(requests), Some(requests * 10.0), Some(requests * 5.0)],
            running: Some(1.0),
            waiting: Some(2.0),
            queued_prompt_tokens: Some(30.0),
            kv_usage: Some(0.5),
        }
    }

    #[test]
    fn percentiles_come_from_bucket_increases_summed_over_replicas() {
        let mut ring = Ring::new(600.0);
        // Replica 0: before the window 10 fast requests, in it 20 more, all in (0.1, 0.5].
        ring.push(0, 0.0, scrape(40.0, [10.0, 10.0, 10.0, 10.0], 10.0));
        ring.push(0, 0.0, scrape(100.0, [10.0, 30.0, 30.0, 30.0], 30.0));
        // Replica 1, started inside the window: 20 requests in (0.5, 1], counted from zero.
        ring.push(1, 70.0, scrape(100.0, [0.0, 0.0, 20.0, 20.0], 20.0));
        let w = ring.windowed(100.0, 0.95, 50.0, 50.0);
        // 40 observations: 20 in (0.1, 0.5], 20 in (0.5, 1]. rank(0.95) = 38 → 0.5 + 0.5 × 18/20.
        assert_eq!(w.metrics.ttft, Quantile::Value { seconds: 0.5 + 0.5 * 18.0 / 20.0, samples: 40.0 });
        // Rates: replica 0 did 20 in 60 s (its baseline is the scrape at 40), replica 1 20 in the
        // 30 s since its start: 40 over the window's 60 s, as Prometheus' `sum(rate(..))`.
        let rate = w.metrics.request_rate.expect("rate");
        assert!((rate - 40.0 / 60.0).abs() < 1e-9, "{rate}");
        assert_eq!(w.metrics.running, Some(2.0));
        // One scrape of each replica in the rate window, running 1 each.
        assert_eq!(w.metrics.running_mean, Some(2.0));
        assert_eq!(w.metrics.waiting, Some(4.0));
        assert_eq!(w.metrics.kv_usage, Some(0.5));
        assert_eq!(w.metrics.reporting_replicas, Some(2.0));
        assert_eq!(w.metrics.itl, Quantile::Missing);
        assert_eq!(w.newest, Some(100.0));
    }

    #[test]
    fn a_thin_window_is_too_few_samples_and_a_restart_counts_from_zero() {
        let mut ring = Ring::new(600.0);
        ring.push(0, 0.0, scrape(10.0, [5.0, 50.0, 50.0, 50.0], 50.0));
        // The process restarted: every counter went down; the increase is the new value.
        ring.push(0, 0.0, scrape(20.0, [3.0, 3.0, 3.0, 3.0], 3.0));
        let w = ring.windowed(20.0, 0.95, 15.0, 15.0);
        assert_eq!(w.metrics.ttft, Quantile::TooFewSamples { samples: 3.0 });
        assert!((w.metrics.request_rate.expect("rate") - 0.3).abs() < 1e-9);
    }

    #[test]
    fn gone_replicas_count_until_they_leave_the_window() {
        let mut ring = Ring::new(60.0);
        ring.push(0, 0.0, scrape(0.0, [0.0; 4], 0.0));
        ring.push(0, 0.0, scrape(10.0, [0.0, 25.0, 25.0, 25.0], 25.0));
        ring.push(1, 0.0, scrape(10.0, [0.0; 4], 0.0));
        ring.retain_live(&[1], 10.0);
        let w = ring.windowed(12.0, 0.5, 30.0, 30.0);
        assert_eq!(w.metrics.ttft.samples(), Some(25.0), "replica 0's requests still count");
        assert_eq!(w.metrics.reporting_replicas, Some(1.0), "but it no longer reports gauges");
        // Long after, it is forgotten.
        ring.retain_live(&[1], 100.0);
        assert!(!ring.series.contains_key(&0));
    }

    #[test]
    fn a_drained_replicas_last_completions_count_over_the_window_not_its_last_seconds() {
        // One request a second throughout: replica 0 carries half until it is drained at 98 and
        // finishes its last 3 in flight by its final scrape at 100; replica 1 carries the rest.
        let mut ring = Ring::new(120.0);
        for t in (0..=96).step_by(2) {
            let t = f64::from(t);
            ring.push(0, 0.0, scrape(t, [0.0; 4], t / 2.0));
        }
        ring.push(0, 0.0, scrape(98.0, [0.0; 4], 49.0));
        ring.push(0, 0.0, scrape(100.0, [0.0; 4], 52.0));
        for t in (0..=128).step_by(2) {
            let t = f64::from(t);
            let done = if t <= 98.0 { t / 2.0 } else { 49.0 + (t - 98.0) };
            ring.push(1, 0.0, scrape(t, [0.0; 4], done));
        }
        ring.retain_live(&[1], 100.0);
        // At 128 the 30 s window holds replica 0's [98, 100] and replica 1's [98, 128]: 3 + 30.
        let w = ring.windowed(128.0, 0.95, 30.0, 30.0);
        let rate = w.metrics.request_rate.expect("rate");
        assert!((rate - 33.0 / 30.0).abs() < 1e-9, "{rate}: not 3 / 2 s + 30 / 30 s = 2.5");
        let short = w.metrics.request_rate_short.expect("short rate");
        assert!((short - 33.0 / 30.0).abs() < 1e-9, "{short}");
    }

    #[test]
    fn the_running_mean_averages_the_gauge_over_the_rate_window() {
        let mut ring = Ring::new(600.0);
        // Quiet scrapes, then a batch of 8 caught by the newest: the gauge says 8, the window 2.
        for (t, running) in [(0.0, 5.0), (10.0, 0.0), (20.0, 0.0), (30.0, 0.0), (40.0, 8.0)] {
            ring.push(0, 0.0, Scrape { running: Some(running), ..scrape(t, [0.0; 4], 0.0) });
        }
        let w = ring.windowed(40.0, 0.95, 35.0, 35.0);
        assert_eq!(w.metrics.running, Some(8.0));
        assert_eq!(w.metrics.running_mean, Some(2.0), "the scrapes at 10, 20, 30 and 40");
    }

    #[test]
    fn the_ring_keeps_one_baseline_older_than_its_span() {
        let mut ring = Ring::new(30.0);
        for t in 0..20 {
            ring.push(0, 0.0, scrape(f64::from(t) * 5.0, [0.0; 4], 0.0));
        }
        let kept = &ring.series[&0].scrapes;
        assert!(kept[0].at < 95.0 - 30.0 && kept[1].at >= 95.0 - 30.0, "{:?}", kept[0].at);
    }
}
