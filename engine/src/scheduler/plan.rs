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

use crate::model::BLOCK_TOKENS;

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

/// Plans one step over `running` (in admission order, oldest first) with `token_budget`
/// tokens and `free_blocks` unallocated KV blocks.
///
/// Every decoding sequence feeds one token first; prompt chunks share what is left of the
/// budget in batch order. If the feeds need more new blocks than are free, the newest sequence
/// is preempted (its blocks return to the pool) and the step is planned again without it,
/// until it fits. A prompt chunk that finds no block free waits for a later step rather than
/// preempting anyone; a step that could feed nothing preempts the newest too, so the oldest
/// sequence always progresses.
pub fn plan_step(running: &[SeqView], token_budget: usize, free_blocks: usize) -> StepPlan {
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
            for &i in alive.iter().filter(|&&i| running[i].prefill_left > 0) {
                if budget == 0 {
                    break;
                }
                let s = running[i];
                // As many tokens as the budget allows and the sequence's blocks plus the free
                // ones can hold.
                let room = (s.blocks + left) * BLOCK_TOKENS - s.cached;
                let chunk = s.prefill_left.min(budget).min(room);
                if chunk == 0 {
                    continue;
                }
                left -= new_blocks(i, chunk);
                budget -= chunk;
                feeds.push((i, chunk));
            }
            if !feeds.is_empty() || alive.len() <= 1 {
                return StepPlan { feeds, preempt };
            }
        }
        // Out of blocks (or no sequence could move): the newest gives its blocks back.
        let Some(victim) = alive.pop() else { return StepPlan { feeds: Vec::new(), preempt } };
        free += running[victim].blocks;
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

    const fn decoding(cached: usize) -> SeqView {
        SeqView { cached, blocks: cached.div_ceil(BLOCK_TOKENS), prefill_left: 0 }
    }
    /// Admitted with blocks for its whole prompt plus one token, nothing prefilled yet.
    const fn admitted(prompt: usize) -> SeqView {
        SeqView { cached: 0, blocks: (prompt + 1).div_ceil(BLOCK_TOKENS), prefill_left: prompt }
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
    fn a_prompt_chunk_waits_for_blocks_rather_than_preempting() {
        // The prefilling sequence holds one block of a 40-token recompute; none are free.
        let running = [decoding(33), SeqView { cached: 16, blocks: 1, prefill_left: 24 }];
        let plan = plan_step(&running, 512, 0);
        assert_eq!(plan.feeds, vec![(0, 1)]);
        assert!(plan.preempt.is_empty());
    }

    #[test]
    fn a_step_that_could_feed_nothing_preempts_so_the_oldest_progresses() {
        // Two half-prefilled sequences, each blocked on a block the other holds.
        let a = SeqView { cached: 16, blocks: 1, prefill_left: 16 };
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
}
