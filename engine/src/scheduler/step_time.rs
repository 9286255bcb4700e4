//! What a step costs in time, learned from the steps this engine runs, and what that leaves a
//! step for prompt chunks under the ITL budget (`max_step_ms`).
//!
//! A step's [`Work`] is its tokens and their attention over the context they read
//! ([`super::plan::step_work`]). Its time is close to linear in the two: a fixed part
//! (launching the layers, sampling), a part per token, and a part per attended position,
//! which on a CPU costs several times what its multiply-adds suggest. [`StepClock`] fits that
//! plane to the steps as they run, older steps weighing less, so it follows the machine it runs
//! on and whatever shares it; the engine seeds it with warm-up steps of two sizes, so the first
//! requests are already planned with a fit.
//!
//! [`TimeBound::units`] turns the budget into the units a step may spend: the running streams'
//! gap is the step's length, so with decode rows in the batch a prompt gets the part of the
//! budget the decodes leave. Two floors keep both sides moving: a prompt always gets at least
//! half of what the decodes take (so a batch whose decodes alone fill the budget still
//! prefills, and TTFT does not starve), and the planner always gives the first prompt a
//! minimum chunk ([`super::plan::MIN_CHUNK`]).

use std::time::Duration;

/// How much each older step's weight shrinks per new step: the fit remembers about the last
/// 50 steps.
const DECAY: f64 = 0.98;
/// A step slower than this many times the prediction is counted at this many times it: one
/// stall (a page fault storm, a neighbour's burst) must not make every later chunk tiny.
const OUTLIER: f64 = 4.0;
/// Steps' worth of weight after which the fit judges outliers.
const SETTLED_STEPS: f64 = 8.0;
/// The share of a step that prompt chunks may always take, next to the decodes' time.
const PROMPT_FLOOR: f64 = 0.5;
/// The prior that attention costs per multiply-add what the weights do, worth this many steps:
/// it holds while the steps seen do not tell the two apart and yields once they do.
const PRIOR_STEPS: f64 = 0.2;
/// What keeps a direction the recent steps do not span (all steps alike) at its last value,
/// in steps' worth.
const ANCHOR_STEPS: f64 = 0.02;

/// The work of one step, the fit's two variables.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    /// Tokens fed through the weights.
    pub tokens: f64,
    /// Their attention over the context before them, in tokens of weight work by multiply-adds
    /// (attended positions / the model's attention equivalent).
    pub attention: f64,
}

/// A running, exponentially weighted least-squares fit of step time = fixed + per token ×
/// tokens + per attention unit × attention.
#[derive(Debug, Clone, Default)]
pub struct StepClock {
    w: f64,
    /// Σ weight · x xᵀ and Σ weight · x t over x = (1, tokens, attention).
    xx: [[f64; 3]; 3],
    xt: [f64; 3],
    /// The last fit: fixed seconds, seconds per token, seconds per attention unit.
    fit: Option<[f64; 3]>,
}

impl StepClock {
    /// A clock with no steps seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one step of `work` that took `secs`, weighing `weight` steps' worth.
    pub fn observe_weighted(&mut self, work: Work, secs: f64, weight: f64) {
        let Work { tokens, attention } = work;
        let fine = |v: f64| v.is_finite() && v >= 0.0;
        if !(fine(tokens) && fine(attention) && fine(secs) && fine(weight)) {
            return;
        }
        // Only a fit of some standing judges a step an outlier.
        let secs = match self.predict(work) {
            Some(p) if p > 0.0 && self.w >= SETTLED_STEPS => secs.min(p * OUTLIER),
            _ => secs,
        };
        let d = DECAY.powf(weight);
        let x = [1.0, tokens, attention];
        self.w = self.w * d + weight;
        for i in 0..3 {
            for j in 0..3 {
                self.xx[i][j] = self.xx[i][j] * d + weight * x[i] * x[j];
            }
            self.xt[i] = self.xt[i] * d + weight * x[i] * secs;
        }
        self.refit();
    }

    /// Adds one step of `work` that took `secs`.
    pub fn observe(&mut self, work: Work, secs: f64) {
        self.observe_weighted(work, secs, 1.0);
    }

    fn refit(&mut self) {
        let (mut m, mut r) = (self.xx, self.xt);
        // The prior: per attention unit = per token, worth PRIOR_STEPS of the mean attention.
        let lp = PRIOR_STEPS * self.xx[2][2] / self.w;
        m[1][1] += lp;
        m[2][2] += lp;
        m[1][2] -= lp;
        m[2][1] -= lp;
        if let Some(prev) = self.fit {
            for i in 0..3 {
                let k = ANCHOR_STEPS * (self.xx[i][i] / self.w).max(1e-6);
                m[i][i] += k;
                r[i] += k * prev[i];
            }
        }
        let Some([a, b, c]) = solve3(m, r) else { return };
        // Less than 0 is noise around 0; per token must stay positive to convert a budget.
        let b = b.max(1e-9);
        let fit = [a.max(0.0), b, c.max(0.0)];
        // Two points of the same size cannot tell fixed from per token: no fit yet.
        if self.fit.is_some() || self.identified() {
            self.fit = Some(fit);
        }
    }

    /// Whether the steps seen differ enough in size to tell the fixed part from the per-token.
    fn identified(&self) -> bool {
        let mean = self.xx[0][1] / self.w;
        let var = self.xx[1][1] / self.w - mean * mean;
        var > (0.05 * mean.max(1.0)).powi(2)
    }

    /// The fit: fixed seconds, seconds per token, seconds per attention unit.
    pub fn fit(&self) -> Option<[f64; 3]> {
        self.fit
    }

    /// The predicted time of a step of `work`.
    pub fn predict(&self, work: Work) -> Option<f64> {
        self.fit.map(|[a, b, c]| a + b * work.tokens + c * work.attention)
    }
}

/// Solves `m x = r` by Gaussian elimination with partial pivoting; `None` when singular.
fn solve3(mut m: [[f64; 3]; 3], mut r: [f64; 3]) -> Option<[f64; 3]> {
    let scale = m.iter().flatten().fold(0.0f64, |acc, v| acc.max(v.abs()));
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        if m[pivot][col].abs() <= scale * 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        r.swap(col, pivot);
        let pivot_row = m[col];
        for row in col + 1..3 {
            let f = m[row][col] / pivot_row[col];
            for (cell, p) in m[row].iter_mut().zip(pivot_row).skip(col) {
                *cell -= f * p;
            }
            r[row] -= f * r[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let tail: f64 = (row + 1..3).map(|k| m[row][k] * x[k]).sum();
        x[row] = (r[row] - tail) / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// The ITL budget of a step with the clock's fit it is measured by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBound {
    /// The longest step wanted while streams decode (`max_step_ms`).
    pub max_step: Duration,
    /// [`StepClock::fit`]: fixed seconds, seconds per token, seconds per attention unit.
    pub fit: [f64; 3],
}

impl TimeBound {
    /// `max_step` measured by `clock`; `None` while there is no budget (zero) or no fit.
    pub fn new(clock: &StepClock, max_step: Duration) -> Option<TimeBound> {
        if max_step.is_zero() {
            return None;
        }
        Some(TimeBound { max_step, fit: clock.fit()? })
    }

    /// The attention equivalent in time on this machine: the context length at which a
    /// token's attention takes as long as its weights, given the equivalent by multiply-adds.
    pub fn attention_equiv(&self, by_work: usize) -> usize {
        let [_, b, c] = self.fit;
        if by_work == 0 || c <= 0.0 {
            return 0;
        }
        ((by_work as f64 * b / c).round() as usize).max(1)
    }

    /// The units (tokens, attention counted at [`Self::attention_equiv`]) a step may spend when
    /// its decode rows cost `decode_units`; `None` when the time does not bound it: with no
    /// decode rows, prefill runs at the full token budget, so TTFT does not pay for a gap
    /// nobody waits on.
    pub fn units(&self, decode_units: f64) -> Option<f64> {
        if decode_units <= 0.0 {
            return None;
        }
        let [a, b, _] = self.fit;
        let decodes = a + b * decode_units;
        let budget = self.max_step.as_secs_f64().max(decodes * (1.0 + PROMPT_FLOOR));
        Some((budget - a) / b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
    fn w(tokens: f64, attention: f64) -> Work {
        Work { tokens, attention }
    }
    /// 10 ms fixed, 1 ms a token, 3 ms an attention unit (attention three times slower than
    /// its multiply-adds say).
    fn truth(x: Work) -> f64 {
        0.010 + 0.001 * x.tokens + 0.003 * x.attention
    }

    #[test]
    fn the_fit_finds_the_plane_and_follows_a_slower_machine() {
        let mut c = StepClock::new();
        assert_eq!(c.predict(w(10.0, 0.0)), None);
        let steps = [w(1.0, 0.5), w(8.0, 0.1), w(64.0, 2.0), w(200.0, 30.0), w(16.0, 8.0), w(512.0, 40.0)];
        for x in steps.iter().cycle().take(60) {
            c.observe(*x, truth(*x));
        }
        let [a, b, at] = c.fit().expect("fit");
        assert!(
            (a - 0.010).abs() < 5e-4 && (b - 0.001).abs() < 2e-5 && (at - 0.003).abs() < 2e-4,
            "{a} {b} {at}"
        );
        // A neighbour halves the machine: within some dozens of steps the fit says so.
        for i in 0..200 {
            let x = steps[i % steps.len()];
            c.observe(x, 2.0 * truth(x));
        }
        let p = c.predict(w(100.0, 10.0)).expect("fit");
        assert!((p - 2.0 * truth(w(100.0, 10.0))).abs() < 0.01, "{p}");
    }

    #[test]
    fn one_stall_does_not_poison_the_fit_and_alike_steps_keep_the_slopes() {
        let seed = |c: &mut StepClock| {
            c.observe_weighted(w(8.0, 0.01), 0.018, 5.0);
            c.observe_weighted(w(128.0, 2.3), 0.138, 5.0);
        };
        let mut c = StepClock::new();
        seed(&mut c);
        c.observe(w(8.0, 0.01), 5.0); // a 5 s stall
        let p = c.predict(w(8.0, 0.01)).expect("fit");
        assert!(p < 0.1, "{p}");
        // Many identical decode steps: the slopes stay near the seeds', the fixed part follows.
        let mut c = StepClock::new();
        seed(&mut c);
        for _ in 0..500 {
            c.observe(w(16.0, 0.3), 0.036);
        }
        let [a, b, _] = c.fit().expect("fit");
        assert!((b - 0.001).abs() < 2e-4 && (a - 0.020).abs() < 3e-3, "{a} {b}");
        assert!((c.predict(w(16.0, 0.3)).expect("fit") - 0.036).abs() < 1e-3);
        // Garbage is ignored.
        let before = c.fit();
        c.observe(w(f64::NAN, 0.0), 1.0);
        c.observe(w(1.0, 0.0), -1.0);
        assert_eq!(c.fit(), before);
        // One size of step alone tells nothing apart: no fit.
        let mut c = StepClock::new();
        c.observe(w(8.0, 0.0), 0.02);
        c.observe(w(8.0, 0.0), 0.02);
        assert_eq!(c.fit(), None);
    }

    #[test]
    fn the_budget_leaves_prompts_what_the_decodes_do_not_take_and_never_less_than_half() {
        // 10 ms + 1 ms a unit; a 100 ms budget buys 90 units in all.
        let t = TimeBound { max_step: ms(100), fit: [0.010, 0.001, 0.003] };
        let u = t.units(16.0).expect("bounded");
        assert!((u - 90.0).abs() < 1e-6, "{u}");
        // Decodes alone take 90 ms of a 100 ms budget: prompts still get half of that.
        let u = t.units(80.0).expect("bounded");
        assert!((u - 125.0).abs() < 1e-6, "{u}");
        // Attention three times its multiply-adds: it weighs in at a third of the context.
        assert_eq!(t.attention_equiv(3000), 1000);
        assert_eq!(t.attention_equiv(0), 0);
        // No budget, no decodes or no fit: the token budget alone bounds the step.
        let mut c = StepClock::new();
        assert_eq!(TimeBound::new(&c, ms(100)), None);
        c.observe(w(8.0, 0.0), 0.018);
        c.observe(w(128.0, 2.0), 0.140);
        assert!(TimeBound::new(&c, ms(100)).is_some());
        assert_eq!(TimeBound::new(&c, Duration::ZERO), None);
        assert_eq!(t.units(0.0), None);
    }
}
