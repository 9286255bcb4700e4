//! The CRD against a real kube-apiserver: it installs, and each invalid InferenceService is
//! rejected by the schema or a CEL rule with the message a person would need.

mod common;

use common::{TestNs, isvc_doc};
use kube::api::PostParams;
use pacer_crds::InferenceService;
use serde_json::{Value, json};

/// Merges `patch` into `base` (RFC 7386: null deletes a key).
fn merge(base: &mut Value, patch: &Value) {
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

#[tokio::test]
async fn invalid_inferenceservices_are_rejected_with_their_messages() {
    let ns = TestNs::new("validation").await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "min above max",
            json!({"spec": {"replicas": {"min": 3, "max": 2}}}),
            "replicas.min must not exceed replicas.max",
        ),
        (
            "initial batch size outside its range",
            json!({"spec": {"batching": {"maxBatchSize": {"min": 1, "max": 32, "initial": 64}}}}),
            "batching.maxBatchSize.initial must lie within [min, max]",
        ),
        (
            "batch wait range inverted",
            json!({"spec": {"batching": {"batchWaitMs": {"min": 10, "max": 5, "initial": 5}}}}),
            "batching.batchWaitMs.min must not exceed batching.batchWaitMs.max",
        ),
        ("zero TTFT target", json!({"spec": {"sla": {"ttftMs": 0}}}), "spec.sla.ttftMs"),
        (
            "unknown tier",
            json!({"spec": {"quantization": {"allowedTiers": ["q2_k"]}}}),
            "Unsupported value: \"q2_k\"",
        ),
        (
            "preferred tier not allowed",
            json!({"spec": {"quantization": {"allowedTiers": ["native"], "preferredTier": "q4_0"}}}),
            "quantization.preferredTier must be one of quantization.allowedTiers",
        ),
        (
            "degrading with nothing to degrade to",
            json!({"spec": {"quantization": {"allowedTiers": ["native"], "allowDegrade": true}}}),
            "quantization.allowDegrade needs at least two allowedTiers",
        ),
        (
            "two model sources",
            json!({"spec": {"model": {"source": {"pvc": {"claimName": "models", "path": "m.gguf"}}}}}),
            "model.source must set exactly one of pvc, image or url",
        ),
        (
            "no model source",
            json!({"spec": {"model": {"source": {"url": null}}}}),
            "model.source must set exactly one",
        ),
        (
            "digest not hex",
            json!({"spec": {"model": {"source": {"url": {"sha256": "not-a-digest"}}}}}),
            "spec.model.source.url.sha256",
        ),
        (
            "not an HTTP URL",
            json!({"spec": {"model": {"source": {"url": {"url": "ftp://models.example.com/m.gguf"}}}}}),
            "model.source.url.url must be an http:// or https:// URL",
        ),
        (
            "absolute path on a PVC",
            json!({"spec": {"model": {"source": {"url": null, "pvc": {"claimName": "models", "path": "/etc/passwd"}}}}}),
            "model.source.pvc.path must be relative to the volume",
        ),
        (
            "percentile of 100",
            json!({"spec": {"sla": {"percentile": 100}}}),
            "sla.percentile must be at least 50 and below 100",
        ),
        (
            "window too short",
            json!({"spec": {"sla": {"window": "10s"}}}),
            "sla.window must be between 30s and 24h",
        ),
        (
            "evaluation too frequent",
            json!({"spec": {"policy": {"evaluationInterval": "1s"}}}),
            "policy.evaluationInterval must be between 5s and 1h",
        ),
        ("E2E below TTFT", json!({"spec": {"sla": {"e2eMs": 100}}}), "sla.e2eMs must be at least sla.ttftMs"),
        ("unknown mode", json!({"spec": {"policy": {"mode": "Auto"}}}), "Unsupported value: \"Auto\""),
        ("no SLA", json!({"spec": {"sla": null}}), "spec.sla: Required value"),
        (
            "name too long for a Service",
            json!({"metadata": {"name": "a-very-long-inference-service-name-that-cannot-name-a-service"}}),
            "metadata.name must be at most 52 lowercase letters",
        ),
    ];
    assert!(cases.len() >= 10);
    let api = ns.isvcs();
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };

    // The base document itself is valid.
    let base: InferenceService = serde_json::from_value(isvc_doc("valid")).expect("base");
    api.create(&dry_run, &base).await.expect("the base InferenceService is valid");

    let mut failures = Vec::new();
    for (what, patch, want) in &cases {
        let mut doc = isvc_doc("invalid");
        merge(&mut doc, patch);
        // Sent as raw JSON: the typed client would refuse some of these before the server does.
        let api_raw: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
            ns.admin.clone(),
            &ns.name,
            &kube::discovery::ApiResource::erase::<InferenceService>(&()),
        );
        let obj: kube::api::DynamicObject = serde_json::from_value(doc).expect("object");
        match api_raw.create(&dry_run, &obj).await {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(kube::Error::Api(status)) => {
                if status.code != 422 || !status.message.contains(want) {
                    failures.push(format!(
                        "{what}: {} {:?} does not contain {want:?}",
                        status.code, status.message
                    ));
                }
            }
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn defaults_are_filled_in_by_the_api_server() {
    let ns = TestNs::new("defaults").await;
    let created = ns.create(isvc_doc("defaults")).await;
    let s = &created.spec;
    assert_eq!(s.sla.percentile, 95.0);
    assert_eq!(s.sla.window, "5m");
    assert_eq!(s.batching.max_batch_size.initial, 8);
    assert_eq!(s.quantization.allowed_tiers, vec![pacer_crds::Tier::Native]);
    assert_eq!(s.policy.evaluation_interval, "30s");
    assert_eq!(s.engine.image, pacer_crds::DEFAULT_ENGINE_IMAGE);
    assert!(s.engine.resources.requests.as_ref().is_some_and(|r| r.contains_key("cpu")));
}
