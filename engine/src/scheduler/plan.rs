//! The scheduler's decisions, without a model: which waiting requests join the batch, what
//! each running sequence feeds in the next step, and whom to preempt when the KV pool cannot
//! grow every sequence by what the step feeds. The engine loop gathers a [`SeqView`] per
//! sequence, asks these functions, and carries out the answer; so every rule here is unit
//! tested on plain numbers (batch and token caps, decodes first, chunking, preemption order).
//!
//! KV blocks are taken on demand: a request is admitted with blocks for its prompt (plus the
//! first generated token) and grows one block at a time as it decodes. When the pool runs out
//! the newest running sequence is preempted (its blocks freed, to be recomputed later), as
//! vLLM's recompute preemption does; the oldest sequences keep their progress.

use super::step_time::{TimeBound, Work};
use crate::model::BLOCK_TOKENS;

/// The fewest prompt tokens the first prompt of a step gets, whatever the time budget says, so
/// a long prompt always progresses.
pub const MIN_CHUNK: usize = pacer_engine_api::defaults::MIN_CHUNK as usize;

/// Blocks that hold `tokens` tokens.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_TOKENS)
}

/// What planning needs to know of one running sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqView {
    /// Tokens in its KV cache.
    pub cached: usize,
    /// KV blocks it holds.
    pub blocks: usize,
    /// Of those, the blocks preempting it would give back: the ones no other sequence shares
    /// (a shared prefix block stays with its other users).
    pub reclaimable: usize,
    /// Prompt (or recompute) tokens still to prefill; 0 once it decodes.
    pub prefill_left: usize,
}

/// The next step: tokens fed per running sequence and the sequences to preempt first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepPlan {
    /// `(index into running, tokens to feed)`: decodes in batch order, then prompt chunks.
    pub feeds: Vec<(usize, usize)>,
    /// Indices into running to preempt before the step, newest first.
    pub preempt: Vec<usize>,
}

/// What one step may spend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepBudget {
    /// Tokens fed in the step (`--max-num-batched-tokens`).
    pub tokens: usize,
    /// The context length at which one token's attention costs as much as its weight matmuls
    /// ([`attention_equivalent`]); 0 counts tokens only. A prompt chunk deep into a long
    /// prompt costs more than its token count: each of its tokens attends to everything before
    /// it, so such a chunk is cut to what the budget buys, and the step — and with it the gap
    /// between the running streams' tokens — stays bounded as the prompt gets longer.
    pub attention_equiv: usize,
    /// The ITL budget (`max_step_ms`), when set and measurable: with decode rows in the step,
    /// prompt chunks get only the time the decodes leave (never below [`MIN_CHUNK`] for the
    /// first prompt); with none, it does not apply.
    pub time: Option<TimeBound>,
}

/// [`StepBudget::attention_equiv`] of a llama-family model: the weights' multiply-adds per
/// token over the attention's per token of context (QK and AV over every head of every layer).
pub fn attention_equivalent(cfg: &crate::model::LlamaConfig) -> usize {
    let (d, q, kv) = (cfg.embedding, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let per_layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.feed_forward;
    let weights = cfg.layers * per_layer + cfg.vocab_size * d;
    let attention_per_position = 2 * cfg.layers * q;
    weights / attention_per_position.max(1)
}

/// What feeding `n` prompt tokens after `cached` ones costs, in tokens of weight work: each
/// token's own weights plus its attention over the tokens before it.
fn chunk_cost(cached: usize, n: usize, equiv: usize) -> f64 {
    if equiv == 0 {
        return n as f64;
    }
    n as f64 + attended(cached, n) / equiv as f64
}

/// Positions the `n` prompt tokens fed after `cached` ones attend to.
fn attended(cached: usize, n: usize) -> f64 {
    let n_f = n as f64;
    n_f * cached as f64 + n_f * (n_f - 1.0) / 2.0
}

/// The work of the step of `feeds` (`(index into running, tokens)`), what the step clock is
/// fitted on: its tokens, and their attention in tokens of weight work by multiply-adds.
pub fn step_work(running: &[SeqView], feeds: &[(usize, usize)], equiv: usize) -> Work {
    let tokens = feeds.iter().map(|&(_, n)| n as f64).sum();
    let positions: f64 = feeds.iter().map(|&(i, n)| attended(running[i].cached, n)).sum();
    Work { tokens, attention: positions / equiv.max(1) as f64 }
}

/// [`chunk_cost`] summed over `feeds`.
fn step_units(running: &[SeqView], feeds: &[(usize, usize)], equiv: usize) -> f64 {
    feeds.iter().map(|&(i, n)| chunk_cost(running[i].cached, n, equiv)).sum()
}

/// The longest chunk, up to `max`, whose [`chunk_cost`] fits `budget`.
fn affordable_chunk(cached: usize, max: usize, budget: usize, equiv: usize) -> usize {
    let (mut lo, mut hi) = (0, max.min(budget));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if chunk_cost(cached, mid, equiv) <= budget as f64 {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Plans one step over `running` (in admission order, oldest first) with `token_budget`
/// tokens and `free_blocks` unallocated KV blocks, counting tokens only (see
/// [`plan_step_with`]); the unit tests' shorthand.
#[cfg(test)]
pub fn plan_step(running: &[SeqView], token_budget: usize, free_blocks: usize) -> StepPlan {
    plan_step_with(running, StepBudget { tokens: token_budget, attention_equiv: 0, time: None }, free_blocks)
}

/// Plans one step over `running` (in admission order, oldest first) with `budget` and
/// `free_blocks` unallocated KV blocks.
///
/// Every decoding sequence feeds one token first; prompt chunks share what is left of the
/// budget in batch order. If the feeds need more new blocks than are free, the newest sequence
/// is preempted (its blocks return to the pool) and the step is planned again without it,
/// until it fits. A prompt chunk that finds no block free waits for a later step rather than
/// preempting anyone; a step that could feed nothing preempts the newest too, so the oldest
/// sequence always progresses. A prompt chunk is also cut to what its attention leaves of the
/// budget (see [`StepBudget::attention_equiv`]), never below one token, and, while decode rows
/// share the step, to what the ITL budget leaves of the step's time ([`StepBudget::time`]),
/// never below [`MIN_CHUNK`] for the first prompt.
pub fn plan_step_with(running: &[SeqView], budget: StepBudget, free_blocks: usize) -> StepPlan {
    let (token_budget, equiv, budget_time) = (budget.tokens, budget.attention_equiv, budget.time);
    let mut alive: Vec<usize> = (0..running.len()).collect();
    let mut preempt = Vec::new();
    let mut free = free_blocks;
    loop {
        let new_blocks = |i: usize, tokens: usize| {
            let s = running[i];
            blocks_for(s.cached + tokens).saturating_sub(s.blocks)
        };
        let decoding: Vec<usize> = alive.iter().copied().filter(|&i| running[i].prefill_left == 0).collect();
        let decode_need: usize = decoding.iter().map(|&i| new_blocks(i, 1)).sum();
        if decode_need <= free {
            let mut left = free - decode_need;
            let mut budget = token_budget.saturating_sub(decoding.len());
            let mut feeds: Vec<(usize, usize)> = decoding.iter().map(|&i| (i, 1)).collect();
            // What the ITL budget leaves the prompts while streams decode, in tokens with their
            // attention weighed as it takes time on this machine.
            let time_equiv = budget_time.map_or(equiv, |t| t.attention_equiv(equiv));
            let decode_units = step_units(running, &feeds, time_equiv);
            let mut timed = budget_time.and_then(|t| t.units(decode_units)).map(|u| u - decode_units);
            let mut first = true;
            for &i in alive.iter().filter(|&&i| running[i].prefill_left > 0) {
                if budget == 0 {
                    break;
                }
                let s = running[i];
                // As many tokens as the budget allows and the sequence's blocks plus the free
                // ones can hold.
                let room = (s.blocks + left) * BLOCK_TOKENS - s.cached;
                let most = s.prefill_left.min(budget).min(room);
                let mut chunk = affordable_chunk(s.cached, most, budget, equiv).max(most.min(1));
                if let Some(units) = timed {
                    let fits = affordable_chunk(s.cached, chunk, units.max(0.0) as usize, time_equiv);
                    let floor = if first { MIN_CHUNK.min(chunk) } else { 0 };
                    chunk = fits.max(floor);
                }
                if chunk == 0 {
                    continue;
                }
                first = false;
                left -= new_blocks(i, chunk);
                let cost = chunk_cost(s.cached, chunk, equiv);
                budget = budget.saturating_sub(cost.ceil() as usize);
                timed = timed.map(|u| u - chunk_cost(s.cached, chunk, time_equiv));
                feeds.push((i, chunk));
            }
            if !feeds.is_empty() || alive.len() <= 1 {
                return StepPlan { feeds, preempt };
            }
        }
        // Out of blocks (or no sequence could move): the newest gives its blocks back.
        let Some(victim) = alive.pop() else { return StepPlan { feeds: Vec::new(), preempt } };
        free += running[victim].reclaimable;
        preempt.push(victim);
    }
}

/// How many of `waiting` (in queue order, each the tokens it must hold on admission) join a
/// batch of `running` sequences capped at `max_batch`, given `free_blocks`. Admission stops at
/// the first request that does not fit, so the queue keeps its order.
pub fn admissible(
    waiting: impl IntoIterator<Item = usize>,
    running: usize,
    max_batch: usize,
    free_blocks: usize,
) -> usize {
    let mut free = free_blocks;
    let mut n = 0;
    for tokens in waiting {
        if running + n >= max_batch.max(1) {
            break;
        }
        let need = blocks_for(tokens);
        if need > free {
            break;
        }
        free -= need;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_deep_into_a_long_prompt_is_cut_to_what_its_attention_leaves() {
        let prompt = |cached: usize, left: usize| SeqView {
            cached,
            blocks: blocks_for(cached),
            reclaimable: blocks_for(cached),
            prefill_left: left,
        };
        let budget = StepBudget { tokens: 512, attention_equiv: 4096, time: None };
        // At the start of a prompt attention is cheap: nearly the whole budget.
        let early = plan_step_with(&[prompt(0, 8000)], budget, 1000);
        assert!(early.feeds[0].1 > 450, "{early:?}");
        // 6000 tokens in, each token also attends to 6000 others: about 2.5x the work.
        let deep = plan_step_with(&[prompt(6000, 2000)], budget, 1000);
        let n = deep.feeds[0].1;
        assert!((190..=215).contains(&n), "{deep:?}");
        assert!(chunk_cost(6000, n, 4096) <= 512.0 && chunk_cost(6000, n + 1, 4096) > 512.0);
        // Without the attention term, tokens alone count.
        assert_eq!(plan_step(&[prompt(6000, 2000)], 512, 1000).feeds[0].1, 512);
        // Decodes keep their token whatever the context, and a chunk never drops to zero.
        let decoding = SeqView { cached: 7000, blocks: blocks_for(7001), reclaimable: 1, prefill_left: 0 };
        let tight = plan_step_with(
            &[decoding, prompt(8000, 100)],
            StepBudget { tokens: 2, attention_equiv: 4096, time: None },
            100,
        );
        assert_eq!(tight.feeds, vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn the_attention_equivalent_of_the_test_model_is_a_few_thousand_positions() {
        let cfg = crate::model::LlamaConfig {
            architecture: "llama".into(),
            name: None,
            layers: 30,
            embedding: 576,
            feed_forward: 1536,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            context_length: 8192,
            rope_base: 100_000.0,
            rms_eps: 1e-5,
            vocab_size: 49152,
        };
        // SmolLM2-135M: about 134M multiply-adds of weights per token, 35k per position.
        let e = attention_equivalent(&cfg);
        assert!((3000..5000).contains(&e), "{e}");
    }

    const fn decoding(cached: usize) -> SeqView {
        let blocks = cached.div_ceil(BLOCK_TOKENS);
        SeqView { cached, blocks, reclaimable: blocks, prefill_left: 0 }
    }
    /// Admitted with blocks for its whole prompt plus one token, nothing prefilled yet.
    const fn admitted(prompt: usize) -> SeqView {
        let blocks = (prompt + 1).div_ceil(BLOCK_TOKENS);
        SeqView { cached: 0, blocks, reclaimable: blocks, prefill_left: prompt }
    }

    #[test]
    fn with_streams_decoding_a_prompt_gets_what_the_itl_budget_leaves() {
        use std::time::Duration;
        // 10 ms a step + 1 ms a token, 100 ms wanted: 90 tokens a step in all.
        let time = Some(TimeBound { max_step: Duration::from_millis(100), fit: [0.010, 0.001, 0.001] });
        let budget = StepBudget { tokens: 512, attention_equiv: 0, time };
        let plan = plan_step_with(&[decoding(40), decoding(17), admitted(2000)], budget, 1000);
        assert_eq!(plan.feeds[..2], [(0, 1), (1, 1)]);
        assert!(matches!(plan.feeds[2], (2, 87..=88)), "{plan:?}");
        // Nobody decoding: nobody waits on the gap, the prompt gets the whole token budget.
        let plan = plan_step_with(&[admitted(2000)], budget, 1000);
        assert_eq!(plan.feeds, vec![(0, 512)]);
        // 80 decodes take 90 ms alone: the prompt still gets half their time (45 tokens).
        let mut running: Vec<SeqView> = (0..80).map(|_| decoding(30)).collect();
        running.push(admitted(2000));
        let plan = plan_step_with(&running, budget, 1000);
        assert!(matches!(plan.feeds.last(), Some(&(80, 44..=45))), "{plan:?}");
        // A slow machine (10 ms a token): the first prompt still moves by MIN_CHUNK, the
        // second waits, and no decode is skipped.
        let max_step = Duration::from_millis(100);
        let slow = StepBudget { time: Some(TimeBound { fit: [0.0, 0.010, 0.010], max_step }), ..budget };
        let mut running: Vec<SeqView> = (0..9).map(|_| decoding(30)).collect();
        running.extend([admitted(100), admitted(100)]);
        let plan = plan_step_with(&running, slow, 1000);
        let mut want: Vec<(usize, usize)> = (0..9).map(|i| (i, 1)).collect();
        want.push((9, MIN_CHUNK));
        assert_eq!(plan.feeds, want);
    }

    #[test]
    fn decodes_go_first_and_prompt_chunks_share_the_rest_of_the_budget() {
        let running = [admitted(300), decoding(40), admitted(300), decoding(17)];
        let plan = plan_step(&running, 256, 100);
        assert_eq!(plan.feeds, vec![(1, 1), (3, 1), (0, 254)]);
        assert!(plan.preempt.is_empty());
        // A bigger budget finishes the first prompt and starts the second.
        let plan = plan_step(&running, 512, 100);
        assert_eq!(plan.feeds, vec![(1, 1), (3, 1), (0, 300), (2, 210)]);
    }

    #[test]
    fn a_decode_takes_a_new_block_only_at_a_block_boundary() {
        // 32 cached tokens fill two blocks exactly: the 33rd needs a third; 33 do not.
        let plan = plan_step(&[decoding(32), decoding(33)], 512, 1);
        assert_eq!(plan.feeds, vec![(0, 1), (1, 1)]);
        assert!(plan.preempt.is_empty());
        let plan = plan_step(&[decoding(32), decoding(48)], 512, 1);
        assert_eq!(plan.preempt, vec![1], "two boundaries and one free block: the newest goes");
        assert_eq!(plan.feeds, vec![(0, 1)]);
    }

    #[test]
    fn when_the_pool_runs_out_the_newest_sequences_are_preempted_first() {
        // Four sequences at a block boundary, no free block: each preemption frees 2 blocks,
        // and the three survivors need 3: two must go, the newest first.
        let running = [decoding(32), decoding(32), decoding(32), decoding(32)];
        let plan = plan_step(&running, 512, 0);
        assert_eq!(plan.preempt, vec![3, 2]);
        assert_eq!(plan.feeds, vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn a_victim_gives_back_only_the_blocks_nobody_else_shares() {
        // The newest shares 2 of its 3 blocks (a cached system prompt) with the oldest: its
        // preemption frees one block, not three, so the middle one must go as well.
        let shared = SeqView { cached: 48, blocks: 3, reclaimable: 1, prefill_left: 0 };
        let running = [decoding(32), decoding(32), decoding(32), shared];
        let plan = plan_step(&running, 512, 0);
        assert_eq!(plan.preempt, vec![3, 2]);
        assert_eq!(plan.feeds, vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn a_prompt_chunk_waits_for_blocks_rather_than_preempting() {
        // The prefilling sequence holds one block of a 40-token recompute; none are free.
        let running = [decoding(33), SeqView { cached: 16, blocks: 1, reclaimable: 1, prefill_left: 24 }];
        let plan = plan_step(&running, 512, 0);
        assert_eq!(plan.feeds, vec![(0, 1)]);
        assert!(plan.preempt.is_empty());
    }

    #[test]
    fn a_step_that_could_feed_nothing_preempts_so_the_oldest_progresses() {
        // Two half-prefilled sequences, each blocked on a block the other holds.
        let a = SeqView { cached: 16, blocks: 1, reclaimable: 1, prefill_left: 16 };
        let plan = plan_step(&[a, a], 512, 0);
        assert_eq!(plan.preempt, vec![1]);
        assert_eq!(plan.feeds, vec![(0, 16)]);
    }

    #[test]
    fn an_empty_batch_plans_nothing() {
        assert_eq!(plan_step(&[], 512, 10), StepPlan::default());
    }

    #[test]
    fn admission_stops_at_the_batch_cap_and_at_the_first_request_that_does_not_fit() {
        assert_eq!(admissible([10, 10, 10], 14, 16, 100), 2, "two slots left");
        // 100 tokens take 7 blocks: the second would need 14 of 10 free; the third, small,
        // does not jump the queue.
        assert_eq!(admissible([100, 100, 1], 0, 16, 10), 1);
        assert_eq!(admissible([1], 0, 0, 10), 1, "a batch cap of 0 still admits one");
        assert_eq!(admissible(std::iter::empty(), 0, 16, 10), 0);
    }
    /// The plans carried out on a real block pool, with prefix sharing, many times over:
    /// whatever the mix, every block a plan counts on is there (a reservation never fails),
    /// every sequence finishes, and every block comes back.
    #[test]
    fn plans_carried_out_on_a_shared_pool_never_run_out_of_blocks() {
        use crate::model::{KvCache, LlamaConfig, SeqCache};
        let cfg = LlamaConfig {
            architecture: "llama".into(),
            name: None,
            layers: 1,
            embedding: 8,
            feed_forward: 8,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            context_length: 512,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            vocab_size: 100,
        };
        let mut rng = 0x9e37_79b9_u64;
        let mut next = |n: u64| {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % n
        };
        for round in 0..200 {
            let mut kv = KvCache::new(&cfg, 16 * (8 + next(12) as usize));
            // Tokens (prompt, then output), prompt length, cache, and the tokens to recompute
            // after a preemption.
            struct S {
                tokens: Vec<u32>,
                prompt: usize,
                cache: SeqCache,
                fed: usize,
            }
            let prefixes: Vec<Vec<u32>> =
                (0..3).map(|p| (0..48).map(|i| (p * 31 + i) % 97).collect()).collect();
            let mut waiting: std::collections::VecDeque<S> = (0..10)
                .map(|i| {
                    let shared = 16 + next(33) as usize;
                    let own = 1 + next(30) as usize;
                    let output = 1 + next(40) as usize;
                    let mut tokens: Vec<u32> = prefixes[next(3) as usize][..shared].to_vec();
                    tokens.extend((0..own + output).map(|j| ((i * 7 + j as u64 * 3) % 97) as u32));
                    S { tokens, prompt: shared + own, cache: SeqCache::new(), fed: 0 }
                })
                .collect();
            let mut running: Vec<S> = Vec::new();
            let mut steps = 0;
            while !(waiting.is_empty() && running.is_empty()) {
                steps += 1;
                assert!(steps < 10_000, "round {round}: no progress");
                let n = admissible(
                    waiting.iter().map(|s| s.prompt.max(s.fed) + 1),
                    running.len(),
                    6,
                    kv.free_blocks(),
                );
                for mut s in waiting.drain(..n) {
                    let target = s.prompt.max(s.fed);
                    kv.take_prefix(&mut s.cache, &s.tokens[..target]);
                    kv.reserve(&mut s.cache, target + 1).expect("admissible counted the blocks");
                    running.push(s);
                }
                let views: Vec<SeqView> = running
                    .iter()
                    .map(|s| SeqView {
                        cached: s.cache.len(),
                        blocks: s.cache.capacity() / BLOCK_TOKENS,
                        reclaimable: kv.exclusive_blocks(&s.cache),
                        prefill_left: s.prompt.max(s.fed).saturating_sub(s.cache.len()),
                    })
                    .collect();
                let plan = plan_step(&views, 24, kv.free_blocks());
                let mut victims = plan.preempt.clone();
                victims.sort_unstable_by(|a, b| b.cmp(a));
                let shift = |i: usize| i - plan.preempt.iter().filter(|&&v| v < i).count();
                for v in victims {
                    let mut s = running.remove(v);
                    // Recompute everything it had, as the engine does.
                    s.fed = s.cache.len().max(s.fed);
                    kv.release(&mut s.cache);
                    waiting.push_front(s);
                }
                for &(i, n) in &plan.feeds {
                    let s = &mut running[shift(i)];
                    let end = s.cache.len() + n;
                    kv.reserve(&mut s.cache, end)
                        .unwrap_or_else(|e| panic!("round {round}: the plan overcommitted: {e}"));
                    s.cache.advance(n);
                    kv.register_full_blocks(&mut s.cache, &s.tokens[..end]);
                }
                for mut s in running.extract_if(.., |s| s.cache.len() >= s.tokens.len()) {
                    kv.release(&mut s.cache);
                }
            }
            assert_eq!(kv.free_blocks() * BLOCK_TOKENS, kv.capacity_tokens(), "round {round}: blocks leaked");
        }
    }
}
