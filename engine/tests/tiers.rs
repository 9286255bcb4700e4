//! One set of tier names: every tier the `InferenceService` CRD accepts for `runtime: pacer` is
//! accepted by `pacer-engine --tier`, every tier the engine has is accepted by the CRD, and the
//! vLLM tiers the CRD also knows are refused by the engine. The binary is asked directly, so the
//! check covers the command line the operator writes into pods.

#![allow(clippy::unwrap_used)]

use kube::CustomResourceExt;
use std::process::Command;

/// The `enum` of `quantization.<field>` (or of its items) in the generated CRD schema.
fn crd_tiers(field: &str) -> Vec<String> {
    let crd = serde_json::to_value(pacer_crds::InferenceService::crd()).unwrap();
    let q = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["quantization"]
        ["properties"][field];
    let values = q["enum"].as_array().or_else(|| q["items"]["enum"].as_array()).unwrap();
    values.iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// Whether `pacer-engine` accepts `--tier=<tier>`: a refused value is a usage error (exit 2,
/// naming `--tier`); an accepted one gets as far as loading the (missing) model file.
fn engine_accepts(tier: &str) -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_pacer-engine"))
        .args(["info", &format!("--tier={tier}"), "--model=/nonexistent/pacer-tier-check.gguf"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refused = out.status.code() == Some(2) && stderr.contains("--tier");
    assert!(refused || !out.status.success(), "the missing model must fail: {stderr}");
    !refused
}

#[test]
fn the_crd_and_the_engine_accept_the_same_tiers() {
    let allowed = crd_tiers("allowedTiers");
    assert_eq!(allowed, crd_tiers("preferredTier"));
    let pacer: Vec<&str> = pacer_crds::Runtime::Pacer.tiers().iter().map(|t| t.as_str()).collect();
    assert!(pacer.len() >= 3, "{pacer:?}");
    // The CEL rule that holds `runtime: pacer` to its tiers lists exactly these names.
    let crd = serde_json::to_value(pacer_crds::InferenceService::crd()).unwrap();
    let rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["x-kubernetes-validations"]
        .as_array()
        .unwrap();
    let listed = pacer.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    assert!(
        rules.iter().any(|r| r["rule"].as_str().unwrap().contains(&format!("t in [{listed}]"))),
        "no rule holds runtime pacer to [{listed}]"
    );
    for tier in &allowed {
        let engine = pacer.contains(&tier.as_str());
        assert_eq!(
            engine_accepts(tier),
            engine,
            "{tier}: the CRD's runtime pacer and pacer-engine --tier disagree"
        );
    }
    for tier in pacer_engine::Tier::PACER {
        assert!(pacer.contains(&tier.as_str()), "pacer-engine has {tier}, the CRD refuses it");
    }
    // The check can fail: a name neither knows is refused by both.
    assert!(!engine_accepts("q2_k"));
    assert!(!allowed.iter().any(|a| a == "q2_k"));
}
