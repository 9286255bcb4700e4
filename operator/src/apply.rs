//! Server-side apply of desired children, skipped when the live object already holds every
//! field the operator sets. A steady-state reconcile therefore writes nothing, while a manual
//! edit of an owned field (seen through the watch) is reverted by the next apply.

use crate::build::FIELD_MANAGER;
use crate::error::Error;
use crate::telemetry::Metrics;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;

/// What applying one child did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The child did not exist and was created.
    Created,
    /// The child differed from the desired object and was updated.
    Updated,
    /// The child already matched; nothing was sent.
    Unchanged,
}

/// Applies `desired` unless `live` already matches it; returns the object as it now is.
pub async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    live: Option<&K>,
    metrics: &Metrics,
) -> Result<(K, Outcome), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let desired_json = serde_json::to_value(desired).map_err(Error::Serialize)?;
    if let Some(live) = live {
        let live_json = serde_json::to_value(live).map_err(Error::Serialize)?;
        if is_subset(&desired_json, &live_json) {
            return Ok((live.clone(), Outcome::Unchanged));
        }
    }
    let name = desired.name_any();
    metrics.writes.with_label_values(&[&kind]).inc();
    let applied = api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired_json))
        .await
        .map_err(|source| Error::Apply { kind: kind.clone(), name: name.clone(), source })?;
    Ok((applied, if live.is_some() { Outcome::Updated } else { Outcome::Created }))
}

/// Whether every field of `want` is present in `have` with the same value. Objects may carry
/// more fields (server defaults, other managers' fields); lists must match element by element,
/// since the operator's lists (args, ports, volumes) are whole values.
pub fn is_subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            w.iter().all(|(k, wv)| h.get(k).is_some_and(|hv| is_subset(wv, hv)) || is_absent_default(wv))
        }
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b))
        }
        (Value::Number(w), Value::Number(h)) => w.as_f64() == h.as_f64(),
        _ => want == have,
    }
}

/// Values the API server drops when stored: an empty object or list, or null.
fn is_absent_default(v: &Value) -> bool {
    matches!(v, Value::Null)
        || matches!(v, Value::Object(o) if o.is_empty())
        || matches!(v, Value::Array(a) if a.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_and_other_fields_do_not_count_as_drift() {
        let want = json!({"spec": {"replicas": 2, "template": {"args": ["a", "b"]}}});
        let have = json!({"spec": {"replicas": 2, "paused": false, "template": {"args": ["a", "b"], "x": 1}}, "status": {}});
        assert!(is_subset(&want, &have));
    }

    #[test]
    fn an_edited_owned_field_is_drift() {
        let want = json!({"spec": {"replicas": 2, "template": {"args": ["a", "b"]}}});
        assert!(!is_subset(&want, &json!({"spec": {"replicas": 5, "template": {"args": ["a", "b"]}}})));
        assert!(!is_subset(&want, &json!({"spec": {"replicas": 2, "template": {"args": ["a"]}}})));
        assert!(!is_subset(&want, &json!({"spec": {"replicas": 2, "template": {"args": ["a", "b", "c"]}}})));
        assert!(!is_subset(&want, &json!({"spec": {"template": {"args": ["a", "b"]}}})));
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(is_subset(&json!({"n": 1}), &json!({"n": 1.0})));
        assert!(is_subset(&json!({"emptyDir": {}}), &json!({})));
    }
}
