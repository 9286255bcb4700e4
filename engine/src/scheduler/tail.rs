//! Holding new prompts for the inter-token tail (`--prefill-hold-ms`).
//!
//! A step that carries a prompt chunk is a long gap in every stream it runs beside. The SLA is
//! written on a percentile of those gaps (P95), so what matters is not how long such a step
//! is but how many of the gaps are such steps: while fewer than [`TAIL_SHARE`] of the recent
//! gaps were long, a prompt may start at once and P95 stays a plain decode step. Past that
//! share, a prompt that has not started yet waits (at most the hold, counted from its arrival)
//! so that the prompts arriving meanwhile start in the same step: one long gap per stream for
//! several prompts instead of one each. Prompts already part-way through keep their chunks, so
//! a long prompt is not stretched further, and a hold never costs a preemption. Prompts let
//! start beside streams go in that one step as far as [`RELEASED_TOKENS`] allows, rather than
//! in chunks cut to the ITL budget (`max_step_ms`) and the token budget: the ledger already
//! bounds how many gaps are long, and a train of budget-sized steps would be as many long gaps
//! as the work takes.
//!
//! [`GapLedger`] counts the recent gaps; [`hold_new_prompts`] decides. Both are pure, and the
//! engine loop carries the decision out.

use std::collections::VecDeque;
use std::time::Duration;

/// The share of recent gaps that may be long steps before new prompts wait: half of the 5 %
/// above a P95, so the percentile lands on a decode step with room for the fit's errors.
pub const TAIL_SHARE: f64 = 0.025;

/// The tokens a step that releases held prompts may feed (or `--max-num-batched-tokens`, if
/// more), so a whole wave of prompts starts in one step: 16 prompts of ~180 tokens did not fit
/// in llama.cpp's default logical batch (2,048), and the rest went in budget-sized steps that
/// held P95 ITL at the budget (docs/benchmarks.md, 2026-12-07: 107 → 46 ms at 16 clients with
/// 4,096, 32 clients fitting in 8,192). Such a step stalls the streams for seconds on a small
/// CPU; the ledger keeps it rare, and it is bounded so a wave of long prompts cannot grow it
/// without limit.
pub const RELEASED_TOKENS: usize = 8192;

/// Gaps the ledger remembers: about ten seconds of a batch of 8 at 20 ms a step.
const WINDOW_GAPS: usize = 4096;

/// The recent steps' gaps: how many streams each step made wait, and whether it carried
/// prompt work (a long gap) or only decodes.
#[derive(Debug, Clone, Default)]
pub struct GapLedger {
    steps: VecDeque<(usize, bool)>,
    gaps: usize,
    long: usize,
}

impl GapLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a step that ended a gap in `gaps` streams; `long` if it carried a prompt chunk.
    pub fn record(&mut self, gaps: usize, long: bool) {
        if gaps == 0 {
            return;
        }
        self.steps.push_back((gaps, long));
        self.gaps += gaps;
        self.long += if long { gaps } else { 0 };
        while self.gaps > WINDOW_GAPS {
            let Some((g, l)) = self.steps.pop_front() else { break };
            self.gaps -= g;
            self.long -= if l { g } else { 0 };
        }
    }

    /// The share of long gaps if the next step made `gaps` more of them.
    pub fn long_share_with(&self, gaps: usize) -> f64 {
        let total = self.gaps + gaps;
        if total == 0 { 0.0 } else { (self.long + gaps) as f64 / total as f64 }
    }
}

/// What the engine knows of the next step when it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoldQuery {
    /// Streams that have their first token and wait for their next one.
    pub gaps: usize,
    /// Whether a prompt already part-way through its prefill runs in the step anyway (then
    /// the step is long whatever else joins it, and holding gains nothing).
    pub prefill_in_progress: bool,
    /// How long the longest-waiting unstarted prompt has waited since it arrived.
    pub oldest_wait: Duration,
    /// The hold (`prefill_hold_ms`); zero never holds.
    pub hold: Duration,
}

/// Whether the unstarted prompts sit this step out.
pub fn hold_new_prompts(ledger: &GapLedger, q: HoldQuery) -> bool {
    if q.hold.is_zero() || q.gaps == 0 || q.prefill_in_progress || q.oldest_wait >= q.hold {
        return false;
    }
    ledger.long_share_with(q.gaps) > TAIL_SHARE
}

/// Whether prompts that [`hold_new_prompts`] let start run at the whole token budget rather
/// than in chunks cut to the ITL budget: with the hold on, streams decoding and no prompt
/// part-way through. The ITL budget bounds how long each gap is; with the hold, the ledger
/// bounds how many gaps are long, which is what a percentile counts.
pub fn released_whole(q: HoldQuery) -> bool {
    !q.hold.is_zero() && q.gaps > 0 && !q.prefill_in_progress
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(gaps: usize, waited_ms: u64) -> HoldQuery {
        HoldQuery {
            gaps,
            prefill_in_progress: false,
            oldest_wait: Duration::from_millis(waited_ms),
            hold: Duration::from_millis(300),
        }
    }

    /// A ledger of `short` decode steps of 8 streams and `long` prompt steps of 8.
    fn ledger(short: usize, long: usize) -> GapLedger {
        let mut l = GapLedger::new();
        (0..short).for_each(|_| l.record(8, false));
        (0..long).for_each(|_| l.record(8, true));
        l
    }

    #[test]
    fn a_prompt_starts_at_once_while_long_gaps_are_rare() {
        // 100 decode steps, no long one: one more long step of 8 is 8 of 808 gaps, under 2.5 %.
        assert!(!hold_new_prompts(&ledger(100, 0), query(8, 0)));
        // 100 decode steps and 3 long ones: a fourth is 32 of 832, 3.8 %: it waits.
        assert!(hold_new_prompts(&ledger(100, 3), query(8, 0)));
    }

    #[test]
    fn the_wait_is_bounded_by_the_hold_from_arrival() {
        let busy = ledger(10, 10);
        assert!(hold_new_prompts(&busy, query(8, 299)));
        assert!(!hold_new_prompts(&busy, query(8, 300)), "held past the hold");
    }

    #[test]
    fn nothing_holds_without_streams_a_hold_or_while_a_prompt_is_part_way() {
        let busy = ledger(10, 10);
        assert!(!hold_new_prompts(&busy, query(0, 0)), "no stream waits: prefill at once");
        assert!(!hold_new_prompts(&busy, HoldQuery { hold: Duration::ZERO, ..query(8, 0) }), "off");
        assert!(
            !hold_new_prompts(&busy, HoldQuery { prefill_in_progress: true, ..query(8, 0) }),
            "the step is long anyway"
        );
    }

    #[test]
    fn released_prompts_run_whole_only_with_the_hold_on_beside_streams() {
        assert!(released_whole(query(8, 0)));
        assert!(
            !released_whole(HoldQuery { hold: Duration::ZERO, ..query(8, 0) }),
            "off: the ITL budget cuts"
        );
        assert!(!released_whole(query(0, 0)), "no stream: nothing to cut for anyway");
        assert!(!released_whole(HoldQuery { prefill_in_progress: true, ..query(8, 0) }));
    }

    #[test]
    fn the_ledger_forgets_old_steps_and_counts_no_empty_one() {
        let mut l = ledger(0, 10);
        assert_eq!(l.long_share_with(0), 1.0);
        l.record(0, true);
        assert_eq!(l.steps.len(), 10, "a step with no stream waiting made no gap");
        // Enough short steps push the long ones out of the window.
        (0..WINDOW_GAPS / 8).for_each(|_| l.record(8, false));
        assert_eq!(l.long, 0);
        assert_eq!(l.gaps, WINDOW_GAPS);
        assert_eq!(GapLedger::new().long_share_with(0), 0.0);
    }
}
