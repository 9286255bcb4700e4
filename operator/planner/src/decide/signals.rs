//! What each observation leaves in the planner's history, apart from the decision: the
//! leading signals [`due`] reads (a growing queue), the growth of the requests in flight, the
//! rates of the scale-down stabilization window, and the smoothed request shape.

use super::super::capacity::Workload;
use super::super::levers::Levers;
use super::super::observation::{Freshness, Observation, Seconds};
use super::super::spec::PlannerSpec;
use super::super::{History, SeenShape};

/// Weight of the newest observation in the smoothed request shape.
pub const SHAPE_SMOOTHING: f64 = 0.3;
/// ...when the requests grew longer.
pub const SHAPE_SMOOTHING_UP: f64 = 0.6;

/// Whether the planner should evaluate now: its interval has passed, or a leading signal
/// crossed since the last evaluation (the waiting queue grew over the last two observations).
/// Drivers that observe more often than they evaluate call this on every observation and
/// [`note`] the observation after.
pub fn due(spec: &PlannerSpec, observation: &Observation, history: &History, now: Seconds) -> bool {
    let interval_passed = history.evaluated_at.is_none_or(|t| now - t >= spec.evaluation_interval - 1e-6);
    let waiting = observation.metrics.waiting.filter(|w| w.is_finite());
    let growing = match (history.waiting_seen.as_slice(), waiting) {
        ([a, b], Some(w)) => w > *b && *b > *a && w >= 1.0,
        _ => false,
    };
    let fresh = matches!(observation.freshness, Freshness::Fresh);
    interval_passed || (fresh && growing)
}

/// Records an observation's leading signals in the history (for [`due`] and the forecast).
pub fn note(observation: &Observation, history: &mut History) {
    let m = &observation.metrics;
    if let Some(w) = m.waiting.filter(|w| w.is_finite()) {
        history.waiting_seen.push(w);
        let excess = history.waiting_seen.len().saturating_sub(2);
        history.waiting_seen.drain(..excess);
    }
    if let (Some(r), Some(w)) = (m.running, m.waiting)
        && (r + w).is_finite()
    {
        history.in_flight_seen = Some((observation.at, r + w));
    }
}

/// How fast the requests in flight grew since the last observation noted, per second.
pub(super) fn in_flight_growth(observation: &Observation, history: &History) -> Option<f64> {
    let (at, before) = history.in_flight_seen?;
    let m = &observation.metrics;
    let now = m.running? + m.waiting?;
    let dt = observation.at - at;
    (dt > 0.0 && now.is_finite()).then(|| (now - before) / dt)
}

/// Records a fresh observation's rates (the higher of the two windows', kept over `keep`
/// seconds) and blends its request shape into the smoothed one.
pub(super) fn remember(observation: &Observation, history: &mut History, keep: Seconds, now: Seconds) {
    let m = &observation.metrics;
    if let Some(r) = [m.request_rate, m.request_rate_short]
        .into_iter()
        .flatten()
        .filter(|r| r.is_finite())
        .reduce(f64::max)
    {
        history.recent_rates.retain(|(t, _)| now - t < keep);
        history.recent_rates.push((now, r));
    }
    if let Some(w) = Workload::from_metrics(m) {
        let seen = SeenShape {
            at: now,
            prompt: w.prompt_tokens,
            prompt_tail: w.prompt_tail,
            output: w.output_tokens,
        };
        history.shape = Some(match history.shape {
            Some(old) => blend(old, seen),
            None => seen,
        });
    }
}

/// Notes the request rate per replica of a window whose SLA held with every replica ready (the
/// evidence an unprofiled service gives replicas back on).
pub(super) fn carried(observation: &Observation, current: Levers, history: &mut History) {
    let Some(rate) = observation.metrics.request_rate.filter(|r| r.is_finite() && *r >= 0.0) else { return };
    if observation.ready_replicas < current.replicas || current.replicas < 1 {
        return;
    }
    let per_replica = rate / f64::from(current.replicas);
    let most = history.carried.entry(current.tier.as_str().to_string()).or_insert(0.0);
    *most = most.max(per_replica);
}

/// `seen` blended into `old`: longer requests are taken faster than shorter ones, erring
/// toward the SLA. The prompt length at the percentile is the exception: it is read from
/// histogram buckets (1-2-5 per decade), and inside a wide one a handful of long prompts moves
/// it by hundreds of tokens, so it moves at [`SHAPE_SMOOTHING`] both ways. (Taken up at
/// [`SHAPE_SMOOTHING_UP`], such jumps bought replicas that changed little on `chat-sessions`.)
fn blend(old: SeenShape, seen: SeenShape) -> SeenShape {
    let mix = |old: f64, new: f64| {
        let w = if new > old { SHAPE_SMOOTHING_UP } else { SHAPE_SMOOTHING };
        w * new + (1.0 - w) * old
    };
    SeenShape {
        at: seen.at,
        prompt: mix(old.prompt, seen.prompt),
        prompt_tail: match (old.prompt_tail, seen.prompt_tail) {
            (Some(a), Some(b)) => Some(SHAPE_SMOOTHING * b + (1.0 - SHAPE_SMOOTHING) * a),
            (_, b) => b,
        },
        output: mix(old.output, seen.output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_prompts_are_taken_fast_but_a_bucketed_tail_is_not() {
        let old = SeenShape { at: 0.0, prompt: 800.0, prompt_tail: Some(2000.0), output: 100.0 };
        let seen = SeenShape { at: 30.0, prompt: 1000.0, prompt_tail: Some(2800.0), output: 100.0 };
        let up = blend(old, seen);
        assert!((up.prompt - (800.0 + SHAPE_SMOOTHING_UP * 200.0)).abs() < 1e-9, "{up:?}");
        assert!((up.prompt_tail.unwrap() - (2000.0 + SHAPE_SMOOTHING * 800.0)).abs() < 1e-9, "{up:?}");
        // Both fall at the same pace.
        let down = blend(seen, old);
        assert!((down.prompt - (1000.0 - SHAPE_SMOOTHING * 200.0)).abs() < 1e-9, "{down:?}");
        assert!((down.prompt_tail.unwrap() - (2800.0 - SHAPE_SMOOTHING * 800.0)).abs() < 1e-9, "{down:?}");
        assert_eq!(down.at, 0.0);
    }
}
