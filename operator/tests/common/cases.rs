//! Invalid InferenceServices, each a merge patch on `isvc_doc` with a phrase the API server's
//! refusal must contain. Shared by the cluster validation test and the local-mode comparison.

use serde_json::{Value, json};

/// An invalid document: what is wrong, the patch that breaks `isvc_doc`, and a phrase the
/// refusal must contain.
pub struct InvalidCase {
    pub what: &'static str,
    pub patch: Value,
    pub want: &'static str,
}

/// Merges `patch` into `base` (RFC 7386: null deletes a key).
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// `isvc_doc(name)` with the case's patch applied.
pub fn invalid_doc(name: &str, case: &InvalidCase) -> Value {
    let mut doc = super::isvc_doc(name);
    merge(&mut doc, &case.patch);
    doc
}

fn case(what: &'static str, patch: Value, want: &'static str) -> InvalidCase {
    InvalidCase { what, patch, want }
}

/// The CRD's invalid cases: every CEL rule's message and every kind of schema error.
pub fn invalid_cases() -> Vec<InvalidCase> {
    vec![
        case(
            "min above max",
            json!({"spec": {"replicas": {"min": 3, "max": 2}}}),
            "replicas.min must not exceed replicas.max",
        ),
        case(
            "initial batch size outside its range",
            json!({"spec": {"batching": {"maxBatchSize": {"min": 1, "max": 32, "initial": 64}}}}),
            "batching.maxBatchSize.initial must lie within [min, max]",
        ),
        case(
            "batch wait range inverted",
            json!({"spec": {"batching": {"batchWaitMs": {"min": 10, "max": 5, "initial": 5}}}}),
            "batching.batchWaitMs.min must not exceed batching.batchWaitMs.max",
        ),
        case("zero TTFT target", json!({"spec": {"sla": {"ttftMs": 0}}}), "spec.sla.ttftMs"),
        case(
            "TTFT target too large",
            json!({"spec": {"sla": {"ttftMs": 4_000_000}}}),
            "less than or equal to",
        ),
        case(
            "TTFT target not a number",
            json!({"spec": {"sla": {"ttftMs": "fast"}}}),
            "must be of type integer",
        ),
        case("fractional TTFT target", json!({"spec": {"sla": {"ttftMs": 1.5}}}), "spec.sla.ttftMs"),
        case(
            "unknown tier",
            json!({"spec": {"quantization": {"allowedTiers": ["q2_k"]}}}),
            "Unsupported value: \"q2_k\"",
        ),
        case(
            "duplicate tier",
            json!({"spec": {"quantization": {"allowedTiers": ["native", "native"]}}}),
            "Duplicate value",
        ),
        case(
            "no tiers",
            json!({"spec": {"quantization": {"allowedTiers": []}}}),
            "should have at least 1 items",
        ),
        case(
            "too many tiers",
            json!({"spec": {"quantization": {"allowedTiers": ["f32", "q8_0", "native", "q4_0", "f32"]}}}),
            "Too many",
        ),
        case(
            "preferred tier not allowed",
            json!({"spec": {"quantization": {"allowedTiers": ["native"], "preferredTier": "q4_0"}}}),
            "quantization.preferredTier must be one of quantization.allowedTiers",
        ),
        case(
            "degrading with nothing to degrade to",
            json!({"spec": {"quantization": {"allowedTiers": ["native"], "allowDegrade": true}}}),
            "quantization.allowDegrade needs at least two allowedTiers",
        ),
        case(
            "two model sources",
            json!({"spec": {"model": {"source": {"pvc": {"claimName": "models", "path": "m.gguf"}}}}}),
            "model.source must set exactly one of pvc, image or url",
        ),
        case(
            "no model source",
            json!({"spec": {"model": {"source": {"url": null}}}}),
            "model.source must set exactly one",
        ),
        case(
            "digest not hex",
            json!({"spec": {"model": {"source": {"url": {"sha256": "not-a-digest"}}}}}),
            "spec.model.source.url.sha256",
        ),
        case(
            "not an HTTP URL",
            json!({"spec": {"model": {"source": {"url": {"url": "ftp://models.example.com/m.gguf"}}}}}),
            "model.source.url.url must be an http:// or https:// URL",
        ),
        case(
            "a batch larger than any token budget",
            json!({"spec": {"batching": {"maxBatchSize": {"min": 1, "max": 1024, "initial": 8}}}}),
            "batching.maxBatchSize.max must not exceed batching.maxNumBatchedTokens.max",
        ),
        case(
            "an initial batch larger than the initial budget",
            json!({"spec": {"batching": {"maxBatchSize": {"min": 1, "max": 256, "initial": 256},
                                         "maxNumBatchedTokens": {"min": 64, "max": 512, "initial": 128}}}}),
            "batching.maxBatchSize.initial must not exceed batching.maxNumBatchedTokens.initial",
        ),
        case(
            "credentials in the model URL",
            json!({"spec": {"model": {"source": {"url": {"url": "https://user:secret@models.example.com/m.gguf"}}}}}),
            "model.source.url.url must not carry credentials",
        ),
        case(
            "an env entry with value and valueFrom",
            json!({"spec": {"engine": {"env": [{"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}}}),
            "engine.env entries set value or valueFrom, not both",
        ),
        case(
            "absolute path on a PVC",
            json!({"spec": {"model": {"source": {"url": null, "pvc": {"claimName": "models", "path": "/etc/passwd"}}}}}),
            "model.source.pvc.path must be relative to the volume",
        ),
        case(
            "empty PVC claim",
            json!({"spec": {"model": {"source": {"url": null, "pvc": {"claimName": "", "path": "m.gguf"}}}}}),
            "spec.model.source.pvc.claimName",
        ),
        case(
            "served name too long",
            json!({"spec": {"model": {"servedName": "m".repeat(129)}}}),
            "Too long: may not be more than 128",
        ),
        case("served name malformed", json!({"spec": {"model": {"servedName": "-m"}}}), "should match"),
        case(
            "percentile of 100",
            json!({"spec": {"sla": {"percentile": 100}}}),
            "sla.percentile must be at least 50 and below 100",
        ),
        case(
            "window too short",
            json!({"spec": {"sla": {"window": "10s"}}}),
            "sla.window must be between 30s and 24h",
        ),
        case("window not a duration", json!({"spec": {"sla": {"window": "5 minutes"}}}), "spec.sla.window"),
        case(
            "evaluation too frequent",
            json!({"spec": {"policy": {"evaluationInterval": "1s"}}}),
            "policy.evaluationInterval must be between 5s and 1h",
        ),
        case(
            "E2E below TTFT",
            json!({"spec": {"sla": {"e2eMs": 100}}}),
            "sla.e2eMs must be at least sla.ttftMs",
        ),
        case("unknown mode", json!({"spec": {"policy": {"mode": "Auto"}}}), "Unsupported value: \"Auto\""),
        case("no SLA", json!({"spec": {"sla": null}}), "spec.sla: Required value"),
        case("no spec", json!({"spec": null}), "spec: Required value"),
        case("spec not an object", json!({"spec": "fast please"}), "must be of type object"),
        case(
            "boolean as a string",
            json!({"spec": {"quantization": {"allowDegrade": "yes"}}}),
            "must be of type boolean",
        ),
        case(
            "name too long for a Service",
            json!({"metadata": {"name": "a-very-long-inference-service-name-that-cannot-name-a-service"}}),
            "metadata.name must be at most 52 lowercase letters",
        ),
        case("name with capitals", json!({"metadata": {"name": "Smol"}}), "metadata.name"),
        case(
            "two rule violations",
            json!({"spec": {"replicas": {"min": 3, "max": 2}, "sla": {"e2eMs": 100, "window": "10s"}}}),
            "replicas.min must not exceed replicas.max",
        ),
    ]
}
