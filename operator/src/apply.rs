//! Server-side apply of desired children, skipped only when nothing would change. Each applied
//! object carries a fingerprint of the desired object (an annotation); a child is left alone
//! when the live object has the fingerprint of today's desired object *and* still holds every
//! field the operator sets. A spec change, including a removed field, changes the fingerprint,
//! and the apply then drops what the operator no longer sets (server-side apply removes fields
//! its manager stops sending); a manual edit of an owned field fails the subset check and is
//! reverted. A steady state writes nothing.

use crate::build::FIELD_MANAGER;
use crate::error::Error;
use crate::telemetry::Metrics;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;

/// The annotation holding the fingerprint of the desired object last applied.
pub const APPLIED_HASH_ANNOTATION: &str = "serving.pacer.dev/applied-hash";

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

/// Applies `desired` unless `live` already matches it; returns the object as it now is. An
/// object the API server refuses as invalid (400, 422) is [`Error::Rejected`], with its message.
pub async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    live: Option<&K>,
    metrics: &Metrics,
) -> Result<(K, Outcome), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let desired_json = fingerprinted(serde_json::to_value(desired).map_err(Error::Serialize)?);
    let kind = desired_json["kind"].as_str().unwrap_or("object").to_string();
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
        .map_err(|source| match source {
            kube::Error::Api(status) if status.code == 400 || status.code == 422 => {
                Error::Rejected { kind: kind.clone(), name: name.clone(), message: status.message.clone() }
            }
            source => Error::Apply { kind: kind.clone(), name: name.clone(), source },
        })?;
    Ok((applied, if live.is_some() { Outcome::Updated } else { Outcome::Created }))
}

/// `desired` with [`APPLIED_HASH_ANNOTATION`] set to the fingerprint of the rest of it.
pub fn fingerprinted(mut desired: Value) -> Value {
    let hash = fingerprint(&desired);
    if let Some(meta) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(APPLIED_HASH_ANNOTATION.to_string(), Value::String(hash));
        }
    }
    desired
}

/// FNV-1a (64 bit) of the object's JSON, as 16 hex digits: stable across builds and Rust
/// versions (unlike `DefaultHasher`), so an upgraded operator does not rewrite every child.
/// `serde_json` maps are ordered, so equal objects give equal text.
pub fn fingerprint(value: &Value) -> String {
    let text = value.to_string();
    let hash =
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// Whether every field of `want` is present in `have` with the same value. Objects may carry
/// more fields (server defaults, other managers' fields); lists must match element by element,
/// since the operator's lists (args, ports, volumes) are whole values. Quantities compare by
/// value, since the API server stores them in canonical form (`1.5` → `1500m`).
pub fn is_subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            w.iter().all(|(k, wv)| h.get(k).is_some_and(|hv| is_subset(wv, hv)) || is_absent_default(wv))
        }
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b))
        }
        (Value::Number(w), Value::Number(h)) => w.as_f64() == h.as_f64(),
        (Value::String(w), Value::String(h)) => w == h || same_quantity(w, h),
        _ => want == have,
    }
}

/// Values the API server drops when stored: an empty object or list, or null.
fn is_absent_default(v: &Value) -> bool {
    matches!(v, Value::Null)
        || matches!(v, Value::Object(o) if o.is_empty())
        || matches!(v, Value::Array(a) if a.is_empty())
}

/// Whether two strings are the same Kubernetes quantity written differently.
fn same_quantity(a: &str, b: &str) -> bool {
    match (quantity(a), quantity(b)) {
        (Some(x), Some(y)) => x == y || ((x - y).abs() <= 1e-9 * x.abs().max(y.abs())),
        _ => false,
    }
}

/// A quantity's value (`500m`, `2`, `1.5Gi`, `1e3`), or `None` for anything else.
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(s, f)| text.strip_suffix(s).map(|n| (n, *f)))
        .or_else(|| text.strip_suffix('E').map(|n| (n, 1e18)))
        .unwrap_or((text, 1.0));
    let plain = number.strip_prefix(['+', '-']).unwrap_or(number);
    let (mantissa, exponent) = plain.split_once(['e', 'E']).map_or((plain, None), |(m, e)| (m, Some(e)));
    let digits_ok = !mantissa.is_empty()
        && mantissa.chars().all(|c| c.is_ascii_digit() || c == '.')
        && mantissa.chars().filter(|c| *c == '.').count() <= 1
        && mantissa != ".";
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
    });
    if !(digits_ok && exponent_ok) {
        return None;
    }
    number.parse::<f64>().ok().map(|n| n * scale)
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
    fn numbers_and_quantities_compare_by_value() {
        assert!(is_subset(&json!({"n": 1}), &json!({"n": 1.0})));
        assert!(is_subset(&json!({"emptyDir": {}}), &json!({})));
        assert!(is_subset(&json!({"cpu": "1.5"}), &json!({"cpu": "1500m"})));
        assert!(is_subset(&json!({"memory": "1024Mi"}), &json!({"memory": "1Gi"})));
        assert!(is_subset(&json!({"n": "1e3"}), &json!({"n": "1k"})));
        assert!(!is_subset(&json!({"cpu": "2"}), &json!({"cpu": "1500m"})));
        assert!(!is_subset(&json!({"image": "a:1"}), &json!({"image": "a:2"})));
        assert_eq!(quantity("v1"), None);
        assert_eq!(quantity("."), None);
    }

    /// A removed field is invisible to the subset check (the live object still has it, from the
    /// earlier apply), so only the fingerprint notices it.
    #[test]
    fn a_removed_field_changes_the_fingerprint() {
        let meta = json!({"name": "smol"});
        let before =
            fingerprinted(json!({"metadata": meta, "spec": {"nodeSelector": {"pool": "a"}, "x": 1}}));
        let after = fingerprinted(json!({"metadata": meta, "spec": {"x": 1}}));
        assert!(is_subset(&json!({"metadata": meta, "spec": {"x": 1}}), &before));
        assert!(!is_subset(&after, &before), "the fingerprint differs");
        assert!(is_subset(&after, &after.clone()));
        assert_eq!(fingerprint(&json!({"a": 1, "b": 2})), fingerprint(&json!({"b": 2, "a": 1})));
        let a = &after["metadata"]["annotations"][APPLIED_HASH_ANNOTATION];
        assert_eq!(a.as_str().map(str::len), Some(16));
    }
}
