//! The batched forward step: B sequences, each contributing a run of new tokens at its own
//! position (a prompt chunk or one decode token), go through every layer together. All rows
//! share each weight matmul; attention runs per (sequence, head) over that sequence's own paged
//! KV cache, which makes the causal mask implicit (a row only sees its own sequence, up to its
//! own position).

use super::candle_backend::SeqRows;
use super::kv::{KvBlock, KvCache, SeqCache};
use super::load::Weights;
use super::{Backend, Model};
use crate::error::EngineError;
use crate::kernels::{
    TILE, add_in_place, matmul, pv_tile, rms_norm, rope_in_place, score_tile, silu_mul, softmax_in_place,
};
use rayon::prelude::*;

/// One sequence's part of a step.
#[derive(Debug)]
pub struct SeqStep<'a> {
    /// The sequence's cache; its length is the position of the first new token.
    pub cache: &'a mut SeqCache,
    /// New tokens to append (a prompt chunk, or the last sampled token when decoding).
    pub tokens: &'a [u32],
    /// Whether to compute next-token logits after the last of `tokens`.
    pub logits: bool,
}

/// Rows at and above which a step's row-wise operations (RMSNorm, SwiGLU) split over the pool:
/// a prompt chunk's hundreds of rows, whose serial pass left the other threads idle for a tenth
/// of a prefill; a decode batch's few rows cost less than the fork.
const PARALLEL_ROWS: usize = 64;

/// Rows per task of those operations.
const ROWS_PER_TASK: usize = 32;

/// Runs `f` on the `rows` rows of `input` (`in_width` values each) and of `out` (`out_width`
/// each), split over the pool in blocks of [`ROWS_PER_TASK`] rows at [`PARALLEL_ROWS`] or more.
/// `f` computes each row alone, so the split changes no bit.
fn by_row_blocks<F>(input: &[f32], in_width: usize, out: &mut [f32], out_width: usize, rows: usize, f: F)
where
    F: Fn(&[f32], &mut [f32]) + Sync,
{
    if rows < PARALLEL_ROWS {
        return f(input, out);
    }
    let blocks =
        input.par_chunks(in_width * ROWS_PER_TASK).zip(out.par_chunks_mut(out_width * ROWS_PER_TASK));
    blocks.for_each(|(input, out)| f(input, out));
}

impl Model {
    /// Runs one step for `batch` and returns, per entry, the next-token logits when asked for.
    /// KV blocks are reserved for every sequence before any compute, so a full cache fails the
    /// step cleanly (nothing is written, no sequence advances).
    pub fn forward(
        &self,
        kv: &mut KvCache,
        batch: &mut [SeqStep<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, EngineError> {
        crate::threads::pool().install(|| self.forward_in_pool(kv, batch))
    }

    fn forward_in_pool(
        &self,
        kv: &mut KvCache,
        batch: &mut [SeqStep<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, EngineError> {
        let cfg = &self.config;
        if matches!(self.backend, Backend::Candle(_)) != kv.device_storage().is_some() {
            return Err(EngineError::model(format!(
                "the KV cache was not made by this model (device {}): use Model::new_kv_cache",
                self.device
            )));
        }
        for s in batch.iter() {
            let end = s.cache.len() + s.tokens.len();
            if end > cfg.context_length {
                return Err(EngineError::ContextOverflow { prompt: end, context: cfg.context_length });
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(EngineError::InvalidRequest(format!("token id {t} is outside the vocabulary")));
            }
        }
        let needed: usize =
            batch.iter().map(|s| (s.cache.len() + s.tokens.len()).saturating_sub(s.cache.capacity())).sum();
        if needed > kv.free_tokens() {
            return Err(EngineError::KvCacheFull { needed, free: kv.free_tokens() });
        }
        for s in batch.iter_mut() {
            let end = s.cache.len() + s.tokens.len();
            kv.reserve(s.cache, end)?;
        }

        // Only the rows that need logits go through the (large) output head.
        let mut wanted = Vec::new();
        let mut rows = 0;
        for s in batch.iter() {
            rows += s.tokens.len();
            if s.logits && !s.tokens.is_empty() {
                wanted.push(rows - 1);
            }
        }
        let logits = match &self.backend {
            Backend::Kernels(w) => self.kernel_step(w, kv, batch, &wanted),
            Backend::Candle(c) => {
                let storage =
                    kv.device_storage().ok_or_else(|| EngineError::model("no device KV storage"))?;
                let seqs: Vec<SeqRows<'_>> = batch
                    .iter()
                    .map(|s| SeqRows { table: s.cache.blocks(), start: s.cache.len(), rows: s.tokens.len() })
                    .collect();
                let tokens: Vec<u32> = batch.iter().flat_map(|s| s.tokens.iter().copied()).collect();
                let wanted: Vec<u32> = wanted.iter().map(|&r| r as u32).collect();
                c.step(cfg, storage, &seqs, &tokens, &wanted)?
            }
        };

        let vocab = cfg.vocab_size;
        let mut out = Vec::with_capacity(batch.len());
        let mut next = logits.chunks_exact(vocab);
        for s in batch.iter_mut() {
            s.cache.advance(s.tokens.len());
            let wants = s.logits && !s.tokens.is_empty();
            out.push(if wants { next.next().map(<[f32]>::to_vec) } else { None });
        }
        Ok(out)
    }

    /// The step on the CPU kernels, after the KV blocks are reserved: writes every row's keys
    /// and values and returns the logits of the `wanted` rows (`wanted.len() × vocab`).
    fn kernel_step(
        &self,
        w: &Weights,
        kv: &mut KvCache,
        batch: &[SeqStep<'_>],
        wanted: &[usize],
    ) -> Vec<f32> {
        let cfg = &self.config;
        let (d, hd) = (cfg.embedding, cfg.head_dim);
        let (nh, nkv) = (cfg.heads, cfg.kv_heads);
        // Row r of the step belongs to sequence seq_of[r] at position pos_of[r].
        let mut seq_of = Vec::new();
        let mut pos_of = Vec::new();
        let mut first_row = Vec::with_capacity(batch.len());
        for (si, s) in batch.iter().enumerate() {
            first_row.push(seq_of.len());
            for i in 0..s.tokens.len() {
                seq_of.push(si);
                pos_of.push(s.cache.len() + i);
            }
        }
        let rows = seq_of.len();
        let mut x = vec![0f32; rows * d];
        for (r, &tok) in batch.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            w.embedding.dequantize_row(tok as usize, &mut x[r * d..(r + 1) * d]);
        }

        let qkv_w = (nh + 2 * nkv) * hd;
        let mut h = vec![0f32; rows * d];
        let mut qkv = vec![0f32; rows * qkv_w];
        let mut attn = vec![0f32; rows * d];
        let mut proj = vec![0f32; rows * d];
        let mut gate_up = vec![0f32; rows * 2 * cfg.feed_forward];
        let mut act = vec![0f32; rows * cfg.feed_forward];
        let half = hd / 2;
        for (li, layer) in w.layers.iter().enumerate() {
            by_row_blocks(&x, d, &mut h, d, rows, |x, h| rms_norm(x, &layer.attn_norm, cfg.rms_eps, h));
            matmul(&h, rows, &layer.qkv, &mut qkv);
            for (r, row) in qkv.chunks_exact_mut(qkv_w).enumerate() {
                let p = pos_of[r];
                let (cos, sin) =
                    (&self.rope_cos[p * half..(p + 1) * half], &self.rope_sin[p * half..(p + 1) * half]);
                // q heads and k heads rotate; v (the tail) does not.
                for head in row[..(nh + nkv) * hd].chunks_exact_mut(hd) {
                    rope_in_place(head, cos, sin);
                }
                let seq = &*batch[seq_of[r]].cache;
                for g in 0..nkv {
                    let k = &row[(nh + g) * hd..(nh + g + 1) * hd];
                    let v = &row[(nh + nkv + g) * hd..(nh + nkv + g + 1) * hd];
                    kv.write(li, seq, p, g, k, v);
                }
            }
            self.attention(li, kv, batch, &first_row, &qkv, &mut attn);
            matmul(&attn, rows, &layer.out, &mut proj);
            add_in_place(&mut x, &proj);

            by_row_blocks(&x, d, &mut h, d, rows, |x, h| rms_norm(x, &layer.ffn_norm, cfg.rms_eps, h));
            matmul(&h, rows, &layer.gate_up, &mut gate_up);
            let ff = cfg.feed_forward;
            by_row_blocks(&gate_up, 2 * ff, &mut act, ff, rows, |gate_up, act| {
                for (gu, a) in gate_up.chunks_exact(2 * ff).zip(act.chunks_exact_mut(ff)) {
                    silu_mul(&gu[..ff], &gu[ff..], a);
                }
            });
            matmul(&act, rows, &layer.down, &mut proj);
            add_in_place(&mut x, &proj);
        }

        let mut last = vec![0f32; wanted.len() * d];
        for (i, &r) in wanted.iter().enumerate() {
            rms_norm(&x[r * d..(r + 1) * d], &w.output_norm, cfg.rms_eps, &mut last[i * d..(i + 1) * d]);
        }
        let vocab = cfg.vocab_size;
        let mut logits = vec![0f32; wanted.len() * vocab];
        matmul(&last, wanted.len(), w.head(), &mut logits);
        logits
    }

    /// Causal attention, in parallel over (sequence, KV head, block of queries); writes `attn`
    /// (`rows × heads·head_dim`). Keys/values come from the cache, which already holds this
    /// step's tokens.
    fn attention(
        &self,
        layer: usize,
        kv: &KvCache,
        batch: &[SeqStep<'_>],
        first_row: &[usize],
        qkv: &[f32],
        attn: &mut [f32],
    ) {
        let cfg = &self.config;
        let (hd, nh, nkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let group = nh / nkv;
        let mut tasks = Vec::new();
        for (si, s) in batch.iter().enumerate() {
            for g in 0..nkv {
                for q0 in (0..s.tokens.len()).step_by(ATTENTION_QUERY_BLOCK) {
                    tasks.push(AttentionTask { seq: si, kv_head: g, first_query: q0 });
                }
            }
        }
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|t| {
                let s = &batch[t.seq];
                let nq = (s.tokens.len() - t.first_query).min(ATTENTION_QUERY_BLOCK);
                let ctx = AttentionInputs {
                    kv,
                    layer,
                    cache: s.cache,
                    start: s.cache.len() + t.first_query,
                    hd,
                    group,
                };
                let q_row = |h: usize, i: usize| {
                    let r = first_row[t.seq] + t.first_query + i;
                    let at = r * (nh + 2 * nkv) * hd + (t.kv_head * group + h) * hd;
                    &qkv[at..at + hd]
                };
                ctx.attend(t.kv_head, nq, q_row)
            })
            .collect();
        // Each result is `group` heads × nq queries × head_dim.
        let d = nh * hd;
        for (t, out) in tasks.iter().zip(results) {
            let nq = out.len() / (group * hd);
            for h in 0..group {
                let head = t.kv_head * group + h;
                for i in 0..nq {
                    let r = first_row[t.seq] + t.first_query + i;
                    let src = &out[(h * nq + i) * hd..(h * nq + i + 1) * hd];
                    attn[r * d + head * hd..r * d + (head + 1) * hd].copy_from_slice(src);
                }
            }
        }
    }
}

/// Queries per attention task: small enough that a long prompt splits across threads.
const ATTENTION_QUERY_BLOCK: usize = 64;

struct AttentionTask {
    seq: usize,
    kv_head: usize,
    first_query: usize,
}

/// What one attention task reads: the cache of its sequence and where its queries start.
struct AttentionInputs<'a> {
    kv: &'a KvCache,
    layer: usize,
    cache: &'a SeqCache,
    /// Position of the task's first query.
    start: usize,
    hd: usize,
    group: usize,
}

impl AttentionInputs<'_> {
    /// Per query row: scores against every visible key, softmax, weighted sum of values, four
    /// rows at a time and one KV block (16 keys) per tile. The score tile broadcasts each query
    /// dimension against the block's transposed keys, and the value tile keeps four rows'
    /// outputs in registers across the block, so neither needs a horizontal sum nor a store
    /// per key. Every row's arithmetic is still exactly that of a lone decode row: a score is
    /// summed over dimensions in order, an output over keys in order, and the tiles never mix
    /// rows (see [`score_tile`], [`pv_tile`]). So a sequence's logits do not depend on how its
    /// prompt was chunked or what else shared the step, and greedy output is the same batched
    /// or alone.
    fn attend<'q>(&self, g: usize, nq: usize, q_row: impl Fn(usize, usize) -> &'q [f32]) -> Vec<f32> {
        let hd = self.hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let rows = self.group * nq;
        let mut out = vec![0f32; rows * hd];
        // The last query sees the most keys; every row reads a prefix of these blocks.
        let blocks: Vec<KvBlock<'_>> =
            self.kv.blocks_of(self.layer, self.cache, g, self.start + nq).collect();
        let mut scores: [Vec<f32>; 4] = Default::default();
        let mut acc = vec![0f32; 4 * hd];
        for r0 in (0..rows).step_by(4) {
            let n = (rows - r0).min(4);
            // A tile short of four rows repeats its last row; the copies' results are dropped.
            let row = |i: usize| r0 + i.min(n - 1);
            let qs = [
                q_row(row(0) / nq, row(0) % nq),
                q_row(row(1) / nq, row(1) % nq),
                q_row(row(2) / nq, row(2) % nq),
                q_row(row(3) / nq, row(3) % nq),
            ];
            let visible = [0, 1, 2, 3].map(|i| self.start + row(i) % nq + 1);
            let longest = visible.iter().copied().max().unwrap_or(0);
            let used = longest.div_ceil(TILE);
            for s in &mut scores {
                s.clear();
            }
            let mut tile = [[0f32; TILE]; 4];
            for b in &blocks[..used] {
                score_tile(qs, b.keys_t, &mut tile);
                for (s, t) in scores.iter_mut().zip(&tile) {
                    s.extend(t.iter().map(|x| x * scale));
                }
            }
            // Each row keeps its own visible prefix; the weights past it are zero, so the value
            // tile adds nothing for them.
            for (s, &v) in scores.iter_mut().zip(&visible) {
                s.truncate(v);
                softmax_in_place(s);
                s.resize(used * TILE, 0.0);
            }
            acc.fill(0.0);
            let (a01, a23) = acc.split_at_mut(2 * hd);
            let ((a0, a1), (a2, a3)) = (a01.split_at_mut(hd), a23.split_at_mut(hd));
            for (bi, b) in blocks[..used].iter().enumerate() {
                let w = |i: usize| &scores[i][bi * TILE..bi * TILE + b.len];
                pv_tile([w(0), w(1), w(2), w(3)], b.values, [&mut *a0, &mut *a1, &mut *a2, &mut *a3]);
            }
            out[r0 * hd..(r0 + n) * hd].copy_from_slice(&acc[..n * hd]);
        }
        out
    }
}
