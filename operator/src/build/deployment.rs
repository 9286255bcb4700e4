//! The engine Deployment: `pacer-engine serve` pods with probes on `/ready` and `/health`, a
//! drain on termination, a locked-down security context, the live settings mounted from the
//! ConfigMap, and the model mounted (PVC, OCI image volume) or downloaded by an init container.

use super::{Levers, SETTINGS_FILE, TIER_LABEL, child_meta, labels, selector_labels, settings_name};
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use pacer_crds::{InferenceService, ModelSource};
use serde_json::{Value, json};

/// The engine container's name.
pub const ENGINE_CONTAINER: &str = "engine";
/// The engine's HTTP port (API, metrics, probes).
pub const HTTP_PORT: i32 = 8000;
/// Seconds the engine lets in-flight requests finish after SIGTERM (`--drain-timeout`).
const DRAIN_SECONDS: i64 = 30;
/// Seconds between the pod leaving the Service's endpoints and SIGTERM, so that load balancers
/// stop sending before the engine starts refusing.
const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// Where the model volume is mounted.
const MODEL_DIR: &str = "/models";
/// The file name a downloaded model gets.
const DOWNLOADED_MODEL: &str = "model.gguf";
/// The image of the init container that downloads a model from a URL (curl + sha256sum).
pub const FETCHER_IMAGE: &str = "docker.io/curlimages/curl:8.11.1";

/// The Deployment of engine pods for `isvc` at `levers`.
pub fn deployment(isvc: &InferenceService, levers: &Levers) -> Deployment {
    let spec = &isvc.spec;
    let engine = &spec.engine;
    let (model_volume, model_path, init_containers) = model_volume(isvc);
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--host=0.0.0.0".into(),
        format!("--port={HTTP_PORT}"),
        format!("--model={model_path}"),
        format!("--served-model-name={}", served_name(isvc)),
        format!("--tier={}", levers.tier),
        format!("--max-batch-size={}", levers.max_batch_size),
        format!("--batch-wait-ms={}", levers.batch_wait_ms),
        format!("--settings-file={SETTINGS_FILE}"),
        format!("--drain-timeout={DRAIN_SECONDS}"),
        "--log-format=json".into(),
    ];
    if let Some(threads) = engine.threads {
        args.push(format!("--threads={threads}"));
    }
    if let Some(context) = spec.model.context_length {
        args.push(format!("--context-length={context}"));
    }
    args.extend(engine.args.iter().cloned());

    let mut pod_labels = labels(isvc);
    pod_labels.insert(TIER_LABEL.to_string(), levers.tier.to_string());
    let probe = |path: &str, period: i64, failures: i64| json!({"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures});
    let mut container = json!({
        "name": ENGINE_CONTAINER,
        "image": engine.image,
        "args": args,
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "env": engine.env,
        "resources": engine.resources,
        // Loading and warming the model can take a while on small CPUs; liveness starts after.
        "startupProbe": probe("/health", 2, 150),
        "livenessProbe": probe("/health", 10, 3),
        "readinessProbe": probe("/ready", 2, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "settings", "mountPath": parent_dir(SETTINGS_FILE), "readOnly": true},
            {"name": "model", "mountPath": MODEL_DIR, "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    });
    if let Some(policy) = engine.image_pull_policy {
        container["imagePullPolicy"] = json!(policy.as_str());
    }

    let pod_spec = json!({
        "containers": [container],
        "initContainers": init_containers,
        "volumes": [
            {"name": "settings", "configMap": {"name": settings_name(isvc)}},
            model_volume,
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
        "nodeSelector": engine.node_selector,
        "tolerations": engine.tolerations,
        "imagePullSecrets": engine.image_pull_secrets,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": PRE_STOP_SLEEP_SECONDS + DRAIN_SECONDS + 10,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    });
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_meta(isvc, isvc.name_any()),
        "spec": {
            "replicas": levers.replicas,
            "selector": {"matchLabels": selector_labels(isvc)},
            // A new tier or settings template surges one pod at a time and never removes a
            // ready one first, so capacity does not drop during a rollout.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": 600,
            "revisionHistoryLimit": 5,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    });
    serde_json::from_value(strip_empty(deployment)).expect("the Deployment JSON matches its schema (tested)")
}

/// The model's name in the OpenAI API.
pub fn served_name(isvc: &InferenceService) -> String {
    isvc.spec.model.served_name.clone().unwrap_or_else(|| isvc.name_any())
}

/// The model volume, the path of the GGUF file inside the container, and any init containers.
fn model_volume(isvc: &InferenceService) -> (Value, String, Value) {
    let ModelSource { pvc, image, url } = &isvc.spec.model.source;
    if let Some(pvc) = pvc {
        let volume = json!({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": true}});
        return (volume, format!("{MODEL_DIR}/{}", pvc.path), json!([]));
    }
    if let Some(image) = image {
        let mut source = json!({"reference": image.reference});
        if let Some(policy) = image.pull_policy {
            source["pullPolicy"] = json!(policy.as_str());
        }
        return (json!({"name": "model", "image": source}), format!("{MODEL_DIR}/{}", image.path), json!([]));
    }
    let Some(url) = url else {
        // The CEL rule guarantees exactly one source; an emptyDir keeps the pod well-formed and
        // the engine reports the missing file clearly should an old CRD have let this through.
        return (
            json!({"name": "model", "emptyDir": {}}),
            format!("{MODEL_DIR}/{DOWNLOADED_MODEL}"),
            json!([]),
        );
    };
    // Download once per pod into an emptyDir, verify, then rename: a partial or corrupt file
    // never reaches the engine, and a restarted init container resumes from scratch.
    let script = format!(
        "set -eu\n\
         dest={MODEL_DIR}/{DOWNLOADED_MODEL}\n\
         if [ -f \"$dest\" ] && echo \"$MODEL_SHA256  $dest\" | sha256sum -c -s; then exit 0; fi\n\
         curl -fSL --retry 5 --retry-delay 2 -o \"$dest.part\" \"$MODEL_URL\"\n\
         echo \"$MODEL_SHA256  $dest.part\" | sha256sum -c\n\
         mv \"$dest.part\" \"$dest\"\n"
    );
    let init = json!([{
        "name": "fetch-model",
        "image": FETCHER_IMAGE,
        "command": ["/bin/sh", "-c", script],
        "env": [{"name": "MODEL_URL", "value": url.url}, {"name": "MODEL_SHA256", "value": url.sha256}],
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }]);
    (json!({"name": "model", "emptyDir": {}}), format!("{MODEL_DIR}/{DOWNLOADED_MODEL}"), init)
}

fn container_security_context() -> Value {
    json!({
        "runAsNonRoot": true,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(dir, _)| dir)
}

/// Drops empty arrays and objects, so the applied object names only fields the operator sets
/// (server-side apply would otherwise claim ownership of empty lists).
fn strip_empty(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, strip_empty(v)))
                // `emptyDir: {}` is a volume source whose emptiness is the point.
                .filter(|(k, v)| k == "emptyDir" || !(v.is_null() || is_empty_container(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_empty).collect()),
        other => other,
    }
}

fn is_empty_container(v: &Value) -> bool {
    matches!(v, Value::Array(a) if a.is_empty()) || matches!(v, Value::Object(o) if o.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use pacer_crds::{Tier, UrlSource};

    fn levers() -> Levers {
        Levers { replicas: 2, max_batch_size: 8, batch_wait_ms: 3, tier: Tier::Q4_0 }
    }

    #[test]
    fn engine_pods_run_the_levers_with_probes_drain_and_a_locked_down_context() {
        let d = deployment(&fixtures::isvc(), &levers());
        let spec = d.spec.expect("spec");
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.expect("pod");
        let c = &pod.containers[0];
        let args = c.args.clone().expect("args");
        for want in
            ["--tier=q4_0", "--max-batch-size=8", "--batch-wait-ms=3", "--model=/models/smol/model.gguf"]
        {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        assert!(args.iter().any(|a| a == "--served-model-name=smol"));
        let ready = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("readiness");
        assert_eq!(ready.path.as_deref(), Some("/ready"));
        let live = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("liveness");
        assert_eq!(live.path.as_deref(), Some("/health"));
        let pre_stop = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).expect("preStop");
        assert_eq!(pre_stop.sleep.as_ref().map(|s| s.seconds), Some(PRE_STOP_SLEEP_SECONDS));
        assert!(
            pod.termination_grace_period_seconds.expect("grace") > DRAIN_SECONDS + PRE_STOP_SLEEP_SECONDS
        );
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
        assert_eq!(sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()), Some("RuntimeDefault"));
        let labels = spec.template.metadata.and_then(|m| m.labels).expect("labels");
        assert_eq!(labels[TIER_LABEL], "q4_0");
        assert_eq!(labels[pacer_crds::INFERENCESERVICE_LABEL], "smol");
        let rolling = spec.strategy.and_then(|s| s.rolling_update).expect("rolling update");
        assert_eq!(
            rolling.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
        );
    }

    #[test]
    fn a_url_model_is_downloaded_and_verified_by_an_init_container() {
        let mut isvc = fixtures::isvc();
        isvc.spec.model.source = ModelSource {
            url: Some(UrlSource { url: "https://example.com/m.gguf".into(), sha256: "ab".repeat(32) }),
            ..ModelSource::default()
        };
        let pod = deployment(&isvc, &levers()).spec.and_then(|s| s.template.spec).expect("pod");
        let init = &pod.init_containers.expect("init containers")[0];
        let script = &init.command.as_ref().expect("command")[2];
        assert!(script.contains("sha256sum -c"), "{script}");
        let env = init.env.clone().expect("env");
        assert!(env.iter().any(|e| e.name == "MODEL_SHA256" && e.value.as_deref() == Some(&"ab".repeat(32))));
        assert!(pod.volumes.expect("volumes").iter().any(|v| v.name == "model" && v.empty_dir.is_some()));
    }

    #[test]
    fn extra_args_come_after_the_operators_and_empty_lists_are_not_applied() {
        let mut isvc = fixtures::isvc();
        isvc.spec.engine.args = vec!["--kv-cache-tokens=4096".into()];
        isvc.spec.engine.threads = Some(2);
        let d = deployment(&isvc, &levers());
        let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
        let args = pod.containers[0].args.clone().expect("args");
        assert_eq!(args.last().map(String::as_str), Some("--kv-cache-tokens=4096"));
        assert!(args.iter().any(|a| a == "--threads=2"));
        assert!(pod.tolerations.is_none() && pod.init_containers.is_none() && pod.node_selector.is_none());
    }
}
