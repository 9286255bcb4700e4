//! Local mode refuses and accepts exactly what the API server does: every invalid case is sent
//! both to a real kube-apiserver (a dry-run create) and to `local::admission`, and the two must
//! report the same violations; every sample is accepted by both, with the same defaults.
//!
//! What is compared, precisely: the set of the refusal's causes, each as (field path, message),
//! where the message is the field error's body (`Invalid value: "10s": sla.window must be ...`,
//! `Required value`, `Unsupported value: "q2_k": supported values: ...`), exactly as the API
//! server returns it in `status.details.causes`. Sets, because the API server walks objects in
//! Go map order, so the order of several causes varies between calls. When there is a single
//! cause the whole `status.message` (`InferenceService.serving.pacer.dev "x" is invalid: ...`)
//! must be equal too.

use crate::common::cases::{invalid_cases, invalid_doc};
use crate::common::{TestNs, repo_file};
use kube::api::{DynamicObject, PostParams};
use pacer_crds::InferenceService;
use pacer_crds::admission::{self, ValidationError};
use serde_json::Value;
use std::collections::BTreeSet;

fn dynamic_api(ns: &TestNs) -> kube::Api<DynamicObject> {
    kube::Api::namespaced_with(
        ns.admin.clone(),
        &ns.name,
        &kube::discovery::ApiResource::erase::<InferenceService>(&()),
    )
}

fn dry_run() -> PostParams {
    PostParams { dry_run: true, ..PostParams::default() }
}

#[tokio::test]
async fn invalid_manifests_get_the_api_servers_messages() {
    let ns = TestNs::new("local-invalid").await;
    let api = dynamic_api(&ns);
    let cases = invalid_cases();
    let mut failures = Vec::new();
    for case in &cases {
        let doc = invalid_doc("invalid", case);
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        let server = match api.create(&dry_run(), &obj).await {
            Ok(_) => {
                failures.push(format!("{}: accepted by the API server", case.what));
                continue;
            }
            Err(kube::Error::Api(status)) if status.code == 422 => status,
            Err(e) => {
                failures.push(format!("{}: API server: {e}", case.what));
                continue;
            }
        };
        if !server.message.contains(case.want) {
            failures
                .push(format!("{}: API server said {:?}, not {:?}", case.what, server.message, case.want));
        }
        let server_causes: BTreeSet<(String, String)> = server
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .map(|c| (c.field.clone(), c.message.clone()))
            .collect();
        let local = match admission::validate_value(doc) {
            Err(ValidationError::Invalid(invalid)) => invalid,
            other => {
                failures.push(format!("{}: local validation gave {other:?}", case.what));
                continue;
            }
        };
        let local_causes: BTreeSet<(String, String)> =
            local.causes.iter().map(|c| (c.field.clone(), c.body())).collect();
        if local_causes != server_causes {
            failures.push(format!(
                "{}:\n  API server: {server_causes:?}\n  local:      {local_causes:?}",
                case.what
            ));
        } else if server_causes.len() == 1 && local.to_string() != server.message {
            failures.push(format!(
                "{}:\n  API server: {:?}\n  local:      {:?}",
                case.what,
                server.message,
                local.to_string()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Numbers compared by value: the API server writes `95`, serde writes `95.0`.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[tokio::test]
async fn samples_are_accepted_with_the_api_servers_defaults() {
    let ns = TestNs::new("local-samples").await;
    let api = dynamic_api(&ns);
    let dir = repo_file("config/samples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("samples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let mut doc: Value = serde_yaml::from_str(&text).expect("yaml");
        doc["metadata"]["namespace"] = Value::from(ns.name.clone());
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        let stored = api
            .create(&dry_run(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{}: the API server refused it: {e}", path.display()));
        let local = admission::validate(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(local.warnings.is_empty(), "{}: {:?}", path.display(), local.warnings);
        let stored_spec = stored.data.get("spec").cloned().unwrap_or_default();
        let local_spec = serde_json::to_value(&local.service.spec).expect("spec");
        assert!(
            same_json(&stored_spec, &local_spec),
            "{}: defaults differ\n  API server: {stored_spec}\n  local:      {local_spec}",
            path.display()
        );
        // And the raw defaulted object, before the typed round trip, equals what was stored.
        let checked_doc = admission::Validator::inference_service()
            .expect("validator")
            .check(serde_yaml::from_str(&text).expect("yaml"))
            .expect("valid");
        assert!(
            same_json(&checked_doc.object["spec"], &stored_spec),
            "{}: defaulted object differs\n  API server: {stored_spec}\n  local:      {}",
            path.display(),
            checked_doc.object["spec"]
        );
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} samples in {}", dir.display());
}
