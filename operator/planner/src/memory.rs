//! The planner's [`History`] as it is kept in the InferenceService's status
//! (`status.plannerMemory`): versioned JSON, bounded in size. A new leader, or an operator
//! restarted, starts from it instead of an empty history, so a failover keeps the old leader's
//! change times (no scale-down right after its scale-up), its pending scale-up and warm-up
//! cover, and the corrections it learned.

use super::History;
use serde::{Deserialize, Serialize};

/// The format's version; a memory of another version is ignored (the planner starts afresh,
/// which is safe, only slower to act).
pub const VERSION: u32 = 1;

/// The largest memory written: a history that would pass it (many learned corrections) is
/// written without its corrections, then not at all.
pub const MAX_BYTES: usize = 32 * 1024;

#[derive(Serialize, Deserialize)]
struct Memory {
    v: u32,
    history: History,
}

/// `history` as the status carries it, or `None` when it cannot fit [`MAX_BYTES`].
pub fn encode(history: &History) -> Option<String> {
    let whole = serde_json::to_string(&Memory { v: VERSION, history: history.clone() }).ok()?;
    if whole.len() <= MAX_BYTES {
        return Some(whole);
    }
    let lean = History { correction: Default::default(), ..history.clone() };
    serde_json::to_string(&Memory { v: VERSION, history: lean }).ok().filter(|s| s.len() <= MAX_BYTES)
}

/// How far in the future (seconds, clock skew between operator replicas) a time in a memory
/// may lie before the memory is not trusted.
pub const SKEW: f64 = 60.0;

/// The history in a status's memory, read at `now`; `None` for a memory of another version,
/// one that does not parse, or one with a time after `now` + [`SKEW`] (a change "in the
/// future" would hold the levers until then): it is never trusted in part.
pub fn decode(text: &str, now: f64) -> Option<History> {
    if text.len() > MAX_BYTES {
        return None;
    }
    let memory: Memory = serde_json::from_str(text).ok()?;
    let h = memory.history;
    let times = [h.violating_since, h.headroom_since, h.tier_changed_at, h.evaluated_at]
        .into_iter()
        .flatten()
        .chain(h.last_change.values().copied())
        .chain(h.pending_scale_up.map(|p| p.1))
        .chain(h.changes.iter().copied())
        .chain(h.in_flight_seen.map(|p| p.0))
        .chain(h.recent_rates.iter().map(|p| p.0))
        .chain(h.shape.map(|s| s.at));
    let sane = times.into_iter().all(|t| t.is_finite() && t <= now + SKEW);
    (memory.v == VERSION && sane).then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Correction, SeenShape};

    /// Just after every time in [`lived`].
    const NOW: f64 = 1_764_000_060.0;

    fn lived() -> History {
        let mut h = History {
            ttft_ratio: Some(0.731_234_567_891_234_5),
            violating_since: Some(1_764_000_001.25),
            pending_scale_up: Some((3, 1_764_000_002.5)),
            tier_changed_at: Some(1_764_000_000.0),
            pod_start: Some(41.7),
            cover: Some((8, 256)),
            evaluated_at: Some(1_764_000_030.0),
            waiting_seen: vec![2.0, 5.0],
            in_flight_seen: Some((1_764_000_030.0, 7.0)),
            recent_rates: vec![(1_764_000_000.0, 3.3), (1_764_000_030.0, 4.1)],
            changes: vec![1_764_000_002.5],
            shape: Some(SeenShape {
                at: 1_764_000_030.0,
                prompt: 812.5,
                prompt_tail: Some(1950.0),
                output: 96.0,
            }),
            ..History::default()
        };
        h.last_change.insert("replicas".into(), 1_764_000_002.5);
        h.correction.insert("native/8/512".into(), Correction { ttft: 1.234_567_890_123, itl: 0.9 });
        h
    }

    #[test]
    fn a_history_survives_the_status_exactly() {
        let h = lived();
        let text = encode(&h).expect("fits");
        assert_eq!(decode(&text, NOW), Some(h));
        assert_eq!(decode(&encode(&History::default()).expect("fits"), NOW), Some(History::default()));
    }

    #[test]
    fn another_version_or_garbage_is_ignored_whole() {
        let text = encode(&lived()).expect("fits").replacen("\"v\":1", "\"v\":2", 1);
        assert_eq!(decode(&text, NOW), None);
        assert_eq!(decode("not json", NOW), None);
        assert_eq!(decode("{\"v\":1,\"history\":{\"pending_scale_up\":\"soon\"}}", NOW), None);
        assert_eq!(decode(&"x".repeat(MAX_BYTES + 1), NOW), None);
        // A change stamped an hour ahead would freeze the levers until then.
        let mut ahead = lived();
        ahead.last_change.insert("batch".into(), NOW + 3600.0);
        assert_eq!(decode(&encode(&ahead).expect("fits"), NOW), None);
        assert!(decode(&encode(&lived()).expect("fits"), NOW - 2.0 * SKEW).is_none());
    }

    #[test]
    fn an_oversized_history_drops_its_corrections_first() {
        let mut h = lived();
        for i in 0..2000 {
            h.correction.insert(format!("native/{i}/512"), Correction::default());
        }
        let text = encode(&h).expect("fits without corrections");
        assert!(text.len() <= MAX_BYTES);
        let back = decode(&text, NOW).expect("decodes");
        assert!(back.correction.is_empty());
        assert_eq!(back.last_change, h.last_change);
        assert_eq!(back.pending_scale_up, h.pending_scale_up);
    }
}
