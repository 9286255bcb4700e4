//! The schema walker on the real CRD: defaults, pruning, each kind of schema error, blocking,
//! and CEL rules at their nodes.

use super::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "apiVersion": "serving.pacer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "x"},
        "spec": {
            "model": {"source": {"url": {
                "url": "https://models.example.com/smol.gguf",
                "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            }}},
            "sla": {"ttftMs": 400, "itlMs": 60},
        },
    })
}

fn with(pointer: &str, value: Value) -> Value {
    let mut doc = base();
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let target = doc.pointer_mut(parent).expect("parent").as_object_mut().expect("object");
    if value.is_null() {
        target.remove(key);
    } else {
        target.insert(key.to_string(), value);
    }
    doc
}

fn errors(doc: Value) -> Vec<String> {
    match Validator::inference_service().expect("validator").check(doc) {
        Ok(_) => Vec::new(),
        Err(invalid) => invalid.causes.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn defaults_are_filled_as_the_schema_says() {
    let v = validate_value(base()).expect("valid");
    let s = &v.service.spec;
    assert_eq!(s.sla.percentile, 95.0);
    assert_eq!(s.sla.window, "5m");
    assert_eq!(s.replicas.min, 1);
    assert_eq!(s.batching.max_batch_size.initial, 8);
    assert_eq!(s.quantization.allowed_tiers, vec![crate::Tier::Native]);
    assert_eq!(s.policy.evaluation_interval, "30s");
    assert_eq!(s.engine.image(), crate::DEFAULT_ENGINE_IMAGE);
    assert!(v.warnings.is_empty());
}

#[test]
fn unknown_fields_are_dropped_with_a_warning() {
    let v = validate_value(with("/spec/sla/typo", json!(1))).expect("valid");
    assert_eq!(v.warnings, vec![r#"unknown field "spec.sla.typo""#.to_string()]);
}

#[test]
fn schema_errors_read_as_the_api_server_writes_them() {
    let cases = [
        (with("/spec/sla", Value::Null), "spec.sla: Required value"),
        (
            with("/spec/sla/ttftMs", json!(0)),
            "spec.sla.ttftMs: Invalid value: 0: spec.sla.ttftMs in body should be greater than or equal to 1",
        ),
        (
            with("/spec/sla/ttftMs", json!(4_000_000)),
            "spec.sla.ttftMs: Invalid value: 4000000: spec.sla.ttftMs in body should be less than or equal to 3600000",
        ),
        (
            with("/spec/sla/ttftMs", json!("fast")),
            r#"spec.sla.ttftMs: Invalid value: "string": spec.sla.ttftMs in body must be of type integer: "string""#,
        ),
        (
            with("/spec/quantization", json!({"allowedTiers": ["q2_k"]})),
            r#"spec.quantization.allowedTiers[0]: Unsupported value: "q2_k": supported values: "f32", "q8_0", "native", "q4_0", "bf16", "fp16", "fp8", "int8", "int4""#,
        ),
        (
            with("/spec/model/servedName", json!("x".repeat(129))),
            "spec.model.servedName: Too long: may not be more than 128 bytes",
        ),
        (
            with("/spec/model/servedName", json!("-bad")),
            r#"spec.model.servedName: Invalid value: "-bad": spec.model.servedName in body should match '^[A-Za-z0-9][A-Za-z0-9._:/-]*$'"#,
        ),
        (
            with("/spec/quantization", json!({"allowedTiers": ["native", "native"]})),
            r#"spec.quantization.allowedTiers[1]: Duplicate value: "native""#,
        ),
    ];
    for (doc, want) in cases {
        let got = errors(doc);
        assert!(got.iter().any(|g| g == want), "want {want:?} in {got:?}");
    }
}

#[test]
fn blocking_errors_skip_the_rules() {
    let mut doc = with("/spec/sla", Value::Null);
    doc["spec"]["replicas"] = json!({"min": 3, "max": 2});
    let got = errors(doc);
    assert!(
        got.iter()
            .any(|g| g.starts_with("<nil>: Invalid value: null: some validation rules were not checked"))
    );
    assert!(!got.iter().any(|g| g.contains("replicas.min must not exceed")), "{got:?}");
}

#[test]
fn rules_report_at_their_node_with_their_message() {
    let got = errors(with("/spec/replicas", json!({"min": 3, "max": 2})));
    assert_eq!(got, vec!["spec.replicas: Invalid value: replicas.min must not exceed replicas.max"]);
    let got = errors(with("/spec/sla/window", json!("10s")));
    assert!(
        got.iter()
            .any(|g| g == r#"spec.sla.window: Invalid value: "10s": sla.window must be between 30s and 24h"#),
        "{got:?}"
    );
    let got = errors(with("/metadata/name", json!("Bad")));
    assert!(
        got.iter().any(|g| g.starts_with(r#"metadata.name: Invalid value: "Bad": a lowercase RFC 1123"#))
    );
    assert!(
        got.iter().any(|g| g.starts_with("Invalid value: metadata.name must be at most 52")
            || g.contains(": Invalid value: metadata.name must be at most 52")),
        "{got:?}"
    );
}

#[test]
fn the_whole_message_is_the_status_message() {
    let err = validate_value(with("/spec/replicas", json!({"min": 3, "max": 2}))).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        r#"InferenceService.serving.pacer.dev "x" is invalid: spec.replicas: Invalid value: replicas.min must not exceed replicas.max"#
    );
}

#[test]
fn samples_are_accepted() {
    for entry in
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples")).expect("samples")
    {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        validate(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn wrong_kind_and_bad_yaml() {
    let got = errors(with("/kind", json!("Pod")));
    assert_eq!(got, vec![r#"kind: Invalid value: "Pod": must be InferenceService"#]);
    assert!(matches!(validate("a: [b"), Err(ValidationError::Yaml(_))));
    assert!(matches!(validate("- a"), Err(ValidationError::NotAnObject)));
}
