//! `pacer-engine profile`: how long one scheduler step takes at one tier on this machine, and
//! what the tier costs in quality. Whole steps (decode rows, prompt chunks, and both mixed) go
//! through the same batched [`Model::forward`] the server runs; a linear step model is fitted
//! to them; the tier's next-token distributions are compared with the `f32` tier's on a fixed
//! text. The result is an [`EngineProfile`]: the planner's type (`pacer_planner::profile`,
//! re-exported here), so the file the engine writes and the one the planner reads have one
//! definition.

use crate::bench::synthetic_tokens;
use crate::error::EngineError;
use crate::model::{KvCache, Model, SeqCache, SeqStep, Tier};
use crate::{LoadedModel, Tokenizer};
pub use pacer_planner::profile::{EngineProfile, PROFILE_SCHEMA, Quality, StepModel, StepSample};
use std::path::Path;
use std::time::Instant;

/// The text quality is measured on: the opening of *Pride and Prejudice* (Jane Austen, 1813,
/// public domain), ~430 tokens of plain English prose.
pub const QUALITY_TEXT: &str = include_str!("../../config/profiles/quality-text.txt");

/// The tier every other tier is compared with.
pub const REFERENCE_TIER: Tier = Tier::F32;

/// A decode-and-prefill step shape to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Decode rows.
    pub rows: usize,
    /// Cached tokens per decode row before the step.
    pub context: usize,
    /// Prompt tokens of one fresh sequence in the same step (0: none).
    pub chunk: usize,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct ProfilePlan {
    /// Steps to time.
    pub shapes: Vec<StepShape>,
    /// Timed repetitions per shape, after one untimed warm-up; the median is kept.
    pub repeats: usize,
    /// Positions of [`QUALITY_TEXT`] compared (`None`: all of it).
    pub quality_tokens: Option<usize>,
}

impl ProfilePlan {
    /// The grid the committed profiles use: decode at 1–32 rows × 64/256/1024 tokens of
    /// context, prompt chunks of 16–512 tokens alone, and decode rows sharing a step with a
    /// chunk (what continuous batching runs while a prompt arrives).
    pub fn full() -> Self {
        Self::grid(
            &[1, 2, 4, 8, 16, 32],
            &[64, 256, 1024],
            &[16, 64, 128, 256, 512],
            &[(4, 64), (4, 256), (16, 64), (16, 256)],
            256,
            5,
            None,
        )
    }

    /// A small grid and a short text, for tests; too coarse to plan with.
    pub fn quick() -> Self {
        Self::grid(&[1, 4, 16], &[32, 128], &[16, 64], &[(4, 32)], 32, 3, Some(48))
    }

    fn grid(
        rows: &[usize],
        contexts: &[usize],
        chunks: &[usize],
        mixed: &[(usize, usize)],
        mixed_context: usize,
        repeats: usize,
        quality_tokens: Option<usize>,
    ) -> Self {
        let mut shapes = Vec::new();
        for &context in contexts {
            shapes.extend(rows.iter().map(|&rows| StepShape { rows, context, chunk: 0 }));
        }
        shapes.extend(chunks.iter().map(|&chunk| StepShape { rows: 0, context: 0, chunk }));
        shapes.extend(mixed.iter().map(|&(rows, chunk)| StepShape { rows, context: mixed_context, chunk }));
        ProfilePlan { shapes, repeats, quality_tokens }
    }
}

/// Why profiling failed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The samples do not determine a physical step model.
    #[error("fitting the step model: {0}")]
    Fit(String),
}

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
/// 500 ms prompt chunk: the planner needs both ITL and TTFT right.
///
/// With four coefficients the exact non-negative optimum is found by solving the unconstrained
/// problem on every subset of coefficients (the rest held at 0) and keeping the best feasible
/// one: the constrained optimum is the unconstrained optimum of its own support. `None` when
/// no subset gives a model with a positive time per step.
pub fn fit_step_model(samples: &[StepSample]) -> Option<Fit> {
    let rows: Vec<([f64; 4], f64)> = samples
        .iter()
        .filter(|s| s.seconds > 0.0 && s.seconds.is_finite())
        .map(|s| (features(s).map(|x| x / s.seconds), 1.0))
        .collect();
    let mut best: Option<([f64; 4], f64)> = None;
    for support in 1u32..16 {
        let idx: Vec<usize> = (0..4).filter(|i| support & (1 << i) != 0).collect();
        let Some(sub) = least_squares(&rows, &idx) else { continue };
        if sub.iter().any(|c| *c < 0.0 || !c.is_finite()) {
            continue;
        }
        let mut coef = [0.0; 4];
        for (&i, c) in idx.iter().zip(sub) {
            coef[i] = c;
        }
        if coef[0] + coef[1] <= 0.0 {
            continue;
        }
        let loss: f64 = rows.iter().map(|(x, y)| (dot4(x, &coef) - y).powi(2)).sum();
        if best.is_none_or(|(_, l)| loss < l) {
            best = Some((coef, loss));
        }
    }
    let (c, _) = best?;
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

fn dot4(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Least squares `min ‖X_S β − y‖` over the columns `idx` of `rows`, through the normal
/// equations. Columns are scaled to unit norm first: token counts reach 10⁴ while the constant
/// column is 1, and unscaled normal equations would lose most of their precision.
fn least_squares(rows: &[([f64; 4], f64)], idx: &[usize]) -> Option<Vec<f64>> {
    let n = idx.len();
    let scale: Vec<f64> =
        idx.iter().map(|&i| rows.iter().map(|(x, _)| x[i] * x[i]).sum::<f64>().sqrt()).collect();
    if scale.contains(&0.0) {
        return None;
    }
    // Augmented matrix [XᵀX | Xᵀy] of the scaled columns.
    let mut a = vec![vec![0.0; n + 1]; n];
    for (x, y) in rows {
        for r in 0..n {
            let xr = x[idx[r]] / scale[r];
            for c in 0..n {
                a[r][c] += xr * x[idx[c]] / scale[c];
            }
            a[r][n] += xr * y;
        }
    }
    // Gaussian elimination with partial pivoting; a (near-)singular system means the samples
    // do not separate these coefficients.
    for col in 0..n {
        let pivot = (col..n).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|r| a[r][n] / a[r][r] / scale[r]).collect())
}

/// Natural-log softmax of `logits`, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&l| l as f64 - log_z).collect()
}

/// KL(p ‖ q) in nats of the distributions with logits `reference` (p) and `other` (q).
/// Identical logits give exactly 0.
pub fn kl_divergence(reference: &[f32], other: &[f32]) -> f64 {
    let lp = log_softmax(reference);
    let lq = log_softmax(other);
    lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum()
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold(0, |best, (i, &l)| if l > logits[best] { i } else { best })
}

/// Teacher-forces `tokens` through `reference` and `model` one position at a time and
/// compares their next-token distributions at every position.
pub fn compare_tiers(
    reference: &Model,
    model: &Model,
    tokens: &[u32],
    mut progress: impl FnMut(),
) -> Result<Quality, EngineError> {
    let mut runs = Vec::with_capacity(2);
    for m in [reference, model] {
        runs.push((m, m.new_kv_cache(tokens.len() + 1)?, SeqCache::new()));
    }
    let (mut agree, mut kl) = (0usize, 0.0);
    for token in tokens {
        let mut logits = Vec::with_capacity(2);
        for (m, kv, seq) in &mut runs {
            let step = SeqStep { cache: seq, tokens: std::slice::from_ref(token), logits: true };
            let out = m.forward(kv, &mut [step])?.pop().flatten();
            logits.push(out.ok_or_else(|| EngineError::model("the forward returned no logits"))?);
        }
        agree += usize::from(argmax(&logits[0]) == argmax(&logits[1]));
        kl += kl_divergence(&logits[0], &logits[1]);
        progress();
    }
    let n = tokens.len().max(1) as f64;
    Ok(Quality {
        reference_tier: reference.tier.to_string(),
        tokens: tokens.len() as u32,
        top1_agreement: agree as f64 / n,
        mean_kl: kl / n,
    })
}

/// The tokens of [`QUALITY_TEXT`] that `plan` compares.
pub fn quality_tokens(tokenizer: &Tokenizer, plan: &ProfilePlan) -> Result<Vec<u32>, EngineError> {
    let mut tokens = tokenizer.encode(QUALITY_TEXT)?;
    if let Some(n) = plan.quality_tokens {
        tokens.truncate(n);
    }
    Ok(tokens)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Gives `seq` (empty) the first `len` cached tokens of `template`, copied block by block.
/// Attention reads the cache the same way whatever it holds, so a decode row at context `len`
/// costs what it costs in serving; copying real keys and values (rather than leaving the pool
/// zeroed, whose untouched pages the OS maps to one shared zero page) keeps the memory traffic
/// real, and is far cheaper than prefilling 32 sequences of 1024 tokens through the model.
fn fill_context(
    model: &Model,
    kv: &mut KvCache,
    template: &SeqCache,
    seq: &mut SeqCache,
    len: usize,
) -> Result<(), EngineError> {
    debug_assert!(seq.is_empty() && len <= template.len());
    kv.reserve(seq, len)?;
    let hd = model.config.head_dim;
    let mut key = vec![0f32; hd];
    for layer in 0..kv.layers() {
        for head in 0..model.config.kv_heads {
            let values: Vec<f32> =
                kv.blocks_of(layer, template, head, len).flat_map(|b| b.values.iter().copied()).collect();
            for pos in 0..len {
                kv.read_key(layer, template, pos, head, &mut key);
                kv.write(layer, seq, pos, head, &key, &values[pos * hd..(pos + 1) * hd]);
            }
        }
    }
    seq.advance(len);
    Ok(())
}

/// Times `shape`: one untimed warm-up step, then `repeats` timed ones; keeps the median. Decode
/// rows advance one token per step, so the context recorded is the mean over the timed steps.
fn measure(
    model: &Model,
    kv: &mut KvCache,
    template: &SeqCache,
    shape: StepShape,
    repeats: usize,
) -> Result<StepSample, EngineError> {
    let vocab = model.config.vocab_size;
    let mut seqs: Vec<SeqCache> = (0..shape.rows).map(|_| SeqCache::new()).collect();
    for s in &mut seqs {
        fill_context(model, kv, template, s, shape.context)?;
    }
    let next = synthetic_tokens(shape.rows, 7 + shape.context as u64, vocab);
    let chunk = synthetic_tokens(shape.chunk, 11 + shape.chunk as u64, vocab);
    let (mut times, mut context) = (Vec::new(), 0usize);
    for rep in 0..=repeats {
        let attended: usize = seqs.iter().map(|s| s.len() + 1).sum();
        let mut prompt = SeqCache::new();
        let mut steps: Vec<SeqStep<'_>> = seqs
            .iter_mut()
            .zip(&next)
            .map(|(cache, t)| SeqStep { cache, tokens: std::slice::from_ref(t), logits: true })
            .collect();
        if shape.chunk > 0 {
            // The chunk that completes a prompt computes logits (its first token); that is the
            // chunk on the TTFT path.
            steps.push(SeqStep { cache: &mut prompt, tokens: &chunk, logits: true });
        }
        let started = Instant::now();
        model.forward(kv, &mut steps)?;
        let took = started.elapsed();
        drop(steps);
        kv.release(&mut prompt);
        if rep > 0 {
            times.push(took.as_secs_f64());
            context += attended;
        }
    }
    for s in &mut seqs {
        kv.release(s);
    }
    let context = if shape.rows == 0 { 0 } else { (context as f64 / repeats as f64).round() as u32 };
    Ok(StepSample {
        decode_rows: shape.rows as u32,
        prefill_tokens: shape.chunk as u32,
        context_tokens: context,
        seconds: median(times),
    })
}

/// Times every shape of `plan` on `model`, calling `progress` after each.
pub fn measure_steps(
    model: &Model,
    plan: &ProfilePlan,
    mut progress: impl FnMut(&StepSample),
) -> Result<Vec<StepSample>, EngineError> {
    let repeats = plan.repeats.max(1);
    let max_context = plan.shapes.iter().map(|s| s.context).max().unwrap_or(0);
    let max_rows = plan.shapes.iter().map(|s| s.rows).max().unwrap_or(0);
    let max_chunk = plan.shapes.iter().map(|s| s.chunk).max().unwrap_or(0);
    // The template, the decode rows grown by every step, and one prompt, each rounded up to
    // whole blocks.
    let block = crate::model::BLOCK_TOKENS;
    let per_row = (max_context + repeats + 1).div_ceil(block) * block;
    let kv_tokens = (max_context + block) + max_rows * per_row + max_chunk + block;
    let mut kv = model.new_kv_cache(kv_tokens)?;
    // One sequence really prefilled to the longest context; the rows copy its cache.
    let mut template = SeqCache::new();
    let prompt = synthetic_tokens(max_context, 5, model.config.vocab_size);
    for part in prompt.chunks(256) {
        model.forward(&mut kv, &mut [SeqStep { cache: &mut template, tokens: part, logits: false }])?;
    }
    let mut samples = Vec::with_capacity(plan.shapes.len());
    for &shape in &plan.shapes {
        let sample = measure(model, &mut kv, &template, shape, repeats)?;
        progress(&sample);
        samples.push(sample);
    }
    Ok(samples)
}

/// The CPU's model name (Linux `/proc/cpuinfo`), or the architecture where that is not known.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH))
}

/// What [`profile`] reports as it goes.
#[derive(Debug)]
pub enum Progress<'a> {
    /// The model is loaded and warmed up; `steps` shapes and `positions` quality positions follow.
    Loaded {
        /// Step shapes to time.
        steps: usize,
        /// Quality positions to compare.
        positions: usize,
    },
    /// One step shape was timed.
    Step(&'a StepSample),
    /// The reference tier is being loaded.
    LoadingReference,
    /// One quality position was compared.
    Position,
}

/// Profiles `path` at `tier` with the compute pool already sized to `threads`: load, warm-up,
/// the step grid, the fit, and quality against [`REFERENCE_TIER`].
pub fn profile(
    path: &Path,
    tier: Tier,
    threads: usize,
    plan: &ProfilePlan,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<(EngineProfile, Fit), ProfileError> {
    let started = Instant::now();
    let loaded = LoadedModel::open(path, tier)?;
    let load_seconds = started.elapsed().as_secs_f64();
    let model = &loaded.model;

    // The first forward pays for page faults in the weights and the KV pool, and for the
    // compute threads' start: what a fresh replica's first request sees.
    let warm = synthetic_tokens(16, 99, model.config.vocab_size);
    let mut kv = model.new_kv_cache(warm.len())?;
    let mut seq = SeqCache::new();
    let started = Instant::now();
    model.forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens: &warm, logits: true }])?;
    let warmup_seconds = started.elapsed().as_secs_f64();
    drop(kv);

    let tokens = quality_tokens(&loaded.tokenizer, plan)?;
    progress(Progress::Loaded { steps: plan.shapes.len(), positions: tokens.len() });
    let samples = measure_steps(model, plan, |s| progress(Progress::Step(s)))?;
    let fit = fit_step_model(&samples)
        .ok_or_else(|| ProfileError::Fit(format!("no non-negative fit to {} samples", samples.len())))?;

    progress(Progress::LoadingReference);
    // Loaded again even for the f32 tier itself: agreement 1 and KL 0 then check that the
    // comparison and the forward are deterministic.
    let reference = Model::load(path, REFERENCE_TIER)?;
    let quality = compare_tiers(&reference, model, &tokens, || progress(Progress::Position))?;

    let profile = EngineProfile {
        schema: PROFILE_SCHEMA,
        model: path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        tier: tier.to_string(),
        threads: threads as u32,
        device: cpu_name(),
        load_seconds,
        warmup_seconds,
        step: fit.model,
        samples,
        quality: Some(quality),
    };
    Ok((profile, fit))
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

    #[test]
    fn kl_and_top1_maths() {
        let p = [2.0f32, 1.0, 0.0];
        assert_eq!(kl_divergence(&p, &p), 0.0);
        // Shifting every logit does not change the distribution.
        let shifted = p.map(|l| l + 3.0);
        assert!(kl_divergence(&p, &shifted).abs() < 1e-12);
        // Against a uniform q over 3 tokens, KL(p‖q) = ln 3 − H(p).
        let q = [0.0f32; 3];
        let probs: Vec<f64> = log_softmax(&p).iter().map(|l| l.exp()).collect();
        let entropy: f64 = -probs.iter().map(|x| x * x.ln()).sum::<f64>();
        assert!((kl_divergence(&p, &q) - (3f64.ln() - entropy)).abs() < 1e-12);
        // KL is not symmetric, and positive when the distributions differ.
        let r = [0.0f32, 1.0, 2.0];
        assert!(kl_divergence(&p, &r) > 0.5);
        assert!((log_softmax(&p).iter().map(|l| l.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(argmax(&p), 0);
        assert_eq!(argmax(&r), 2);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }

    #[test]
    fn the_plans_cover_every_kind_of_step() {
        for plan in [ProfilePlan::full(), ProfilePlan::quick()] {
            assert!(plan.shapes.iter().any(|s| s.rows > 0 && s.chunk == 0));
            assert!(plan.shapes.iter().any(|s| s.rows == 0 && s.chunk > 0));
            assert!(plan.shapes.iter().any(|s| s.rows > 0 && s.chunk > 0));
        }
        assert_eq!(ProfilePlan::full().shapes.len(), 18 + 5 + 4);
    }
}
