//! The batched forward step: B sequences, each contributing a run of new tokens at its own
//! position (a prompt chunk or one decode token), go through every layer together. All rows
//! share each weight matmul; attention runs per (sequence, head) over that sequence's own paged
//! KV cache, which makes the causal mask implicit (a row only sees its own sequence, up to its
//! own position).

use super::Model;
use super::kv::{KvCache, SeqCache};
use crate::error::EngineError;
use crate::kernels::{add_in_place, axpy, dot, matmul, rms_norm, rope_in_place, silu_mul};
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

impl Model {
    /// Runs one step for `batch` and returns, per entry, the next-token logits when asked for.
    /// KV blocks are reserved for every sequence before any compute, so a full cache fails the
    /// step cleanly (nothing is written, no sequence advances).
    pub fn forward(
        &self,
        kv: &mut KvCache,
        batch: &mut [SeqStep<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, EngineError> {
        let cfg = &self.config;
        let (d, hd) = (cfg.embedding, cfg.head_dim);
        let (nh, nkv) = (cfg.heads, cfg.kv_heads);
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
            self.weights.embedding.dequantize_row(tok as usize, &mut x[r * d..(r + 1) * d]);
        }

        let qkv_w = (nh + 2 * nkv) * hd;
        let mut h = vec![0f32; rows * d];
        let mut qkv = vec![0f32; rows * qkv_w];
        let mut attn = vec![0f32; rows * d];
        let mut proj = vec![0f32; rows * d];
        let mut gate_up = vec![0f32; rows * 2 * cfg.feed_forward];
        let mut act = vec![0f32; rows * cfg.feed_forward];
        let half = hd / 2;
        for (li, layer) in self.weights.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, cfg.rms_eps, &mut h);
            matmul(&h, rows, &layer.qkv, &mut qkv);
            for (r, row) in qkv.chunks_exact_mut(qkv_w).enumerate() {
                let p = pos_of[r];
                let (cos, sin) = (&self.rope_cos[p * half..(p + 1) * half], &self.rope_sin[p * half..(p + 1) * half]);
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

            rms_norm(&x, &layer.ffn_norm, cfg.rms_eps, &mut h);
            matmul(&h, rows, &layer.gate_up, &mut gate_up);
            let ff = cfg.feed_forward;
            for (gu, a) in gate_up.chunks_exact(2 * ff).zip(act.chunks_exact_mut(ff)) {
                silu_mul(&gu[..ff], &gu[ff..], a);
            }
            matmul(&act, rows, &layer.down, &mut proj);
            add_in_place(&mut x, &proj);
        }

        // Only the rows that need logits go through the (large) output head.
        let wanted: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, s)| s.logits && !s.tokens.is_empty())
            .map(|(si, s)| first_row[si] + s.tokens.len() - 1)
            .collect();
        let mut last = vec![0f32; wanted.len() * d];
        for (i, &r) in wanted.iter().enumerate() {
            rms_norm(&x[r * d..(r + 1) * d], &self.weights.output_norm, cfg.rms_eps, &mut last[i * d..(i + 1) * d]);
        }
        let vocab = cfg.vocab_size;
        let mut logits = vec![0f32; wanted.len() * vocab];
        matmul(&last, wanted.len(), self.weights.head(), &mut logits);

        let mut out = Vec::with_capacity(batch.len());
        let mut next = logits.chunks_exact(vocab);
        for s in batch.iter_mut() {
            s.cache.advance(s.tokens.len());
            let wants = s.logits && !s.tokens.is_empty();
            out.push(if wants { next.next().map(<[f32]>::to_vec) } else { None });
        }
        Ok(out)
    }

    /// Causal attention for every (sequence, query head) pair in parallel; writes `attn`
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
        let qkv_w = (nh + 2 * nkv) * hd;
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        let tasks: Vec<(usize, usize)> = (0..batch.len()).flat_map(|s| (0..nh).map(move |h| (s, h))).collect();
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(si, head)| {
                let s = &batch[si];
                let n = s.tokens.len();
                let start = s.cache.len();
                let mut out = vec![0f32; n * hd];
                let mut scores = Vec::with_capacity(start + n);
                for i in 0..n {
                    let r = first_row[si] + i;
                    let q = &qkv[r * qkv_w + head * hd..r * qkv_w + (head + 1) * hd];
                    let visible = start + i + 1;
                    scores.clear();
                    for (keys, _) in kv.blocks_of(layer, s.cache, head / group, visible) {
                        scores.extend(keys.chunks_exact(hd).map(|k| dot(q, k) * scale));
                    }
                    crate::kernels::softmax_in_place(&mut scores);
                    let o = &mut out[i * hd..(i + 1) * hd];
                    let mut p = scores.iter();
                    for (_, values) in kv.blocks_of(layer, s.cache, head / group, visible) {
                        for (v, &w) in values.chunks_exact(hd).zip(&mut p) {
                            axpy(w, v, o);
                        }
                    }
                }
                out
            })
            .collect();
        let d = nh * hd;
        for (&(si, head), out) in tasks.iter().zip(results) {
            for (i, row) in out.chunks_exact(hd).enumerate() {
                let r = first_row[si] + i;
                attn[r * d + head * hd..r * d + (head + 1) * hd].copy_from_slice(row);
            }
        }
    }
}
