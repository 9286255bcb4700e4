//! `pacer-engine profile`: how long one scheduler step takes at one tier on this machine, and
//! what the tier costs in quality. Whole steps (decode rows, prompt chunks, and both mixed) go
//! through the same batched [`Model::forward`] the server runs; a linear step model is fitted
//! to them; the tier's next-token distributions are compared with the `f32` tier's on a fixed
//! text. The result is an [`EngineProfile`]: the contract's type (`pacer_engine_api::profile`,
//! re-exported here), so the file the engine writes and the one the planner reads have one
//! definition.

use crate::LoadedModel;
use crate::bench::synthetic_tokens;
use crate::error::EngineError;
use crate::model::{KvCache, Model, SeqCache, SeqStep, Tier};
pub use pacer_engine_api::profile::{EngineProfile, PROFILE_SCHEMA, Quality, StepModel, StepSample};
use std::path::Path;
use std::time::Instant;

pub mod fit;
pub mod quality;

pub use fit::{Fit, fit_step_model, relative_errors};
pub use quality::{argmax, compare_tiers, kl_divergence, log_softmax, quality_tokens};

/// The text quality is measured on: the opening of *Pride and Prejudice* (Jane Austen, 1813,
/// public domain), ~430 tokens of plain English prose.
pub const QUALITY_TEXT: &str = include_str!("../../../config/profiles/quality-text.txt");

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
        tier,
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
