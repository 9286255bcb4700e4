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

/// A merge patch that makes `isvc_doc` a vLLM deployment of two variants on one GPU, with
/// `patch` merged into it.
pub fn vllm(patch: Value) -> Value {
    let mut doc = json!({"spec": {
        "model": {"source": null},
        "engine": {"runtime": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        "quantization": {
            "allowedTiers": ["bf16", "fp8"],
            "allowDegrade": true,
            "variants": [
                {"tier": "bf16", "model": "Qwen/Qwen2.5-7B-Instruct"},
                {"tier": "fp8", "model": "Qwen/Qwen2.5-7B-Instruct-FP8-dynamic", "args": ["--kv-cache-dtype=fp8"]},
            ],
        },
    }});
    merge(&mut doc, &patch);
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
            "a vLLM tier with runtime pacer",
            json!({"spec": {"quantization": {"allowedTiers": ["fp8"]}}}),
            "quantization.allowedTiers of pacer-engine are f32, q8_0, native or q4_0",
        ),
        case(
            "a pacer-engine tier with runtime vllm",
            vllm(json!({"spec": {"quantization": {"allowedTiers": ["bf16", "q4_0"]}}})),
            "with engine.runtime vllm, quantization.allowedTiers are vLLM precisions",
        ),
        case(
            "a vLLM tier without its variant",
            vllm(json!({"spec": {"quantization": {"allowedTiers": ["bf16", "fp8", "int4"]}}})),
            "needs a quantization.variants entry naming the model that runs it",
        ),
        case(
            "variants with runtime pacer",
            json!({"spec": {"quantization": {"variants": [{"tier": "bf16", "model": "Qwen/Qwen2.5-7B-Instruct"}]}}}),
            "quantization.variants name vLLM models: set engine.runtime vllm",
        ),
        case(
            "two variants of one tier",
            vllm(json!({"spec": {"quantization": {"variants": [
                {"tier": "bf16", "model": "a/b"}, {"tier": "bf16", "model": "c/d"}, {"tier": "fp8", "model": "e/f"},
            ]}}})),
            "Duplicate value",
        ),
        case(
            "a variant of a pacer-engine tier",
            vllm(json!({"spec": {"quantization": {"variants": [
                {"tier": "bf16", "model": "a/b"}, {"tier": "fp8", "model": "e/f"}, {"tier": "q8_0", "model": "g/h"},
            ]}}})),
            "Unsupported value: \"q8_0\"",
        ),
        case(
            "a variant model with whitespace",
            vllm(json!({"spec": {"quantization": {"variants": [
                {"tier": "bf16", "model": "Qwen/Qwen2.5 7B"}, {"tier": "fp8", "model": "e/f"},
            ]}}})),
            "quantization.variants[].model must be a model id or path without whitespace",
        ),
        case(
            "a variant setting a flag Pacer owns",
            vllm(json!({"spec": {"quantization": {"variants": [
                {"tier": "bf16", "model": "a/b", "args": ["--max-num-seqs=512"]}, {"tier": "fp8", "model": "e/f"},
            ]}}})),
            "quantization.variants[].args must not set the flags Pacer owns",
        ),
        case(
            "vLLM's batch flag in engine.args",
            vllm(json!({"spec": {"engine": {"args": ["--max-num-seqs", "512"]}}})),
            "engine.args must not set the flags Pacer owns",
        ),
        case(
            "runtime pacer without a model source",
            json!({"spec": {"model": {"source": null}}}),
            "model.source is required with engine.runtime pacer",
        ),
        case(
            "a GGUF URL for vLLM",
            vllm(json!({"spec": {"model": {"source": {"url": {
                "url": "https://models.example.com/smol.gguf",
                "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            }}}}})),
            "model.source.url downloads one GGUF file for pacer-engine",
        ),
        case(
            "vLLM without a GPU",
            vllm(
                json!({"spec": {"engine": {"resources": {"limits": {"nvidia.com/gpu": null, "memory": "8Gi"}}}}}),
            ),
            "engine.runtime vllm runs vLLM's CUDA image: set engine.resources.limits[\"nvidia.com/gpu\"]",
        ),
        case(
            "pacer-engine's threads with vLLM",
            vllm(json!({"spec": {"engine": {"threads": 4}}})),
            "engine.device and engine.threads are pacer-engine settings",
        ),
        case(
            "pacer-engine's ITL budget with vLLM",
            vllm(json!({"spec": {"batching": {"maxStepMs": 50}}})),
            "batching.maxStepMs is pacer-engine's ITL budget and vLLM has none",
        ),
        case(
            "pacer-engine's prompt hold with vLLM",
            vllm(json!({"spec": {"batching": {"prefillHoldMs": 50}}})),
            "batching.prefillHoldMs is pacer-engine's prompt hold and vLLM has none",
        ),
        case(
            "a prompt hold as long as the TTFT target",
            json!({"spec": {"batching": {"prefillHoldMs": 400}}}),
            "batching.prefillHoldMs must be below sla.ttftMs",
        ),
        case(
            "a prompt hold past the engine's limit",
            json!({"spec": {"sla": {"ttftMs": 60000}, "batching": {"prefillHoldMs": 20000}}}),
            "spec.batching.prefillHoldMs",
        ),
        case(
            "an unknown runtime",
            json!({"spec": {"engine": {"runtime": "tgi"}}}),
            "Unsupported value: \"tgi\"",
        ),
        case(
            "two rule violations",
            json!({"spec": {"replicas": {"min": 3, "max": 2}, "sla": {"e2eMs": 100, "window": "10s"}}}),
            "replicas.min must not exceed replicas.max",
        ),
    ]
}
