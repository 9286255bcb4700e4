//! What the capacity model and the simulator assume of `pacer-engine`'s scheduler, defined
//! once: the engine takes its defaults and limits from here, so the models cannot drift from
//! what the engine runs.

/// The default token budget of one step (`--max-num-batched-tokens`).
pub const STEP_TOKEN_BUDGET: u32 = 512;
/// The default KV cache, in tokens (`--kv-cache-tokens`).
pub const KV_CACHE_TOKENS: u32 = 32768;
/// Tokens per KV block: the cache is taken in whole blocks.
pub const KV_BLOCK_TOKENS: u32 = 16;
/// The fewest prompt tokens the first prompt of a step gets, whatever the ITL budget says, so a
/// long prompt always progresses.
pub const MIN_CHUNK: u32 = 16;
/// The default ITL budget of a step in ms (`--max-step-ms`).
pub const DEFAULT_MAX_STEP_MS: u64 = 100;
