//! A decision's lever moves, as status, Events and metrics name them.

use super::super::Change;
use super::super::levers::{Direction, Lever, Levers};

/// The levers that differ between `from` and `to`, replicas first, with their directions.
pub fn lever_changes(from: &Levers, to: &Levers) -> Vec<Change> {
    let direction = |up: bool| if up { Direction::Up } else { Direction::Down };
    let mut out = Vec::new();
    if from.replicas != to.replicas {
        out.push(Change {
            lever: Lever::Replicas,
            direction: direction(to.replicas > from.replicas),
            from: from.replicas.to_string(),
            to: to.replicas.to_string(),
        });
    }
    if from.tier != to.tier {
        // Here "up" means towards f32.
        let up = to.tier.bits() > from.tier.bits();
        out.push(Change {
            lever: Lever::Tier,
            direction: direction(up),
            from: from.tier.to_string(),
            to: to.tier.to_string(),
        });
    }
    if (from.max_batch_size, from.batch_wait_ms, from.max_num_batched_tokens)
        != (to.max_batch_size, to.batch_wait_ms, to.max_num_batched_tokens)
    {
        let up = (to.max_batch_size, to.max_num_batched_tokens)
            > (from.max_batch_size, from.max_num_batched_tokens);
        out.push(Change {
            lever: Lever::Batch,
            direction: direction(up),
            from: format!("{}/{}", from.max_batch_size, from.max_num_batched_tokens),
            to: format!("{}/{}", to.max_batch_size, to.max_num_batched_tokens),
        });
    }
    out
}
