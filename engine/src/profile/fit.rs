//! The step-time model fitted to measured steps: non-negative least squares on relative
//! residuals, and how well the fit matches its samples.

use super::{StepModel, StepSample};
use pacer_engine_api::lsq::Normal;

/// A fitted step model and how well it matches its samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// The coefficients, all non-negative.
    pub model: StepModel,
    /// Mean of |predicted − measured| / measured over the samples.
    pub mean_relative_error: f64,
    /// Largest |predicted − measured| / measured.
    pub max_relative_error: f64,
}

fn features(s: &StepSample) -> [f64; 4] {
    [1.0, f64::from(s.decode_rows), f64::from(s.prefill_tokens), f64::from(s.context_tokens)]
}

/// Fits [`StepModel`] to `samples` by non-negative least squares on relative residuals
/// (`Σ ((predicted − measured) / measured)²`), so a 5 ms decode step weighs as much as a
/// 500 ms prompt chunk: the planner needs both ITL and TTFT right. The fit is the planner's
/// ([`pacer_engine_api::lsq`]); `None` when no subset of the coefficients gives a model with a
/// positive time per step.
pub fn fit_step_model(samples: &[StepSample]) -> Option<Fit> {
    let mut normal = Normal::<4>::default();
    for s in samples.iter().filter(|s| s.seconds > 0.0 && s.seconds.is_finite()) {
        normal.add(features(s).map(|x| x / s.seconds), 1.0, 1.0);
    }
    let c = normal.fit(|c| c[0] + c[1] > 0.0)?;
    let model = StepModel {
        base_s: c[0],
        per_decode_row_s: c[1],
        per_prefill_token_s: c[2],
        per_context_token_s: c[3],
    };
    let (mean_relative_error, max_relative_error) = relative_errors(&model, samples);
    Some(Fit { model, mean_relative_error, max_relative_error })
}

/// Mean and largest |predicted − measured| / measured of `model` over `samples`.
pub fn relative_errors(model: &StepModel, samples: &[StepSample]) -> (f64, f64) {
    let errors: Vec<f64> =
        samples.iter().map(|s| ((model.predict(s) - s.seconds) / s.seconds).abs()).collect();
    let mean = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    (mean, errors.iter().copied().fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rows: u32, prefill: u32, context: u32, model: &StepModel) -> StepSample {
        let mut s =
            StepSample { decode_rows: rows, prefill_tokens: prefill, context_tokens: context, seconds: 0.0 };
        s.seconds = model.predict(&s);
        s
    }

    fn grid(model: &StepModel) -> Vec<StepSample> {
        let mut v = Vec::new();
        for rows in [1, 2, 4, 8, 16, 32] {
            for ctx in [64, 256, 1024] {
                v.push(sample(rows, 0, rows * ctx, model));
            }
        }
        for chunk in [16, 64, 128, 256, 512] {
            v.push(sample(0, chunk, 0, model));
        }
        v.push(sample(4, 64, 4 * 256, model));
        v.push(sample(16, 256, 16 * 256, model));
        v
    }

    fn loss(model: &StepModel, samples: &[StepSample]) -> f64 {
        samples.iter().map(|s| ((model.predict(s) - s.seconds) / s.seconds).powi(2)).sum()
    }

    #[test]
    fn the_fit_recovers_known_coefficients() {
        let truth = StepModel {
            base_s: 4e-3,
            per_decode_row_s: 6e-4,
            per_prefill_token_s: 1.5e-3,
            per_context_token_s: 2e-7,
        };
        let fit = fit_step_model(&grid(&truth)).unwrap();
        let (got, want) = (fit.model, truth);
        for (g, w) in [
            (got.base_s, want.base_s),
            (got.per_decode_row_s, want.per_decode_row_s),
            (got.per_prefill_token_s, want.per_prefill_token_s),
            (got.per_context_token_s, want.per_context_token_s),
        ] {
            assert!((g - w).abs() <= 1e-9 * w.max(1e-3), "fitted {got:?}, expected {want:?}");
        }
        assert!(fit.max_relative_error < 1e-9, "{fit:?}");
    }

    #[test]
    fn the_fit_tolerates_noise() {
        let truth = StepModel {
            base_s: 3e-3,
            per_decode_row_s: 5e-4,
            per_prefill_token_s: 1e-3,
            per_context_token_s: 1e-7,
        };
        // ±4 % multiplicative, deterministic.
        let noisy: Vec<StepSample> = grid(&truth)
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.seconds *= 1.0 + 0.04 * [1.0, -1.0, 0.5, -0.5][i % 4];
                s
            })
            .collect();
        let fit = fit_step_model(&noisy).unwrap();
        assert!(fit.mean_relative_error < 0.05 && fit.max_relative_error < 0.1, "{fit:?}");
        assert!((fit.model.per_prefill_token_s / truth.per_prefill_token_s - 1.0).abs() < 0.1, "{fit:?}");
        assert!((fit.model.per_decode_row_s / truth.per_decode_row_s - 1.0).abs() < 0.2, "{fit:?}");
    }

    #[test]
    fn a_coefficient_the_data_push_negative_is_clamped_to_zero() {
        // Context makes steps *faster* here: unphysical, so the unconstrained fit would give
        // a negative coefficient.
        let truth = StepModel {
            base_s: 5e-3,
            per_decode_row_s: 1e-3,
            per_prefill_token_s: 1e-3,
            per_context_token_s: -1e-7,
        };
        let samples = grid(&truth);
        let fit = fit_step_model(&samples).unwrap();
        let m = fit.model;
        assert_eq!(m.per_context_token_s, 0.0, "{m:?}");
        assert!(m.base_s >= 0.0 && m.per_decode_row_s > 0.0 && m.per_prefill_token_s > 0.0, "{m:?}");
        // Optimal (KKT): the loss does not fall when the clamped coefficient rises, nor when
        // any free coefficient moves either way.
        let at = loss(&m, &samples);
        let nudge = |f: &dyn Fn(&mut StepModel)| {
            let mut n = m;
            f(&mut n);
            loss(&n, &samples)
        };
        assert!(nudge(&|n| n.per_context_token_s += 1e-10) >= at);
        for d in [1e-7, -1e-7] {
            assert!(nudge(&|n| n.base_s += d) >= at);
            assert!(nudge(&|n| n.per_decode_row_s += d * 0.1) >= at);
            assert!(nudge(&|n| n.per_prefill_token_s += d * 0.01) >= at);
        }
    }

    #[test]
    fn no_fit_without_samples() {
        assert_eq!(fit_step_model(&[]), None);
    }
}
