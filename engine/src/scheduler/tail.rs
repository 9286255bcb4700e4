//! Shaping prompt work for the inter-token tail (`--prefill-hold-ms`).
//!
//! A step that carries prompt work is a long gap in every stream it runs beside. The SLA is
//! written on a percentile of those gaps (P95), so what matters is not how long such a step
//! is but how many of the gaps are such steps. With the hold on:
//!
//! - While fewer than [`TAIL_SHARE`] of the recent gaps were long (or no stream waits at all),
//!   all the waiting prompt work goes in one step, as far as [`RELEASED_TOKENS`] allows:
//!   prompts that arrived and prompts already part-way through. A ~1,000-token prompt is then
//!   one long gap, not ten cut to the ITL budget, and prompts that arrive together start and
//!   finish together, so their streams decode side by side and their next prompts arrive
//!   together too.
//! - Past that share, a prompt that has not started waits (at most the hold, counted from its
//!   arrival) so that the prompts arriving meanwhile start in the same step: one long gap per
//!   stream for several prompts instead of one each. A prompt already part-way through goes
//!   on in chunks cut to the ITL budget (`max_step_ms`): the percentile is a long gap by then,
//!   and the budget keeps it short. A hold never costs a preemption.
//!
//! With the hold off, the ITL budget cuts every step and the tail is that budget.
//!
//! [`GapLedger`] counts the recent gaps; [`prompt_step`] decides. Both are pure, and the engine
//! loop carries the decision out.

use std::collections::VecDeque;
use std::time::Duration;

/// The share of recent gaps that may be long steps before new prompts wait: half of the 5 %
/// above a P95, so the percentile lands on a decode step with room for the fit's errors.
pub const TAIL_SHARE: f64 = 0.025;

/// The tokens a step that releases held prompts may feed (or `--max-num-batched-tokens`, if
/// more), so a whole wave of prompts starts in one step: 16 prompts of ~180 tokens did not fit
/// in llama.cpp's default logical batch (2,048), and the rest went in budget-sized steps that
/// held P95 ITL at the budget (docs/benchmarks.md, "The prompt hold: the released step's
/// size": 32 clients' prompts fit in 8,192). Such a step stalls the streams for seconds on a
/// small CPU; the ledger keeps it rare, and it is bounded so a wave of long prompts cannot grow
/// it without limit.
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
    /// How long the longest-waiting unstarted prompt has waited since it arrived; `None` when
    /// every prompt has started.
    pub oldest_wait: Option<Duration>,
    /// The hold (`prefill_hold_ms`); zero never holds.
    pub hold: Duration,
}

/// How the next step treats the prompt work that is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptStep {
    /// Every prompt goes in this step as far as [`RELEASED_TOKENS`] (or the token budget, if
    /// more) allows: one long gap for all of them.
    Whole,
    /// Prompts go in chunks cut to the ITL budget and the token budget: the hold is off, or
    /// long gaps are already too common for one more long one, and a prompt part-way through
    /// rides in this step anyway.
    Budgeted,
    /// Prompts that have not started sit this step out; the streams decode alone.
    HoldNew,
}

/// How the next step runs its prompt work, given the recent gaps.
///
/// - The hold off: [`PromptStep::Budgeted`], the ITL budget bounds every gap.
/// - No stream waits, or one more long step keeps the long gaps under [`TAIL_SHARE`]: the
///   whole of it in this step ([`PromptStep::Whole`]), prompts part-way through included, so a
///   long prompt is one long gap and not ten budget-sized ones, and prompts that arrive
///   together start, and then finish, together.
/// - Long gaps too common: a prompt part-way through runs in budget-sized chunks (the step is
///   long anyway, and keeping it short keeps the percentile's long gaps short); prompts not
///   yet started wait for the hold, counted from their arrival, and then go whole together.
pub fn prompt_step(ledger: &GapLedger, q: HoldQuery) -> PromptStep {
    if q.hold.is_zero() {
        return PromptStep::Budgeted;
    }
    if q.gaps == 0 || ledger.long_share_with(q.gaps) <= TAIL_SHARE {
        return PromptStep::Whole;
    }
    if q.prefill_in_progress {
        return PromptStep::Budgeted;
    }
    match q.oldest_wait {
        Some(waited) if waited < q.hold => PromptStep::HoldNew,
        _ => PromptStep::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(gaps: usize, waited_ms: u64) -> HoldQuery {
        HoldQuery {
            gaps,
            prefill_in_progress: false,
            oldest_wait: Some(Duration::from_millis(waited_ms)),
            hold: Duration::from_millis(300),
        }
    }

    /// A prompt part-way through, none unstarted.
    fn part_way(gaps: usize) -> HoldQuery {
        HoldQuery { prefill_in_progress: true, oldest_wait: None, ..query(gaps, 0) }
    }

    /// A ledger of `short` decode steps of 8 streams and `long` prompt steps of 8.
    fn ledger(short: usize, long: usize) -> GapLedger {
        let mut l = GapLedger::new();
        (0..short).for_each(|_| l.record(8, false));
        (0..long).for_each(|_| l.record(8, true));
        l
    }

    #[test]
    fn a_prompt_starts_whole_at_once_while_long_gaps_are_rare() {
        // 100 decode steps, no long one: one more long step of 8 is 8 of 808 gaps, under 2.5 %.
        assert_eq!(prompt_step(&ledger(100, 0), query(8, 0)), PromptStep::Whole);
        // 100 decode steps and 3 long ones: a fourth is 32 of 832, 3.8 %: it waits.
        assert_eq!(prompt_step(&ledger(100, 3), query(8, 0)), PromptStep::HoldNew);
    }

    #[test]
    fn a_prompt_part_way_finishes_whole_while_long_gaps_are_rare_and_in_chunks_past_that() {
        assert_eq!(prompt_step(&ledger(100, 0), part_way(8)), PromptStep::Whole, "not ten long gaps");
        assert_eq!(
            prompt_step(&ledger(100, 3), part_way(8)),
            PromptStep::Budgeted,
            "long anyway: keep it short"
        );
        assert_eq!(
            prompt_step(&ledger(100, 3), HoldQuery { prefill_in_progress: true, ..query(8, 0) }),
            PromptStep::Budgeted,
            "unstarted prompts ride along with the part-way one, not held behind it"
        );
    }

    #[test]
    fn the_wait_is_bounded_by_the_hold_from_arrival_and_then_they_go_whole() {
        let busy = ledger(10, 10);
        assert_eq!(prompt_step(&busy, query(8, 299)), PromptStep::HoldNew);
        assert_eq!(prompt_step(&busy, query(8, 300)), PromptStep::Whole, "held past the hold");
    }

    #[test]
    fn with_no_stream_waiting_prompts_go_whole_and_without_the_hold_always_budgeted() {
        let busy = ledger(10, 10);
        assert_eq!(prompt_step(&busy, query(0, 0)), PromptStep::Whole, "no stream waits: nobody's gap");
        assert_eq!(prompt_step(&busy, part_way(0)), PromptStep::Whole);
        let off = |q: HoldQuery| HoldQuery { hold: Duration::ZERO, ..q };
        for l in [ledger(100, 0), busy] {
            for q in [query(8, 0), query(0, 0), part_way(8), part_way(0)] {
                assert_eq!(prompt_step(&l, off(q)), PromptStep::Budgeted, "off: the ITL budget cuts");
            }
        }
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
