//! The CRD against a real kube-apiserver: it installs, and each invalid InferenceService is
//! rejected by the schema or a CEL rule with the message a person would need.

use crate::common::cases::vllm;
use crate::common::{TestNs, isvc_doc};
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
            "a URL without a host",
            json!({"spec": {"model": {"source": {"url": {"url": "https://"}}}}}),
            "model.source.url.url must be a URL with a host",
        ),
        (
            "a URL with whitespace",
            json!({"spec": {"model": {"source": {"url": {"url": "https://models.example.com/my model.gguf"}}}}}),
            "model.source.url.url must not contain whitespace",
        ),
        (
            "a claim name that is no object name",
            json!({"spec": {"model": {"source": {"url": null, "pvc": {"claimName": "Models_1", "path": "m.gguf"}}}}}),
            "model.source.pvc.claimName must be an object name",
        ),
        (
            "an engine image with whitespace",
            json!({"spec": {"engine": {"image": "ghcr.io/pacer-dev/pacer-engine: 0.1.0"}}}),
            "engine.image must be an image reference without whitespace",
        ),
        (
            "an unknown device",
            json!({"spec": {"engine": {"device": "gpu"}}}),
            "engine.device must be cpu, cuda, cuda:N, candle-cpu or auto",
        ),
        (
            "a CUDA device without a GPU limit",
            json!({"spec": {"engine": {"device": "cuda"}}}),
            "engine.device cuda needs a GPU: set resources.limits[\"nvidia.com/gpu\"]",
        ),
        (
            "a model image with whitespace",
            json!({"spec": {"model": {"source": {"url": null, "image": {"reference": "registry.example.com/m :1", "path": "m.gguf"}}}}}),
            "model.source.image.reference must be an image reference without whitespace",
        ),
        (
            "a stabilization window in the centuries",
            json!({"spec": {"policy": {"scaleDownStabilization": "9999999h"}}}),
            "policy.scaleDownStabilization must be between 0s and 1h",
        ),
        (
            "a stabilization window above HPA's hour",
            json!({"spec": {"policy": {"scaleUpStabilization": "61m"}}}),
            "policy.scaleUpStabilization must be between 0s and 1h",
        ),
        (
            "a window that overflows a duration",
            json!({"spec": {"sla": {"window": "99999999999999h"}}}),
            "sla.window must be between 30s and 24h",
        ),
        (
            "evaluations further apart than the window",
            json!({"spec": {"sla": {"window": "1m"}, "policy": {"evaluationInterval": "5m"}}}),
            "policy.evaluationInterval must not exceed sla.window",
        ),
        (
            "a resource that is no quantity",
            json!({"spec": {"engine": {"resources": {"limits": {"memory": "lots"}}}}}),
            "engine.resources.limits must be non-negative quantities",
        ),
        (
            "a negative request",
            json!({"spec": {"engine": {"resources": {"requests": {"cpu": "-1"}}}}}),
            "engine.resources.requests must be non-negative quantities",
        ),
        (
            "a request above its limit",
            json!({"spec": {"engine": {"resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "2Gi"}}}}}),
            "engine.resources.requests must not exceed engine.resources.limits",
        ),
        (
            "a GPU request without a limit",
            json!({"spec": {"engine": {"resources": {"requests": {"nvidia.com/gpu": 1}}}}}),
            "an extended resource such as nvidia.com/gpu must have a limit equal to its request",
        ),
        (
            "a misspelt resource name",
            json!({"spec": {"engine": {"resources": {"limits": {"cpus": "2"}}}}}),
            "engine.resources.limits may name cpu, memory",
        ),
        (
            "a resource claim",
            json!({"spec": {"engine": {"resources": {"claims": [{"name": "gpu"}]}}}}),
            "engine.resources.claims is not supported",
        ),
        (
            "an env var name with '='",
            json!({"spec": {"engine": {"env": [{"name": "A=B", "value": "1"}]}}}),
            "engine.env names must be printable ASCII characters other than '='",
        ),
        (
            "an unknown toleration operator",
            json!({"spec": {"engine": {"tolerations": [{"key": "gpu", "operator": "Equals", "value": "x"}]}}}),
            "Unsupported value: \"Equals\"",
        ),
        (
            "an unknown toleration effect",
            json!({"spec": {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoRun"}]}}}),
            "Unsupported value: \"NoRun\"",
        ),
        (
            "operator Exists with a value",
            json!({"spec": {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}}}),
            "a toleration with operator Exists must not set a value",
        ),
        (
            "a toleration without a key that is not Exists",
            json!({"spec": {"engine": {"tolerations": [{"operator": "Equal", "value": "x"}]}}}),
            "a toleration without a key must use operator Exists",
        ),
        (
            "tolerationSeconds without NoExecute",
            json!({"spec": {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}]}}}),
            "tolerationSeconds needs effect NoExecute",
        ),
        (
            "a toleration key that is no qualified name",
            json!({"spec": {"engine": {"tolerations": [{"key": "gpu pool", "operator": "Exists"}]}}}),
            "engine.tolerations key must be a qualified name",
        ),
        (
            "a node-selector key that is no label key",
            json!({"spec": {"engine": {"nodeSelector": {"pool name": "inference"}}}}),
            "engine.nodeSelector keys must be label keys",
        ),
        (
            "a node-selector value that is no label value",
            json!({"spec": {"engine": {"nodeSelector": {"pacer.dev/pool": "big pool"}}}}),
            "engine.nodeSelector values must be label values",
        ),
        (
            "an extra arg overriding the port",
            json!({"spec": {"engine": {"args": ["--kv-cache-tokens=4096", "--port=9000"]}}}),
            "engine.args must not set the flags Pacer owns",
        ),
        (
            "an extra arg overriding the tier, space-separated",
            json!({"spec": {"engine": {"args": ["--tier", "f32"]}}}),
            "engine.args must not set the flags Pacer owns",
        ),
        (
            "an extra arg overriding the settings file",
            json!({"spec": {"engine": {"args": ["--settings-file=/tmp/x.json"]}}}),
            "engine.args must not set the flags Pacer owns",
        ),
        (
            "an extra arg overriding the model",
            json!({"spec": {"engine": {"args": ["--model=/models/other.gguf"]}}}),
            "engine.args must not set the flags Pacer owns",
        ),
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
    assert_eq!(s.engine.runtime, pacer_crds::Runtime::Pacer);
    // The image is left unset and resolved per runtime, so a vLLM spec never gets pacer's.
    assert_eq!(s.engine.image, None);
    assert_eq!(s.engine.image(), pacer_crds::DEFAULT_ENGINE_IMAGE);
    assert!(s.engine.resources.requests.as_ref().is_some_and(|r| r.contains_key("cpu")));
}

/// A vLLM deployment is admitted, and the Deployment the operator renders for it at every tier
/// and at the batch settings' extremes passes the API server's own validation (a server-side
/// dry-run: vLLM itself cannot run here, and nothing pretends to be it).
#[tokio::test]
async fn a_vllm_inferenceservice_is_admitted_and_its_deployment_passes_a_server_side_dry_run() {
    let ns = TestNs::new("vllm").await;
    let mut doc = isvc_doc("qwen");
    merge(
        &mut doc,
        &vllm(json!({"spec": {
            "model": {"servedName": "qwen", "contextLength": 8192},
            "engine": {"args": ["--gpu-memory-utilization=0.85"], "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
            "batching": {
                "maxBatchSize": {"min": 16, "max": 256, "initial": 64},
                "maxNumBatchedTokens": {"min": 512, "max": 8192, "initial": 2048},
            },
        }})),
    );
    // Weights on a claim, mounted at /models (replacing the base document's GGUF URL).
    doc["spec"]["model"]["source"] = json!({"pvc": {"claimName": "weights", "path": "hub"}});
    let isvc = ns.create(doc).await;
    assert_eq!(isvc.spec.engine.image(), pacer_crds::DEFAULT_VLLM_IMAGE);
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(ns.admin.clone(), &ns.name);
    let params = kube::api::PatchParams::apply(pacer_operator::build::FIELD_MANAGER).force().dry_run();
    let initial = isvc.initial_levers();
    for levers in [
        initial,
        pacer_operator::build::Levers { tier: pacer_crds::Tier::Fp8, ..initial },
        pacer_operator::build::Levers {
            max_batch_size: 256,
            max_num_batched_tokens: 8192,
            replicas: 3,
            ..initial
        },
    ] {
        let d = pacer_operator::build::deployment(&isvc, &levers);
        let name = d.metadata.name.clone().expect("name");
        if let Err(e) = deployments.patch(&name, &params, &kube::api::Patch::Apply(&d)).await {
            panic!("the API server refused the vLLM Deployment at {levers:?}: {e}");
        }
    }
}

/// What the rules above refuse must not catch what Pod validation accepts: every embedded field,
/// used well, is admitted.
#[tokio::test]
async fn a_spec_using_every_embedded_field_well_is_accepted() {
    let ns = TestNs::new("accepted").await;
    let mut doc = isvc_doc("full");
    merge(
        &mut doc,
        &json!({"spec": {
            "engine": {
                "image": "registry.example.com/pacer/engine@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "resources": {
                    "requests": {"cpu": 2, "memory": "1.5Gi", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "2500m", "memory": "2Gi", "nvidia.com/gpu": 1, "hugepages-2Mi": "0"},
                },
                "env": [{"name": "RUST_LOG", "value": "info"}, {"name": "my.setting-1", "value": "x"}],
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "pool", "operator": "Equal", "value": "inference", "effect": "NoExecute", "tolerationSeconds": 60},
                    {"operator": "Exists"},
                ],
                "nodeSelector": {"kubernetes.io/arch": "amd64", "pacer.dev/pool": "inference", "gpu": ""},
                "args": ["--kv-cache-tokens=4096", "--max-waiting=64", "--portable-flag-is-not-port"],
            },
            "sla": {"window": "1h30m"},
            "policy": {"evaluationInterval": "1m", "scaleUpStabilization": "0s", "scaleDownStabilization": "1h"},
        }}),
    );
    let isvc: InferenceService = serde_json::from_value(doc).expect("typed");
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    if let Err(e) = ns.isvcs().create(&dry_run, &isvc).await {
        panic!("a valid spec was refused: {e}");
    }
}

/// `null` on an optional field (enums included) means "unset", as it does for Kubernetes' own
/// types, rather than a value outside the enum.
#[tokio::test]
async fn null_on_optional_fields_means_unset() {
    let ns = TestNs::new("nulls").await;
    let mut doc = isvc_doc("nulls");
    merge(&mut doc, &json!({"spec": {"engine": {"threads": 2}}}));
    let spec = doc["spec"].as_object_mut().expect("spec");
    spec.insert("quantization".into(), json!({"allowedTiers": ["native"], "preferredTier": null}));
    spec["engine"]["imagePullPolicy"] = Value::Null;
    spec["engine"]["threads"] = Value::Null;
    spec["model"]["contextLength"] = Value::Null;
    let api_raw: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        ns.admin.clone(),
        &ns.name,
        &kube::discovery::ApiResource::erase::<InferenceService>(&()),
    );
    let obj: kube::api::DynamicObject = serde_json::from_value(doc).expect("object");
    let created = api_raw.create(&PostParams::default(), &obj).await.expect("nulls are accepted as unset");
    let spec = &created.data["spec"];
    assert!(spec["quantization"].get("preferredTier").is_none(), "{spec}");
    assert!(spec["engine"].get("imagePullPolicy").is_none(), "{spec}");
    let typed = ns.isvcs().get("nulls").await.expect("read back");
    assert_eq!(typed.spec.quantization.preferred_tier, None);
    assert_eq!(typed.spec.engine.image_pull_policy, None);
}
