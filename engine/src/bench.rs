//! The model-core microbenchmark behind `pacer-engine bench`: prefill and decode throughput of
//! the batched forward at one tier, on synthetic token ids that a peer engine can replay exactly
//! (`scripts/bench-core.py` runs llama.cpp on the same ids, side by side).

use crate::error::EngineError;
use crate::model::{Model, SeqCache, SeqStep};
use serde::Serialize;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// Prompt lengths for the prefill measurements.
    pub prefill_lengths: Vec<usize>,
    /// Batch sizes for the decode measurements (1 = single stream).
    pub batch_sizes: Vec<usize>,
    /// Prompt tokens per sequence before decode starts.
    pub decode_context: usize,
    /// Decode steps timed per batch size.
    pub decode_steps: usize,
    /// Repetitions; the median is reported.
    pub repeats: usize,
}

impl Default for BenchPlan {
    fn default() -> Self {
        BenchPlan {
            prefill_lengths: vec![128, 512],
            batch_sizes: vec![1, 4, 8, 16],
            decode_context: 32,
            decode_steps: 32,
            repeats: 3,
        }
    }
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct BenchFigure {
    /// `prefill` or `decode`.
    pub phase: &'static str,
    /// Prompt length (prefill) or batch size (decode).
    pub size: usize,
    /// Median tokens per second (aggregate over the batch for decode).
    pub tokens_per_second: f64,
}

/// Deterministic pseudo-random token ids in `[100, vocab)`, clear of the special tokens at the
/// start of common vocabularies. `scripts/bench-core.py` generates the same ids.
pub fn synthetic_tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (100 + (state >> 33) % (vocab as u64 - 100)) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `plan` on `model`, calling `progress` after each measurement.
pub fn run(
    model: &Model,
    plan: &BenchPlan,
    mut progress: impl FnMut(&str),
) -> Result<Vec<BenchFigure>, EngineError> {
    let vocab = model.config.vocab_size;
    let max_b = plan.batch_sizes.iter().copied().max().unwrap_or(1);
    let max_len = plan.prefill_lengths.iter().copied().max().unwrap_or(0);
    // Each sequence holds whole blocks: size the pool in them, not in tokens.
    let per_seq = (plan.decode_context + plan.decode_steps + 1).next_multiple_of(crate::model::BLOCK_TOKENS);
    let mut kv = model.new_kv_cache((max_b * per_seq).max(max_len + 1))?;
    let mut figures = Vec::new();
    // One untimed pass warms caches, page tables and the thread pool.
    let warm = synthetic_tokens(16, 99, vocab);
    let mut seq = SeqCache::new();
    model.forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens: &warm, logits: true }])?;
    kv.release(&mut seq);

    for &len in &plan.prefill_lengths {
        let prompt = synthetic_tokens(len, len as u64, vocab);
        let mut rates = Vec::new();
        for _ in 0..plan.repeats {
            let mut seq = SeqCache::new();
            let t = Instant::now();
            model.forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens: &prompt, logits: true }])?;
            rates.push(len as f64 / t.elapsed().as_secs_f64());
            kv.release(&mut seq);
        }
        figures.push(BenchFigure { phase: "prefill", size: len, tokens_per_second: median(rates) });
        progress(&format!("prefill {len}"));
    }

    for &b in &plan.batch_sizes {
        let mut rates = Vec::new();
        for _ in 0..plan.repeats {
            let mut seqs: Vec<SeqCache> = (0..b).map(|_| SeqCache::new()).collect();
            let prompts: Vec<Vec<u32>> =
                (0..b).map(|i| synthetic_tokens(plan.decode_context, 1000 + i as u64, vocab)).collect();
            {
                let mut steps: Vec<SeqStep<'_>> = seqs
                    .iter_mut()
                    .zip(&prompts)
                    .map(|(cache, p)| SeqStep { cache, tokens: p, logits: true })
                    .collect();
                model.forward(&mut kv, &mut steps)?;
            }
            // Decode a fixed token stream (the ids matter little for timing; sampling is not
            // part of the model core).
            let next: Vec<Vec<u32>> =
                (0..b).map(|i| synthetic_tokens(plan.decode_steps, 7 + i as u64, vocab)).collect();
            let t = Instant::now();
            for step in 0..plan.decode_steps {
                let mut steps: Vec<SeqStep<'_>> = seqs
                    .iter_mut()
                    .zip(&next)
                    .map(|(cache, n)| SeqStep { cache, tokens: &n[step..step + 1], logits: true })
                    .collect();
                model.forward(&mut kv, &mut steps)?;
            }
            rates.push((b * plan.decode_steps) as f64 / t.elapsed().as_secs_f64());
            for s in &mut seqs {
                kv.release(s);
            }
        }
        figures.push(BenchFigure { phase: "decode", size: b, tokens_per_second: median(rates) });
        progress(&format!("decode B={b}"));
    }
    Ok(figures)
}
