//! Schemas for the fields that embed Kubernetes types (env, resources, tolerations, node
//! selector) and for the strings the engine pod is built from, bounded and checked the way Pod
//! validation checks them. Without these, a mistake there passes `kubectl apply` and is only
//! refused when the operator writes the Deployment, so the service never starts. Every list and
//! map carries a size bound, so the CEL rules stay within the API server's cost budget.

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use schemars::generate::SchemaGenerator;
use schemars::{JsonSchema, Schema, json_schema};
use serde_json::{Value, json};

/// Most `engine.args`, `engine.env` entries, tolerations and node-selector entries.
pub const MAX_LIST_ITEMS: u64 = 64;
/// Longest single `engine.args` entry.
const MAX_ARG_LEN: u64 = 4096;
/// Longest qualified name (a DNS-1123 subdomain prefix of 253, `/`, a name of 63).
const MAX_QUALIFIED_NAME_LEN: u64 = 317;
/// Longest label value.
const MAX_LABEL_VALUE_LEN: u64 = 63;

/// A Kubernetes qualified name (label keys, taint keys): an optional DNS-1123 subdomain and
/// `/`, then a name of 1-63 alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
pub const QUALIFIED_NAME_RE: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// A label value: empty, or up to 63 alphanumerics, `-`, `_` or `.`, starting and ending
/// alphanumeric.
pub const LABEL_VALUE_RE: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";
/// A DNS-1123 subdomain (object names such as a PVC's).
pub const DNS1123_SUBDOMAIN_RE: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// The `pacer-engine serve` flags the operator sets itself; `engine.args` may not repeat them
/// (clap refuses a flag given twice, and an override would desynchronise status from pods).
pub const OWNED_FLAGS: [&str; 14] = [
    "host",
    "port",
    "model",
    "served-model-name",
    "tier",
    "max-batch-size",
    "batch-wait-ms",
    "max-num-batched-tokens",
    "settings-file",
    "drain-timeout",
    "log-format",
    "threads",
    "context-length",
    "device",
];

/// The duration strings the rules accept before converting them: at most six digits per unit,
/// so `duration()` cannot overflow (the schema's `maxLength` of 16 admits two such groups at
/// most, under 2,000,000 h, far below Go's limit of about 2,562,047 h).
const SAFE_DURATION_RE: &str = r"^([0-9]{1,6}[smh])+$";

fn rule(rule: impl Into<String>, message: impl Into<String>) -> Value {
    json!({"rule": rule.into(), "message": message.into()})
}

fn add_rules(schema: &mut serde_json::Map<String, Value>, rules: impl IntoIterator<Item = Value>) {
    let list = schema.entry("x-kubernetes-validations").or_insert_with(|| json!([]));
    if let Value::Array(items) = list {
        items.extend(rules);
    }
}

fn object(schema: &mut Schema) -> &mut serde_json::Map<String, Value> {
    schema.ensure_object()
}

/// Sets `key` on the property `name` of an object schema, when that property exists.
fn set_on_property(schema: &mut serde_json::Map<String, Value>, name: &str, key: &str, value: Value) {
    if let Some(Value::Object(p)) = schema.get_mut("properties").and_then(|p| p.get_mut(name)) {
        p.insert(key.to_string(), value);
    }
}

/// A CEL expression that is true when the duration string `expr` lies in `[min, max]` and never
/// errors: an out-of-range or malformed value fails the rule (with the rule's message) instead of
/// overflowing inside `duration()`.
pub fn duration_within(expr: &str, min: &str, max: &str) -> String {
    format!(
        "{expr}.matches('{SAFE_DURATION_RE}') && duration({expr}) >= duration('{min}') && duration({expr}) <= duration('{max}')"
    )
}

/// `engine.args`: bounded, and none of them a flag the operator owns for either runtime (the
/// field cannot see which one the spec names; neither server has a use for the other's).
pub fn engine_args(_: &mut SchemaGenerator) -> Schema {
    let mut owned: Vec<&str> = OWNED_FLAGS.to_vec();
    owned.extend(crate::VLLM_OWNED_FLAGS.iter().filter(|f| !OWNED_FLAGS.contains(f)));
    args_without(&owned, "engine.args", (MAX_LIST_ITEMS, MAX_ARG_LEN))
}

/// A variant's `args`: bounded, and none of the `vllm serve` flags the operator owns. Tighter
/// bounds than `engine.args` (16 flags of at most 512 characters): the rule runs once per
/// variant, and the API server refuses a CRD whose rules could cost more than its budget.
pub fn variant_args(_: &mut SchemaGenerator) -> Schema {
    args_without(&crate::VLLM_OWNED_FLAGS, "quantization.variants[].args", (16, 512))
}

fn args_without(owned: &[&str], field: &str, (items, len): (u64, u64)) -> Schema {
    let flags = owned.join("|");
    let listed = owned.iter().map(|f| format!("--{f}")).collect::<Vec<_>>().join(", ");
    let mut schema =
        json_schema!({"type": "array", "items": {"type": "string", "maxLength": len}, "maxItems": items});
    add_rules(
        object(&mut schema),
        [rule(
            format!("self.all(a, !a.matches('^--({flags})(=|$)'))"),
            format!("{field} must not set the flags Pacer owns ({listed}): use the matching spec field"),
        )],
    );
    schema
}

/// A variant's tier: one of vLLM's precision classes.
pub fn vllm_tier(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = crate::Tier::VLLM.iter().map(|t| t.as_str()).collect();
    json_schema!({"type": "string", "enum": names})
}

/// `engine.env`: bounded, names as Pod validation admits them (printable ASCII except `=`).
pub fn env_vars(generator: &mut SchemaGenerator) -> Schema {
    let mut item = EnvVar::json_schema(generator);
    let item_obj = object(&mut item);
    set_on_property(item_obj, "name", "maxLength", json!(256));
    add_rules(
        item_obj,
        [
            rule(
                "self.name.matches('^[ -<>-~]+$')",
                "engine.env names must be printable ASCII characters other than '=', e.g. LOG_LEVEL",
            ),
            // Pod validation refuses both; refused here, the spec never becomes a child the
            // apiserver rejects.
            rule(
                "!has(self.valueFrom) || !has(self.value) || self.value == ''",
                "engine.env entries set value or valueFrom, not both",
            ),
        ],
    );
    json_schema!({"type": "array", "items": item, "maxItems": MAX_LIST_ITEMS})
}

/// `engine.resources`: quantities that parse and are not negative, requests within limits,
/// resource names a container may use, and no resource claims (Pacer declares none on the pod).
pub fn resources(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = ResourceRequirements::json_schema(generator);
    let obj = object(&mut schema);
    for map in ["limits", "requests"] {
        if let Some(Value::Object(p)) = obj.get_mut("properties").and_then(|p| p.get_mut(map)) {
            p.insert("maxProperties".into(), json!(16));
            if let Some(Value::Object(values)) = p.get_mut("additionalProperties") {
                values.insert("maxLength".into(), json!(64));
            }
        }
    }
    let q = |m: &str, k: &str| format!("string(self.{m}[{k}])");
    let quantities = |m: &str| {
        format!(
            "!has(self.{m}) || self.{m}.all(k, isQuantity({v}) && !quantity({v}).isLessThan(quantity('0')))",
            v = q(m, "k")
        )
    };
    let names = |m: &str| {
        format!(
            "!has(self.{m}) || self.{m}.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-') || (k.contains('/') && !k.startsWith('requests.') && !k.contains('kubernetes.io/')))"
        )
    };
    let (req, lim) = (q("requests", "k"), q("limits", "k"));
    add_rules(
        obj,
        [
            rule(
                quantities("limits"),
                "engine.resources.limits must be non-negative quantities such as 500m, 2 or 4Gi",
            ),
            rule(
                quantities("requests"),
                "engine.resources.requests must be non-negative quantities such as 500m, 2 or 4Gi",
            ),
            rule(
                names("limits"),
                "engine.resources.limits may name cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as nvidia.com/gpu",
            ),
            rule(
                names("requests"),
                "engine.resources.requests may name cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as nvidia.com/gpu",
            ),
            rule(
                format!(
                    "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || !isQuantity({req}) || !isQuantity({lim}) || quantity({req}).compareTo(quantity({lim})) <= 0)"
                ),
                "engine.resources.requests must not exceed engine.resources.limits",
            ),
            rule(
                format!(
                    "!has(self.requests) || self.requests.all(k, !k.contains('/') || (has(self.limits) && k in self.limits && (!isQuantity({req}) || !isQuantity({lim}) || quantity({req}).compareTo(quantity({lim})) == 0)))"
                ),
                "an extended resource such as nvidia.com/gpu must have a limit equal to its request",
            ),
            rule(
                "!has(self.claims) || size(self.claims) == 0",
                "engine.resources.claims is not supported: engine pods declare no resource claims",
            ),
        ],
    );
    schema
}

/// `engine.tolerations`: bounded, with the operators, effects and key/value combinations Pod
/// validation admits.
pub fn tolerations(generator: &mut SchemaGenerator) -> Schema {
    let mut item = Toleration::json_schema(generator);
    let item_obj = object(&mut item);
    set_on_property(item_obj, "operator", "enum", json!(["", "Exists", "Equal"]));
    set_on_property(item_obj, "effect", "enum", json!(["", "NoSchedule", "PreferNoSchedule", "NoExecute"]));
    set_on_property(item_obj, "key", "maxLength", json!(MAX_QUALIFIED_NAME_LEN));
    set_on_property(item_obj, "value", "maxLength", json!(MAX_LABEL_VALUE_LEN));
    let exists = "(has(self.operator) && self.operator == 'Exists')";
    add_rules(
        item_obj,
        [
            rule(
                format!("!has(self.key) || self.key == '' || self.key.matches('{QUALIFIED_NAME_RE}')"),
                "engine.tolerations key must be a qualified name such as nvidia.com/gpu",
            ),
            rule(
                format!("(has(self.key) && self.key != '') || {exists}"),
                "engine.tolerations: a toleration without a key must use operator Exists",
            ),
            rule(
                format!("!{exists} || !has(self.value) || self.value == ''"),
                "engine.tolerations: a toleration with operator Exists must not set a value",
            ),
            rule(
                format!("!has(self.value) || self.value.matches('{LABEL_VALUE_RE}')"),
                "engine.tolerations value must be a label value: up to 63 letters, digits, '-', '_' or '.'",
            ),
            rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "engine.tolerations: tolerationSeconds needs effect NoExecute",
            ),
        ],
    );
    json_schema!({"type": "array", "items": item, "maxItems": MAX_LIST_ITEMS})
}

/// `engine.nodeSelector`: bounded, with label keys and values as Pod validation admits them.
pub fn node_selector(_: &mut SchemaGenerator) -> Schema {
    let mut schema = json_schema!({
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_LEN},
        "maxProperties": MAX_LIST_ITEMS,
    });
    add_rules(
        object(&mut schema),
        [
            rule(
                format!(
                    "self.all(k, size(k) <= {MAX_QUALIFIED_NAME_LEN} && k.matches('{QUALIFIED_NAME_RE}'))"
                ),
                "engine.nodeSelector keys must be label keys such as pacer.dev/pool or kubernetes.io/arch",
            ),
            rule(
                format!("self.all(k, self[k].matches('{LABEL_VALUE_RE}'))"),
                "engine.nodeSelector values must be label values: up to 63 letters, digits, '-', '_' or '.'",
            ),
        ],
    );
    schema
}

/// An optional enum as a plain, non-nullable enum, so that `null` is pruned by the API server
/// (it means "unset") instead of being refused as a value outside the enum.
pub fn optional_enum<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    T::json_schema(generator)
}
