//! Paged key/value cache: one preallocated pool of fixed-size blocks shared by all sequences,
//! and a per-sequence block table. Sequences at any position coexist in one batch, a finished
//! sequence returns its blocks at once, and nothing is concatenated or reallocated per step.

use super::config::LlamaConfig;
use crate::error::EngineError;

/// Tokens per KV block. 16 keeps the waste per sequence under one block and each block's
/// per-head rows (16 × head_dim floats) contiguous for the attention loops.
pub const BLOCK_TOKENS: usize = 16;

/// A sequence's view of the cache: which blocks hold its tokens and how many tokens it has.
#[derive(Debug, Default, Clone)]
pub struct SeqCache {
    blocks: Vec<u32>,
    len: usize,
}

impl SeqCache {
    /// An empty sequence.
    pub fn new() -> Self {
        Self::default()
    }
    /// Tokens whose keys and values are stored.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Tokens this sequence can hold without new blocks.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_TOKENS
    }
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.len <= self.capacity());
    }
}

/// The shared pool. Layout: `[layer][block][kv_head][slot][head_dim]`, keys and values apart.
#[derive(Debug)]
pub struct KvCache {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    free: Vec<u32>,
}

impl KvCache {
    /// A pool for at least `tokens` tokens of `cfg`'s model (rounded up to whole blocks).
    /// Pages are touched lazily by the OS, so an idle pool costs address space, not memory.
    pub fn new(cfg: &LlamaConfig, tokens: usize) -> Self {
        let num_blocks = tokens.div_ceil(BLOCK_TOKENS).max(1);
        let len = cfg.layers * num_blocks * cfg.kv_heads * BLOCK_TOKENS * cfg.head_dim;
        KvCache {
            layers: cfg.layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            num_blocks,
            keys: vec![0.0; len],
            values: vec![0.0; len],
            // Pop from the end hands out low block numbers first.
            free: (0..num_blocks as u32).rev().collect(),
        }
    }

    /// Bytes needed per cached token for `cfg` (keys + values, all layers).
    pub fn bytes_per_token(cfg: &LlamaConfig) -> usize {
        2 * 4 * cfg.layers * cfg.kv_heads * cfg.head_dim
    }

    /// Total tokens the pool holds.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * BLOCK_TOKENS
    }
    /// Tokens still unallocated.
    pub fn free_tokens(&self) -> usize {
        self.free.len() * BLOCK_TOKENS
    }
    /// Fraction of blocks in use, 0..1 (`vllm:kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        1.0 - self.free.len() as f64 / self.num_blocks as f64
    }

    /// Grows `seq` so it can hold `total` tokens; all-or-nothing.
    pub fn reserve(&mut self, seq: &mut SeqCache, total: usize) -> Result<(), EngineError> {
        let need = total.div_ceil(BLOCK_TOKENS).saturating_sub(seq.blocks.len());
        if need > self.free.len() {
            return Err(EngineError::KvCacheFull { needed: need * BLOCK_TOKENS, free: self.free_tokens() });
        }
        let at = self.free.len() - need;
        seq.blocks.extend(self.free.drain(at..).rev());
        Ok(())
    }

    /// Returns every block of `seq` to the pool and empties it.
    pub fn release(&mut self, seq: &mut SeqCache) {
        self.free.extend(seq.blocks.drain(..).rev());
        seq.len = 0;
    }

    fn offset(&self, layer: usize, block: u32, head: usize) -> usize {
        ((layer * self.num_blocks + block as usize) * self.kv_heads + head) * BLOCK_TOKENS * self.head_dim
    }

    /// Stores the key and value of `head` for the token at `pos` of `seq` in `layer`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        seq: &SeqCache,
        pos: usize,
        head: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let at =
            self.offset(layer, seq.blocks[pos / BLOCK_TOKENS], head) + (pos % BLOCK_TOKENS) * self.head_dim;
        self.keys[at..at + self.head_dim].copy_from_slice(k);
        self.values[at..at + self.head_dim].copy_from_slice(v);
    }

    /// Keys and values of `head` in `layer` for the first `len` tokens of `seq`, as one
    /// `(keys, values)` pair of slices per block (the last one possibly partial).
    pub(crate) fn blocks_of<'a>(
        &'a self,
        layer: usize,
        seq: &'a SeqCache,
        head: usize,
        len: usize,
    ) -> impl Iterator<Item = (&'a [f32], &'a [f32])> + 'a {
        let hd = self.head_dim;
        seq.blocks[..len.div_ceil(BLOCK_TOKENS)].iter().enumerate().map(move |(i, &b)| {
            let n = (len - i * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let at = self.offset(layer, b, head);
            (&self.keys[at..at + n * hd], &self.values[at..at + n * hd])
        })
    }

    /// Layers the pool was built for.
    pub fn layers(&self) -> usize {
        self.layers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LlamaConfig {
        LlamaConfig {
            architecture: "llama".into(),
            name: None,
            layers: 2,
            embedding: 64,
            feed_forward: 128,
            heads: 2,
            kv_heads: 1,
            head_dim: 32,
            context_length: 128,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            vocab_size: 10,
        }
    }

    #[test]
    fn reserve_is_all_or_nothing_and_release_returns_blocks() {
        let mut kv = KvCache::new(&cfg(), 64); // 4 blocks
        let (mut a, mut b) = (SeqCache::new(), SeqCache::new());
        kv.reserve(&mut a, 40).unwrap(); // 3 blocks
        assert_eq!(kv.free_tokens(), 16);
        let err = kv.reserve(&mut b, 20).unwrap_err();
        assert!(matches!(err, EngineError::KvCacheFull { needed: 32, free: 16 }));
        assert!(b.blocks.is_empty(), "a failed reservation takes nothing");
        kv.release(&mut a);
        assert_eq!(kv.free_tokens(), 64);
        kv.reserve(&mut b, 64).unwrap();
        assert!((kv.usage() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn written_rows_are_read_back_per_block() {
        let c = cfg();
        let mut kv = KvCache::new(&c, 64);
        let mut s = SeqCache::new();
        kv.reserve(&mut s, 20).unwrap();
        for pos in 0..20 {
            let k = vec![pos as f32; 32];
            let v = vec![-(pos as f32); 32];
            kv.write(1, &s, pos, 0, &k, &v);
        }
        s.advance(20);
        let blocks: Vec<_> = kv.blocks_of(1, &s, 0, 20).collect();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].0.len(), 4 * 32);
        assert_eq!(blocks[1].0[0], 16.0);
        assert_eq!(blocks[1].1[3 * 32], -19.0);
    }
}
