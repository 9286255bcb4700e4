//! Paged key/value cache: one preallocated pool of fixed-size blocks shared by all sequences,
//! and a per-sequence block table. Sequences at any position coexist in one batch, a finished
//! sequence returns its blocks at once, and nothing is concatenated or reallocated per step.
//!
//! **Prefix cache.** A full block can be registered under its content: the hash of its 16
//! tokens chained to the hash of every block before it, so one key names one whole prefix.
//! Blocks are reference-counted; a later sequence whose prompt starts with the same tokens
//! takes the registered blocks instead of computing them again (shared system prompts,
//! multi-turn chats, a preempted sequence coming back). A registered block nobody uses stays
//! filled but evictable: it counts as free, and is reused least recently released first when
//! the pool has no empty block left. Full blocks are never written again, so sharing them is
//! safe; a hit is checked against the stored tokens, so a hash collision cannot alias.

use super::config::LlamaConfig;
use crate::error::EngineError;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Tokens per KV block. 16 keeps the waste per sequence under one block and each block's
/// per-head keys and values (16 × head_dim floats each) contiguous for the attention loops.
/// Keys are stored transposed within a block (dimension-major: `d · 16 + slot`), the layout
/// the attention's score tile reads ([`crate::kernels::score_tile`]); values are token-major.
pub const BLOCK_TOKENS: usize = pacer_engine_api::defaults::KV_BLOCK_TOKENS as usize;
const _: () = assert!(BLOCK_TOKENS == crate::kernels::TILE, "a KV block is one attention tile");

/// One block of a sequence's cache for one layer and KV head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvBlock<'a> {
    /// Keys, transposed: `keys_t[d · BLOCK_TOKENS + slot]`, all `BLOCK_TOKENS` slots (those
    /// past `len` hold stale numbers and must not be used).
    pub keys_t: &'a [f32],
    /// Values of the `len` filled slots, `len × head_dim`.
    pub values: &'a [f32],
    /// Filled slots.
    pub len: usize,
}

/// A sequence's view of the cache: which blocks hold its tokens and how many tokens it has.
#[derive(Debug, Default, Clone)]
pub struct SeqCache {
    blocks: Vec<u32>,
    len: usize,
    /// Chained content hash of each leading full block, as far as it has been registered or
    /// found in the prefix cache.
    hashes: Vec<u64>,
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
    /// Leading full blocks already registered in (or found in) the prefix cache.
    pub fn registered_blocks(&self) -> usize {
        self.hashes.len()
    }
    /// The pool blocks holding this sequence's tokens, in order.
    pub(crate) fn blocks(&self) -> &[u32] {
        &self.blocks
    }
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.len <= self.capacity());
    }
}

/// The shared pool. Layout: `[layer][kv_head][block][slot][head_dim]` (keys transposed within
/// a block), keys and values apart, in host memory for the CPU kernels; for the candle backend the numbers live in `device`
/// (same blocks, same accounting) and the host vectors stay empty.
#[derive(Debug)]
pub struct KvCache {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    device: Option<super::candle_backend::DeviceKv>,
    /// Empty blocks.
    free: Vec<u32>,
    /// Sequences using each block.
    refs: Vec<u32>,
    /// What each registered block holds: its chained hash, its parent's and its tokens.
    key: Vec<Option<BlockKey>>,
    /// Registered blocks by chained hash.
    cached: HashMap<u64, u32>,
    /// Registered blocks no sequence uses, by release order (oldest evicted first).
    evictable: BTreeMap<u64, u32>,
    /// Release tick of each evictable block (its key in `evictable`).
    released_at: Vec<u64>,
    tick: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockKey {
    hash: u64,
    parent: u64,
    tokens: [u32; BLOCK_TOKENS],
}

/// The chained hash of a block of `tokens` after the prefix whose hash is `parent`.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same prefix hashes alike in every run.
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl KvCache {
    /// A pool for at least `tokens` tokens of `cfg`'s model (rounded up to whole blocks).
    /// Pages are touched lazily by the OS, so an idle pool costs address space, not memory.
    pub fn new(cfg: &LlamaConfig, tokens: usize) -> Self {
        let num_blocks = tokens.div_ceil(BLOCK_TOKENS).max(1);
        let len = cfg.layers * num_blocks * cfg.kv_heads * BLOCK_TOKENS * cfg.head_dim;
        Self::with_storage(cfg, num_blocks, vec![0.0; len], vec![0.0; len], None)
    }

    /// A pool for at least `tokens` tokens whose keys and values live on a candle `device`.
    pub(crate) fn on_device(
        cfg: &LlamaConfig,
        tokens: usize,
        device: &candle_core::Device,
    ) -> Result<Self, EngineError> {
        let num_blocks = tokens.div_ceil(BLOCK_TOKENS).max(1);
        let storage = super::candle_backend::DeviceKv::new(cfg, num_blocks, device)?;
        Ok(Self::with_storage(cfg, num_blocks, Vec::new(), Vec::new(), Some(storage)))
    }

    fn with_storage(
        cfg: &LlamaConfig,
        num_blocks: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
        device: Option<super::candle_backend::DeviceKv>,
    ) -> Self {
        KvCache {
            layers: cfg.layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            num_blocks,
            keys,
            values,
            device,
            // Pop from the end hands out low block numbers first.
            free: (0..num_blocks as u32).rev().collect(),
            refs: vec![0; num_blocks],
            key: vec![None; num_blocks],
            cached: HashMap::new(),
            evictable: BTreeMap::new(),
            released_at: vec![0; num_blocks],
            tick: 0,
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
    /// Tokens that can still be allocated: empty blocks plus evictable cached ones.
    pub fn free_tokens(&self) -> usize {
        self.free_blocks() * BLOCK_TOKENS
    }
    /// Blocks that can still be allocated.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.evictable.len()
    }
    /// Fraction of blocks in use by sequences, 0..1 (`vllm:kv_cache_usage_perc`); cached
    /// blocks nobody uses count as free, as in vLLM.
    pub fn usage(&self) -> f64 {
        1.0 - self.free_blocks() as f64 / self.num_blocks as f64
    }

    /// Blocks of `seq` no other sequence uses: what releasing it would give back.
    pub fn exclusive_blocks(&self, seq: &SeqCache) -> usize {
        seq.blocks.iter().filter(|&&b| self.refs[b as usize] == 1).count()
    }

    /// Takes one block: an empty one, else the least recently released cached one.
    fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                if let Some(k) = self.key[b as usize].take() {
                    self.cached.remove(&k.hash);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Grows `seq` so it can hold `total` tokens; all-or-nothing.
    pub fn reserve(&mut self, seq: &mut SeqCache, total: usize) -> Result<(), EngineError> {
        let need = total.div_ceil(BLOCK_TOKENS).saturating_sub(seq.blocks.len());
        if need > self.free_blocks() {
            return Err(EngineError::KvCacheFull { needed: need * BLOCK_TOKENS, free: self.free_tokens() });
        }
        for _ in 0..need {
            let b = self.allocate().unwrap_or_else(|| unreachable!("counted above"));
            seq.blocks.push(b);
        }
        Ok(())
    }

    /// Returns every block of `seq` to the pool and empties it. A registered block nobody
    /// else uses stays cached (evictable); any other block becomes empty.
    pub fn release(&mut self, seq: &mut SeqCache) {
        // Release the tail first, so eviction takes a prefix's last blocks before its first.
        for b in seq.blocks.drain(..).rev() {
            let r = &mut self.refs[b as usize];
            *r = r.saturating_sub(1);
            if *r > 0 {
                continue;
            }
            if self.key[b as usize].is_some() {
                self.tick += 1;
                self.released_at[b as usize] = self.tick;
                self.evictable.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
        seq.len = 0;
        seq.hashes.clear();
    }

    /// Starts an empty `seq` with the longest cached prefix of `tokens` in whole blocks, leaving
    /// at least one token of `tokens` to compute (its logits are needed). Returns the tokens
    /// found.
    pub fn take_prefix(&mut self, seq: &mut SeqCache, tokens: &[u32]) -> usize {
        debug_assert!(seq.blocks.is_empty(), "a prefix starts an empty sequence");
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let mut parent = 0;
        for block in tokens.chunks_exact(BLOCK_TOKENS).take(usable) {
            let hash = chain(parent, block);
            let Some(&b) = self.cached.get(&hash) else { break };
            let same = self.key[b as usize].as_ref().is_some_and(|k| k.parent == parent && k.tokens == block);
            if !same {
                break;
            }
            if self.refs[b as usize] == 0 {
                self.evictable.remove(&self.released_at[b as usize]);
            }
            self.refs[b as usize] += 1;
            seq.blocks.push(b);
            seq.hashes.push(hash);
            parent = hash;
        }
        seq.len = seq.blocks.len() * BLOCK_TOKENS;
        seq.len
    }

    /// Registers the full blocks of `seq` not registered yet; `tokens` are the tokens whose
    /// keys and values it holds (at least `seq.len()` of them). A block whose content another
    /// sequence registered first stays private.
    pub fn register_full_blocks(&mut self, seq: &mut SeqCache, tokens: &[u32]) {
        let full = seq.len.min(tokens.len()) / BLOCK_TOKENS;
        while seq.hashes.len() < full {
            let i = seq.hashes.len();
            let parent = seq.hashes.last().copied().unwrap_or(0);
            let block = &tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
            let hash = chain(parent, block);
            let b = seq.blocks[i];
            if self.key[b as usize].is_none() && !self.cached.contains_key(&hash) {
                let mut stored = [0; BLOCK_TOKENS];
                stored.copy_from_slice(block);
                self.key[b as usize] = Some(BlockKey { hash, parent, tokens: stored });
                self.cached.insert(hash, b);
            }
            seq.hashes.push(hash);
        }
    }

    /// Where `block` of `head` in `layer` starts. Head-major: an attention task reads one KV head
    /// across a sequence's blocks, which the free list hands out in order, so those reads are one
    /// stream the hardware prefetcher follows. Block-major put the other heads' 4 KiB between
    /// each pair, a new page every block, which slowed single-row decode at long contexts by
    /// about a third (docs/benchmarks.md, "A head-major KV pool").
    fn offset(&self, layer: usize, block: u32, head: usize) -> usize {
        ((layer * self.kv_heads + head) * self.num_blocks + block as usize) * BLOCK_TOKENS * self.head_dim
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
        let block = self.offset(layer, seq.blocks[pos / BLOCK_TOKENS], head);
        let slot = pos % BLOCK_TOKENS;
        for (d, &x) in k[..self.head_dim].iter().enumerate() {
            self.keys[block + d * BLOCK_TOKENS + slot] = x;
        }
        let at = block + slot * self.head_dim;
        self.values[at..at + self.head_dim].copy_from_slice(v);
    }

    /// The key of `head` for the token at `pos` of `seq` in `layer`, into `out`.
    pub(crate) fn read_key(&self, layer: usize, seq: &SeqCache, pos: usize, head: usize, out: &mut [f32]) {
        let block = self.offset(layer, seq.blocks[pos / BLOCK_TOKENS], head);
        for (d, o) in out[..self.head_dim].iter_mut().enumerate() {
            *o = self.keys[block + d * BLOCK_TOKENS + pos % BLOCK_TOKENS];
        }
    }

    /// Keys and values of `head` in `layer` for the first `len` tokens of `seq`, one
    /// [`KvBlock`] per block (the last one possibly partial).
    pub(crate) fn blocks_of<'a>(
        &'a self,
        layer: usize,
        seq: &'a SeqCache,
        head: usize,
        len: usize,
    ) -> impl Iterator<Item = KvBlock<'a>> + 'a {
        let hd = self.head_dim;
        seq.blocks[..len.div_ceil(BLOCK_TOKENS)].iter().enumerate().map(move |(i, &b)| {
            let n = (len - i * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let at = self.offset(layer, b, head);
            KvBlock {
                keys_t: &self.keys[at..at + BLOCK_TOKENS * hd],
                values: &self.values[at..at + n * hd],
                len: n,
            }
        })
    }

    /// The device storage, when the pool belongs to the candle backend.
    pub(crate) fn device_storage(&self) -> Option<&super::candle_backend::DeviceKv> {
        self.device.as_ref()
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
    fn a_registered_prefix_is_shared_and_kept_until_its_blocks_are_needed() {
        let mut kv = KvCache::new(&cfg(), 64); // 4 blocks
        let prompt: Vec<u32> = (0..40).map(|i| i % 7).collect();
        let mut a = SeqCache::new();
        assert_eq!(kv.take_prefix(&mut a, &prompt), 0, "nothing cached yet");
        kv.reserve(&mut a, 41).unwrap();
        a.advance(40);
        kv.register_full_blocks(&mut a, &prompt);
        // A second sequence with the same 40-token prompt shares its two full blocks.
        let mut b = SeqCache::new();
        assert_eq!(kv.take_prefix(&mut b, &prompt), 32);
        assert_eq!(b.blocks[..2], a.blocks[..2]);
        assert_eq!((kv.exclusive_blocks(&a), kv.exclusive_blocks(&b)), (1, 0), "a's third block is its own");
        // Another prompt that diverges in the second block shares only the first.
        let mut other = prompt.clone();
        other[20] = 9;
        let mut c = SeqCache::new();
        assert_eq!(kv.take_prefix(&mut c, &other), 16);
        kv.release(&mut c);
        kv.release(&mut b);
        kv.release(&mut a);
        assert_eq!(kv.free_tokens(), 64, "cached blocks count as free");
        assert_eq!(kv.usage(), 0.0);
        // Released but cached: a later sequence still finds the prefix.
        let mut d = SeqCache::new();
        assert_eq!(kv.take_prefix(&mut d, &prompt), 32);
        kv.release(&mut d);
        // Allocating the whole pool evicts the cached blocks; the prefix is gone.
        let mut e = SeqCache::new();
        kv.reserve(&mut e, 64).unwrap();
        kv.release(&mut e);
        assert_eq!(kv.take_prefix(&mut SeqCache::new(), &prompt), 0);
    }

    #[test]
    fn a_hit_leaves_a_token_to_compute_and_the_same_content_is_registered_once() {
        let mut kv = KvCache::new(&cfg(), 128);
        let prompt: Vec<u32> = (0..32).collect(); // exactly two blocks
        let (mut a, mut b) = (SeqCache::new(), SeqCache::new());
        for s in [&mut a, &mut b] {
            kv.reserve(s, 33).unwrap();
            s.advance(32);
            kv.register_full_blocks(s, &prompt);
        }
        // Two sequences computed the same blocks: one copy is registered, and a hit on a
        // 32-token prompt takes only the first block (the last token must be computed).
        let mut c = SeqCache::new();
        assert_eq!(kv.take_prefix(&mut c, &prompt), 16);
        assert_eq!(c.blocks[0], a.blocks[0]);
        kv.release(&mut b);
        assert_eq!(kv.evictable.len(), 0, "b's blocks were private: they are empty again");
    }

    #[test]
    fn written_rows_are_read_back_per_block() {
        let c = cfg();
        let mut kv = KvCache::new(&c, 64);
        let mut s = SeqCache::new();
        kv.reserve(&mut s, 20).unwrap();
        for pos in 0..20 {
            let k: Vec<f32> = (0..32).map(|d| pos as f32 + d as f32 / 100.0).collect();
            let v = vec![-(pos as f32); 32];
            kv.write(1, &s, pos, 0, &k, &v);
        }
        s.advance(20);
        let blocks: Vec<_> = kv.blocks_of(1, &s, 0, 20).collect();
        assert_eq!(blocks.len(), 2);
        assert_eq!((blocks[1].len, blocks[1].values.len(), blocks[1].keys_t.len()), (4, 4 * 32, 16 * 32));
        // Keys are dimension-major within the block: dimension 5 of token 19 (slot 3).
        assert_eq!(blocks[1].keys_t[5 * BLOCK_TOKENS + 3], 19.05);
        assert_eq!(blocks[1].values[3 * 32], -19.0);
        let mut key = vec![0f32; 32];
        kv.read_key(1, &s, 19, 0, &mut key);
        assert_eq!(key[5], 19.05);
    }
}
