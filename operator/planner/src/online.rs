//! Step models learnt online from the service's own metrics, for the tiers no profile covers (a
//! vLLM deployment, or `pacer-engine` before `pacer-engine profile` has run).
//!
//! Every running sequence gains one token per engine step, so over a window each replica's
//! mean step lasts `mean running / output tokens per second`, and carries `prompt tokens per
//! second × that` prompt tokens. Both figures are the window's: the running gauge averaged over
//! the rate window (`avg_over_time`), not its value at the last scrape, which on a small batch
//! swings from 0 to the whole batch between scrapes and made fits that predicted P95 TTFTs
//! twenty times what was measured. Each evaluation where every replica is ready, no rollout is under way
//! and sequences are running gives one such sample of (decode rows, prompt tokens, seconds).
//! A least-squares fit over the samples, with the coefficients kept non-negative and old
//! samples fading ([`FORGET`]), gives the step model the capacity model predicts with, and the
//! learned corrections then correct it as they correct a profile's.
//!
//! The fit is used once it has [`MIN_SAMPLES`] samples whose running batches span a factor of
//! [`MIN_SPAN`]: a fit of one batch size cannot tell the fixed cost of a step from its cost per
//! row, so it cannot say what a larger batch or another replica count would do. Until then the
//! planner acts on the percentiles alone (the reactive path).
//!
//! A ready fit is used only while it explains what is measured: on a window where the levers
//! were still and every replica ready, its corrected P95 TTFT and ITL for the configuration
//! running must lie within a factor of [`AGREEMENT`] of the measured ones ([`StepFit::agrees`]).
//! Mean steps cannot always tell a row's cost from a prompt token's: where every request has the
//! same prompt and answer lengths, prompt tokens per step rise with the rows and the fit may put
//! all the cost on either. Such a fit predicted a 64-token prompt's TTFT at 28 ms where 245 ms
//! was measured, and moved replicas back and forth on a steady load (local mode, 2 cores).

use crate::lsq::Normal;
use crate::observation::ServiceMetrics;
use crate::profile::StepModel;
use serde::{Deserialize, Serialize};

/// Weight of the samples before the newest, per sample: about the last 100 samples count.
pub const FORGET: f64 = 0.99;
/// Samples before a fit is used.
pub const MIN_SAMPLES: u32 = 8;
/// How far apart (a ratio) the smallest and largest running batch per replica must be before
/// a fit is used.
pub const MIN_SPAN: f64 = 1.5;
/// The fewest sequences running per replica for a sample: an idle engine's steps say nothing.
pub const MIN_RUNNING: f64 = 1.0;
/// How far (a ratio either way) a fit's corrected percentiles may be from the measured ones on
/// a still window for the fit to be used.
pub const AGREEMENT: f64 = 2.0;

/// The fit `seconds ≈ base + per_row·rows + per_token·prompt` over the samples, with fading
/// weights, and the range of batches seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFit {
    /// The normal equations over x = (1, rows, prompt tokens).
    normal: Normal<3>,
    /// Samples taken.
    pub samples: u32,
    /// Smallest and largest running batch per replica sampled.
    pub rows: Option<(f64, f64)>,
    /// Whether, on the last still window it was checked on, the fit's corrected percentiles
    /// came within [`AGREEMENT`] of the measured ones; false until it has been checked.
    #[serde(default)]
    pub agrees: bool,
}

/// One mean step of one replica, as the window's rates show it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Sequences in the running batch.
    pub rows: f64,
    /// Prompt tokens the step carries.
    pub prompt_tokens: f64,
    /// Seconds the step lasts.
    pub seconds: f64,
}

impl StepSample {
    /// The mean step per replica in `metrics` over `replicas` ready replicas; `None` when too
    /// few sequences run or a figure is missing or implausible.
    pub fn from_metrics(metrics: &ServiceMetrics, replicas: i32) -> Option<StepSample> {
        let n = f64::from(replicas.max(1));
        let rows = metrics.running_mean.filter(|r| r.is_finite())? / n;
        let output = metrics.output_token_rate.filter(|r| r.is_finite())? / n;
        let prompt = metrics.prompt_token_rate.filter(|r| r.is_finite() && *r >= 0.0)? / n;
        if rows < MIN_RUNNING || output <= 0.0 {
            return None;
        }
        let seconds = rows / output;
        // A step over a minute is no decode step: the gauges and the rates disagree.
        (seconds.is_finite() && seconds < 60.0).then_some(StepSample {
            rows,
            prompt_tokens: prompt * seconds,
            seconds,
        })
    }
}

impl StepFit {
    /// Adds a sample; older ones fade by [`FORGET`].
    pub fn add(&mut self, s: StepSample) {
        self.normal.add([1.0, s.rows, s.prompt_tokens], s.seconds, FORGET);
        self.samples = self.samples.saturating_add(1);
        self.rows = Some(match self.rows {
            Some((lo, hi)) => (lo.min(s.rows), hi.max(s.rows)),
            None => (s.rows, s.rows),
        });
    }

    /// Records whether the fit explains a still window: its corrected percentiles `predicted`
    /// against the `measured` ones, as (TTFT, ITL) seconds.
    pub fn check(&mut self, predicted: (f64, f64), measured: (f64, f64)) {
        let within = |p: f64, m: f64| {
            p.is_finite() && p > 0.0 && m > 0.0 && (1.0 / AGREEMENT..=AGREEMENT).contains(&(p / m))
        };
        self.agrees = within(predicted.0, measured.0) && within(predicted.1, measured.1);
    }

    /// Whether the fit has enough samples over a wide enough range of batches to be used.
    pub fn ready(&self) -> bool {
        self.samples >= MIN_SAMPLES && self.rows.is_some_and(|(lo, hi)| lo > 0.0 && hi >= MIN_SPAN * lo)
    }

    /// The step model, when [`StepFit::ready`]: the non-negative least-squares coefficients,
    /// with a step that takes some time.
    pub fn model(&self) -> Option<StepModel> {
        if !self.ready() {
            return None;
        }
        let [base, per_row, per_token] = self.normal.fit(|c| c[0] + c[1] > 0.0)?;
        Some(StepModel {
            base_s: base,
            per_decode_row_s: per_row,
            per_prefill_token_s: per_token,
            per_context_token_s: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rows: f64, prompt: f64, truth: &StepModel) -> StepSample {
        StepSample { rows, prompt_tokens: prompt, seconds: truth.step_seconds(rows, prompt, 0.0) }
    }

    #[test]
    fn a_fit_over_a_range_of_batches_finds_the_step_model() {
        let truth = StepModel {
            base_s: 0.007,
            per_decode_row_s: 0.0001,
            per_prefill_token_s: 0.00003,
            per_context_token_s: 0.0,
        };
        let mut fit = StepFit::default();
        for (i, rows) in [8.0, 12.0, 16.0, 24.0, 32.0, 20.0, 10.0, 28.0, 14.0].into_iter().enumerate() {
            fit.add(sample(rows, 50.0 + 13.0 * i as f64, &truth));
        }
        let m = fit.model().expect("ready");
        assert!((m.base_s - 0.007).abs() < 1e-6, "{m:?}");
        assert!((m.per_decode_row_s - 0.0001).abs() < 1e-7, "{m:?}");
        assert!((m.per_prefill_token_s - 0.00003).abs() < 1e-8, "{m:?}");
    }

    #[test]
    fn one_batch_size_is_not_enough_and_the_coefficients_stay_non_negative() {
        let truth = StepModel {
            base_s: 0.01,
            per_decode_row_s: 0.0,
            per_prefill_token_s: 0.0,
            per_context_token_s: 0.0,
        };
        let mut fit = StepFit::default();
        for _ in 0..20 {
            fit.add(sample(8.0, 100.0, &truth));
        }
        assert!(!fit.ready() && fit.model().is_none(), "a single batch size says nothing of a larger one");
        // Noise that would give a negative per-token cost: the fit keeps it at zero.
        for (rows, prompt, seconds) in [(12.0, 10.0, 0.0125), (16.0, 400.0, 0.012), (24.0, 20.0, 0.016)] {
            fit.add(StepSample { rows, prompt_tokens: prompt, seconds });
        }
        let m = fit.model().expect("ready");
        assert!(m.base_s >= 0.0 && m.per_decode_row_s >= 0.0 && m.per_prefill_token_s >= 0.0, "{m:?}");
    }

    #[test]
    fn a_fit_is_used_only_while_it_explains_what_is_measured() {
        let mut fit = StepFit::default();
        assert!(!fit.agrees, "unchecked");
        fit.check((0.3, 0.02), (0.25, 0.015));
        assert!(fit.agrees);
        // 28 ms predicted where 245 ms was measured: a prefill the fit cannot see.
        fit.check((0.028, 0.015), (0.245, 0.015));
        assert!(!fit.agrees);
        fit.check((0.3, 0.05), (0.25, 0.015));
        assert!(!fit.agrees, "ITL three times what was measured");
        fit.check((f64::INFINITY, 0.02), (0.25, 0.015));
        assert!(!fit.agrees, "unstable where the engines kept up");
    }

    #[test]
    fn a_sample_is_the_mean_step_of_one_replica() {
        let mut m = ServiceMetrics::missing();
        m.running = Some(0.0);
        m.running_mean = Some(32.0);
        m.output_token_rate = Some(1600.0);
        m.prompt_token_rate = Some(4000.0);
        let s = StepSample::from_metrics(&m, 2).expect("sample");
        // 16 rows per replica at 800 tokens/s: a 20 ms step carrying 40 prompt tokens.
        assert!((s.rows - 16.0).abs() < 1e-9 && (s.seconds - 0.02).abs() < 1e-12);
        assert!((s.prompt_tokens - 40.0).abs() < 1e-9);
        m.running_mean = Some(0.5);
        assert_eq!(StepSample::from_metrics(&m, 2), None, "an idle engine says nothing");
        m.running_mean = None;
        m.running = Some(32.0);
        assert_eq!(StepSample::from_metrics(&m, 2), None, "the gauge of one instant is no window's mean");
        m.running_mean = Some(f64::NAN);
        assert_eq!(StepSample::from_metrics(&m, 2), None);
    }
}
