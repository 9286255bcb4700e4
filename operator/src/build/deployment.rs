//! The engine Deployment: `pacer-engine serve` pods with probes on `/ready` and `/health` (on a
//! port of their own, so a flood of API connections neither fails them nor the scrapes), a
//! drain on termination, a locked-down security context, the live settings mounted from the
//! ConfigMap, and the model mounted (PVC, OCI image volume) or downloaded by an init container.
//! Built from typed structs, so a misspelt field is a compile error rather than a dropped key.
//! The batch settings are not in the pod template: they reach the engines only through the
//! settings ConfigMap, which the engine reads at start and re-reads live, so moving the batch
//! lever restarts no pod. With `engine.runtime: vllm` the container is vLLM's ([`super::vllm`]);
//! the Deployment around it is the same.

use super::{Levers, SETTINGS_FILE, TIER_LABEL, child_meta, labels, selector_labels, settings_name};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    HTTPGetAction, ImageVolumeSource, Lifecycle, LifecycleHandler, PersistentVolumeClaimVolumeSource,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecurityContext, SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use pacer_crds::{EngineSpec, InferenceService, ModelSource, Runtime};
use std::collections::BTreeMap;

/// The engine container's name.
pub const ENGINE_CONTAINER: &str = "engine";
/// The engine's HTTP port (the OpenAI API; `/metrics` and the probes answer there too).
pub const HTTP_PORT: i32 = 8000;
/// The engine's probe port (`--probe-port`): `/health`, `/ready` and `/metrics` only, with a
/// connection limit apart from the API's. The kubelet's probes and the PodMonitor use it.
pub const PROBE_PORT: i32 = 8001;
/// The probe port's name in the pod spec (the probes and the scrape jobs name it).
pub const PROBE_PORT_NAME: &str = "probes";
/// Seconds the engine lets in-flight requests finish after SIGTERM (`--drain-timeout`).
pub const DRAIN_SECONDS: i64 = 30;
/// Seconds between the pod leaving the Service's endpoints and SIGTERM, so that load balancers
/// stop sending before the engine starts refusing.
pub const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// Seconds the kubelet waits before SIGKILL: the preStop sleep, then the drain, then a margin for
/// the process to flush and exit. Derived here so the three never disagree.
pub const TERMINATION_GRACE_SECONDS: i64 = PRE_STOP_SLEEP_SECONDS + DRAIN_SECONDS + 10;
/// Where the model volume is mounted.
pub(super) const MODEL_DIR: &str = "/models";
/// The file name a downloaded model gets.
const DOWNLOADED_MODEL: &str = "model.gguf";
/// The image of the init container that downloads a model from a URL (curl + sha256sum).
pub const FETCHER_IMAGE: &str = "docker.io/curlimages/curl:8.11.1";
/// The non-root user and group the engine runs as.
const RUN_AS: i64 = 65532;

/// The engine's `--device`: the spec's, else `cuda` for a container with a GPU limit (the
/// device plugin shows it its GPUs from 0), else `cpu`.
pub fn engine_device(engine: &EngineSpec) -> String {
    if let Some(device) = &engine.device {
        return device.clone();
    }
    let gpu = engine.resources.limits.as_ref().is_some_and(|l| l.contains_key(GPU_RESOURCE));
    if gpu { "cuda".into() } else { "cpu".into() }
}

/// The extended resource NVIDIA's device plugin advertises.
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A runtime's engine pod: its container, init containers and volumes, and the pod-level
/// security context; [`deployment`] adds what every engine pod shares.
pub(super) struct EnginePod {
    /// The engine container.
    pub container: Container,
    /// Init containers (the model download).
    pub init_containers: Vec<Container>,
    /// The pod's volumes.
    pub volumes: Vec<Volume>,
    /// The pod's security context.
    pub security: PodSecurityContext,
}

/// The Deployment of engine pods for `isvc` at `levers`: `pacer-engine` pods, or vLLM's
/// ([`super::vllm`]) with `engine.runtime: vllm`.
pub fn deployment(isvc: &InferenceService, levers: &Levers) -> Deployment {
    let engine = &isvc.spec.engine;
    let pod = match engine.runtime {
        Runtime::Pacer => pacer_pod(isvc, levers),
        Runtime::Vllm => super::vllm::pod(isvc, levers),
    };
    let mut pod_labels = labels(isvc);
    pod_labels.insert(TIER_LABEL.to_string(), levers.tier.to_string());
    let pod_spec = PodSpec {
        containers: vec![pod.container],
        init_containers: non_empty(pod.init_containers),
        volumes: Some(pod.volumes),
        node_selector: non_empty_map(engine.node_selector.clone()),
        tolerations: non_empty(engine.tolerations.clone()),
        image_pull_secrets: non_empty(engine.image_pull_secrets.clone()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        security_context: Some(pod.security),
        ..PodSpec::default()
    };
    Deployment {
        metadata: child_meta(isvc, isvc.name_any()),
        spec: Some(DeploymentSpec {
            replicas: Some(levers.replicas),
            selector: LabelSelector { match_labels: Some(selector_labels(isvc)), ..LabelSelector::default() },
            // A new template (another tier; for vLLM, also other batch settings) surges one
            // pod at a time and never removes a ready one first, so capacity does not drop
            // during a rollout.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            progress_deadline_seconds: Some(600),
            revision_history_limit: Some(5),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..ObjectMeta::default() }),
                spec: Some(pod_spec),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The `pacer-engine serve` pod.
fn pacer_pod(isvc: &InferenceService, levers: &Levers) -> EnginePod {
    let spec = &isvc.spec;
    let engine = &spec.engine;
    let (model_volume, model_path, init_containers) = model_volume(isvc);
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--host=0.0.0.0".into(),
        format!("--port={HTTP_PORT}"),
        format!("--probe-port={PROBE_PORT}"),
        format!("--model={model_path}"),
        format!("--served-model-name={}", served_name(isvc)),
        format!("--tier={}", levers.tier),
        format!("--device={}", engine_device(engine)),
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

    let container = Container {
        name: ENGINE_CONTAINER.into(),
        image: Some(engine.image().to_string()),
        image_pull_policy: engine.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(args),
        ports: Some(vec![container_port("http", HTTP_PORT), container_port(PROBE_PORT_NAME, PROBE_PORT)]),
        env: non_empty(engine.env.clone()),
        resources: Some(engine.resources.clone()),
        // Loading and warming the model can take a while on small CPUs; liveness starts after.
        startup_probe: Some(probe("/health", PROBE_PORT_NAME, 2, 150)),
        liveness_probe: Some(probe("/health", PROBE_PORT_NAME, 10, 3)),
        readiness_probe: Some(probe("/ready", PROBE_PORT_NAME, 2, 2)),
        lifecycle: Some(pre_stop_sleep()),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![
            mount("settings", parent_dir(SETTINGS_FILE), true),
            mount("model", MODEL_DIR, true),
            mount("tmp", "/tmp", false),
        ]),
        ..Container::default()
    };
    let volumes = vec![
        Volume {
            name: "settings".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: settings_name(isvc),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        model_volume,
        empty_dir("tmp", Some("64Mi"), None),
    ];
    let security = PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    };
    EnginePod { container, init_containers, volumes, security }
}

/// A named TCP container port.
pub(super) fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

/// A volume mount.
pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// An emptyDir volume, optionally size-limited and in memory.
pub(super) fn empty_dir(name: &str, size_limit: Option<&str>, medium: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: size_limit.map(|s| Quantity(s.into())),
            medium: medium.map(Into::into),
        }),
        ..Volume::default()
    }
}

/// The preStop sleep that lets load balancers stop sending before the drain.
pub(super) fn pre_stop_sleep() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            sleep: Some(SleepAction { seconds: PRE_STOP_SLEEP_SECONDS }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// The model's name in the OpenAI API.
pub fn served_name(isvc: &InferenceService) -> String {
    isvc.spec.model.served_name.clone().unwrap_or_else(|| isvc.name_any())
}

/// An HTTP GET probe of `path` on the named port.
pub(super) fn probe(path: &str, port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(port.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// `None` for an empty list: server-side apply would otherwise claim ownership of it.
pub(super) fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

fn non_empty_map(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

/// The volume of a `pvc` or `image` model source, named `model`, and the path inside it the
/// spec gives; `None` for a URL source or none.
pub(super) fn source_volume(source: &ModelSource) -> Option<(Volume, &str)> {
    let named = |v: Volume| Volume { name: "model".into(), ..v };
    if let Some(pvc) = &source.pvc {
        let volume = named(Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.claim_name.clone(),
                read_only: Some(true),
            }),
            ..Volume::default()
        });
        return Some((volume, &pvc.path));
    }
    let image = source.image.as_ref()?;
    let volume = named(Volume {
        image: Some(ImageVolumeSource {
            reference: Some(image.reference.clone()),
            pull_policy: image.pull_policy.map(|p| p.as_str().to_string()),
        }),
        ..Volume::default()
    });
    Some((volume, &image.path))
}

/// The model volume, the path of the GGUF file inside the container, and any init containers.
fn model_volume(isvc: &InferenceService) -> (Volume, String, Vec<Container>) {
    let none = ModelSource::default();
    let source = isvc.spec.model.source.as_ref().unwrap_or(&none);
    if let Some((volume, path)) = source_volume(source) {
        return (volume, format!("{MODEL_DIR}/{path}"), Vec::new());
    }
    let scratch = || empty_dir("model", None, None);
    let Some(url) = &source.url else {
        // The CEL rule guarantees exactly one source; an emptyDir keeps the pod well-formed and
        // the engine reports the missing file clearly should an old CRD have let this through.
        return (scratch(), format!("{MODEL_DIR}/{DOWNLOADED_MODEL}"), Vec::new());
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
    let env =
        |name: &str, value: &str| EnvVar { name: name.into(), value: Some(value.into()), value_from: None };
    let q = |s: &str| Quantity(s.into());
    let init = Container {
        name: "fetch-model".into(),
        image: Some(FETCHER_IMAGE.into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script]),
        env: Some(vec![env("MODEL_URL", &url.url), env("MODEL_SHA256", &url.sha256)]),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![VolumeMount {
            name: "model".into(),
            mount_path: MODEL_DIR.into(),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), q("100m")), ("memory".into(), q("64Mi"))])),
            limits: Some(BTreeMap::from([("memory".into(), q("256Mi"))])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    (scratch(), format!("{MODEL_DIR}/{DOWNLOADED_MODEL}"), vec![init])
}

pub(super) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }
}

pub(super) fn container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(dir, _)| dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use pacer_crds::{Tier, UrlSource};

    fn levers() -> Levers {
        Levers {
            replicas: 2,
            max_batch_size: 8,
            batch_wait_ms: 3,
            max_num_batched_tokens: 512,
            tier: Tier::Q4_0,
        }
    }

    /// `--device` follows the spec, else the GPU limit; removing the field (or the GPU) puts
    /// the pods back on the CPU kernels.
    #[test]
    fn the_device_follows_the_spec_else_the_gpu_limit() {
        let device_arg = |isvc: &InferenceService| {
            let pod = deployment(isvc, &levers()).spec.and_then(|s| s.template.spec).expect("pod");
            let args = pod.containers[0].args.clone().expect("args");
            let found: Vec<_> = args.iter().filter(|a| a.starts_with("--device")).cloned().collect();
            assert_eq!(found.len(), 1, "{args:?}");
            found[0].clone()
        };
        let mut isvc = fixtures::isvc();
        assert_eq!(device_arg(&isvc), "--device=cpu");
        let limits = isvc.spec.engine.resources.limits.get_or_insert_with(Default::default);
        limits.insert("nvidia.com/gpu".into(), Quantity("1".into()));
        assert_eq!(device_arg(&isvc), "--device=cuda");
        isvc.spec.engine.device = Some("cuda:1".into());
        assert_eq!(device_arg(&isvc), "--device=cuda:1");
        isvc.spec.engine.device = None;
        isvc.spec.engine.resources.limits.as_mut().map(|l| l.remove("nvidia.com/gpu"));
        assert_eq!(device_arg(&isvc), "--device=cpu");
    }

    #[test]
    fn engine_pods_run_the_levers_with_probes_drain_and_a_locked_down_context() {
        let d = deployment(&fixtures::isvc(), &levers());
        let spec = d.spec.expect("spec");
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.expect("pod");
        let c = &pod.containers[0];
        let args = c.args.clone().expect("args");
        for want in ["--tier=q4_0", "--model=/models/smol/model.gguf", "--drain-timeout=30"] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        // The batch settings come from the settings file only.
        assert!(!args.iter().any(|a| a.starts_with("--max-batch-size") || a.starts_with("--batch-wait-ms")));
        assert!(args.iter().any(|a| a == "--served-model-name=smol"));
        let ready = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("readiness");
        assert_eq!(ready.path.as_deref(), Some("/ready"));
        let live = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("liveness");
        assert_eq!(live.path.as_deref(), Some("/health"));
        let start = c.startup_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("startup");
        // Every probe on the probe port, which the engine is told to serve.
        for get in [ready, live, start] {
            assert_eq!(get.port, IntOrString::String(PROBE_PORT_NAME.into()));
        }
        assert!(args.contains(&format!("--probe-port={PROBE_PORT}")));
        let ports = c.ports.as_ref().expect("ports");
        assert!(
            ports
                .iter()
                .any(|p| p.name.as_deref() == Some(PROBE_PORT_NAME) && p.container_port == PROBE_PORT)
        );
        assert!(ports.iter().any(|p| p.name.as_deref() == Some("http") && p.container_port == HTTP_PORT));
        let pre_stop = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).expect("preStop");
        assert_eq!(pre_stop.sleep.as_ref().map(|s| s.seconds), Some(PRE_STOP_SLEEP_SECONDS));
        assert!(
            pod.termination_grace_period_seconds.expect("grace") > DRAIN_SECONDS + PRE_STOP_SLEEP_SECONDS
        );
        assert!(args.contains(&format!("--drain-timeout={DRAIN_SECONDS}")));
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
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    }

    #[test]
    fn a_url_model_is_downloaded_and_verified_by_an_init_container() {
        let mut isvc = fixtures::isvc();
        isvc.spec.model.source = Some(ModelSource {
            url: Some(UrlSource { url: "https://example.com/m.gguf".into(), sha256: "ab".repeat(32) }),
            ..ModelSource::default()
        });
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

    #[test]
    fn the_batch_lever_leaves_the_template_alone_and_the_tier_lever_does_not() {
        let isvc = fixtures::isvc();
        let template = |l: &Levers| deployment(&isvc, l).spec.map(|s| s.template);
        let batch = Levers { max_batch_size: 31, batch_wait_ms: 17, ..levers() };
        assert_eq!(template(&levers()), template(&batch));
        let tier = Levers { tier: Tier::Native, ..levers() };
        assert_ne!(template(&levers()), template(&tier));
    }

    #[test]
    fn removed_spec_fields_leave_the_built_object() {
        let mut isvc = fixtures::isvc();
        isvc.spec.engine.node_selector = [("pool".to_string(), "a".to_string())].into();
        isvc.spec.engine.env = vec![EnvVar { name: "X".into(), value: Some("1".into()), value_from: None }];
        let with = serde_json::to_value(deployment(&isvc, &levers())).expect("json");
        let pod = &with["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["pool"], "a");
        assert_eq!(pod["containers"][0]["env"][0]["name"], "X");
        isvc.spec.engine.node_selector.clear();
        isvc.spec.engine.env.clear();
        let without = serde_json::to_value(deployment(&isvc, &levers())).expect("json");
        let pod = &without["spec"]["template"]["spec"];
        assert!(pod.get("nodeSelector").is_none() && pod["containers"][0].get("env").is_none());
        assert_ne!(crate::apply::fingerprint(&with), crate::apply::fingerprint(&without));
    }
}
