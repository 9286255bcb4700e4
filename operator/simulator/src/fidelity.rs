//! How close the simulator is to the real engine: the arrivals, prompt lengths and output
//! lengths of a measured `pacer-bench run --requests-jsonl` are replayed through one simulated
//! replica with the same tier's profile and batch settings, and the simulated P50/P95 TTFT and
//! ITL are set beside the measured ones. This is the calibration benchmark of
//! `docs/benchmarks.md` (`scripts/calibrate.sh` runs it at three rates and two tiers).

use super::replica::{Engine, Finished, Seq, Settings};
use pacer_bench::metrics::{RequestRecord, percentile};
use pacer_planner::StepModel;
use serde::Serialize;

/// One latency at P50 and P95, measured and simulated.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// `ttft` or `itl`.
    pub latency: &'static str,
    /// Measured P50, seconds.
    pub measured_p50: f64,
    /// Simulated P50, seconds.
    pub simulated_p50: f64,
    /// Measured P95, seconds.
    pub measured_p95: f64,
    /// Simulated P95, seconds.
    pub simulated_p95: f64,
}

impl Row {
    /// (simulated − measured) / measured at P50 and at P95.
    pub fn errors(&self) -> (f64, f64) {
        let rel = |s: f64, m: f64| if m > 0.0 { (s - m) / m } else { f64::NAN };
        (rel(self.simulated_p50, self.measured_p50), rel(self.simulated_p95, self.measured_p95))
    }
}

/// The comparison for one measured run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Fidelity {
    /// Requests replayed (the run's successful ones).
    pub requests: usize,
    /// Their mean arrival rate, requests/s.
    pub rate: f64,
    /// Requests the run lost (errors), left out of both sides.
    pub failed: usize,
    /// TTFT, then ITL.
    pub rows: Vec<Row>,
}

/// Replays `records` (one run's per-request file) through one simulated engine whose steps
/// take what `step` says, with `settings` as the engine ran. `None` when no request succeeded.
pub fn replay(step: StepModel, records: &[RequestRecord], settings: Settings) -> Option<Fidelity> {
    let mut ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    ok.sort_by(|a, b| a.sent.total_cmp(&b.sent));
    let start = ok.first()?.sent;
    let span = ok.last().map_or(0.0, |r| r.sent) - start;

    let mut engine = Engine::new(step);
    let mut done: Vec<Finished> = Vec::with_capacity(ok.len());
    for (id, r) in ok.iter().enumerate() {
        let at = r.sent - start;
        // Run the engine up to this arrival, event by event, as the real one ran meanwhile.
        while let Some(t) = engine.next_event().filter(|&t| t <= at) {
            engine.poll(t, settings, &mut done);
        }
        engine.submit(Seq::new(id, at, r.prompt_tokens as u32, r.output_tokens as u32), at, settings);
    }
    while let Some(t) = engine.next_event() {
        engine.poll(t, settings, &mut done);
    }

    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let row = |latency, measured: Vec<f64>, simulated: Vec<f64>| {
        let (m, s) = (sorted(measured), sorted(simulated));
        let p = |v: &[f64], q| percentile(v, q).unwrap_or(f64::NAN);
        Row {
            latency,
            measured_p50: p(&m, 50.0),
            simulated_p50: p(&s, 50.0),
            measured_p95: p(&m, 95.0),
            simulated_p95: p(&s, 95.0),
        }
    };
    let rows = vec![
        row("ttft", ok.iter().filter_map(|r| r.ttft()).collect(), done.iter().map(|f| f.ttft).collect()),
        row(
            "itl",
            ok.iter().flat_map(|r| r.itls()).collect(),
            done.iter().flat_map(|f| f.itls.iter().map(|&g| f64::from(g))).collect(),
        ),
    ];
    Some(Fidelity {
        requests: ok.len(),
        rate: if span > 0.0 { (ok.len() - 1) as f64 / span } else { 0.0 },
        failed: records.len() - ok.len(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: StepModel = StepModel {
        base_s: 0.004,
        per_decode_row_s: 0.001,
        per_prefill_token_s: 0.0005,
        per_context_token_s: 0.0,
    };
    const SETTINGS: Settings = Settings::new(16, 0.0);

    /// A request the way an engine running exactly `STEP` alone would have answered it.
    fn alone(sent: f64, prompt: usize, output: usize) -> RequestRecord {
        let first = sent + STEP.step_seconds(0.0, prompt as f64, 0.0);
        let gap = STEP.step_seconds(1.0, 0.0, 0.0);
        let content_events: Vec<f64> = (0..output).map(|i| first + gap * i as f64).collect();
        RequestRecord {
            scheduled: sent,
            sent,
            closed: content_events[output - 1],
            content_events,
            prompt_tokens: prompt,
            output_tokens: output,
            ..RequestRecord::default()
        }
    }

    #[test]
    fn an_engine_that_runs_as_its_profile_says_is_replayed_exactly() {
        // Requests far apart never share a step, so the simulated latencies are the profile's.
        let records: Vec<_> = (0..20).map(|i| alone(f64::from(i) * 2.0, 100, 10)).collect();
        let f = replay(STEP, &records, SETTINGS).expect("replayed");
        assert_eq!((f.requests, f.failed), (20, 0));
        assert!((f.rate - 0.5).abs() < 1e-9, "rate {}", f.rate);
        for row in &f.rows {
            let (e50, e95) = row.errors();
            assert!(e50.abs() < 1e-6 && e95.abs() < 1e-6, "{row:?}");
        }
    }

    #[test]
    fn a_slower_engine_shows_as_a_negative_error_and_failures_are_left_out() {
        let mut records: Vec<_> = (0..10).map(|i| alone(f64::from(i) * 2.0, 100, 10)).collect();
        for r in &mut records {
            // The real engine took twice as long for everything.
            let sent = r.sent;
            r.content_events.iter_mut().for_each(|t| *t = sent + 2.0 * (*t - sent));
        }
        records.push(RequestRecord {
            error: Some("connection reset".into()),
            sent: 1.0,
            ..RequestRecord::default()
        });
        let f = replay(STEP, &records, SETTINGS).expect("replayed");
        assert_eq!((f.requests, f.failed), (10, 1));
        let (e50, e95) = f.rows[0].errors();
        assert!((e50 + 0.5).abs() < 1e-6 && (e95 + 0.5).abs() < 1e-6, "{:?}", f.rows[0]);
    }

    #[test]
    fn requests_that_overlap_queue_behind_each_other_in_the_replay() {
        // Two requests at once with batch size 1: the second waits for the whole first one.
        let records = vec![alone(0.0, 100, 10), alone(0.0, 100, 10)];
        let one = Settings::new(1, 0.0);
        let f = replay(STEP, &records, one).expect("replayed");
        let own = STEP.step_seconds(0.0, 100.0, 0.0);
        let whole = own + 9.0 * STEP.step_seconds(1.0, 0.0, 0.0);
        assert!((f.rows[0].simulated_p95 - (own + 0.95 * whole)).abs() < 1e-6, "{:?}", f.rows[0]);
    }

    #[test]
    fn a_run_without_a_successful_request_has_no_comparison() {
        let failed = RequestRecord { error: Some("refused".into()), ..RequestRecord::default() };
        assert_eq!(replay(STEP, &[failed], SETTINGS), None);
    }
}
