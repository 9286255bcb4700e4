//! The engine pod of `engine.runtime: vllm`: vLLM's OpenAI server (`vllm serve`) running the
//! tier's model variant, with the batch settings as its flags (`--max-num-seqs`,
//! `--max-num-batched-tokens`), so a move of them is a new template and a rolling update.
//! The API, `/health` and `/metrics` share one port (`http`), which the probes and the
//! PodMonitor use. vLLM's image runs as root and writes its caches under `/root/.cache`, so
//! the root filesystem stays writable; the container keeps no capabilities and cannot
//! escalate.

use super::Levers;
use super::deployment::{
    ENGINE_CONTAINER, EnginePod, HTTP_PORT, MODEL_DIR, container_port, empty_dir, mount, non_empty,
    pre_stop_sleep, probe, runtime_default_seccomp, served_name, source_volume,
};
use k8s_openapi::api::core::v1::{Capabilities, Container, PodSecurityContext, SecurityContext, VolumeMount};
use pacer_crds::InferenceService;

/// The name of the port vLLM serves the API, `/health` and `/metrics` on.
pub const VLLM_PORT_NAME: &str = "http";
/// Where vLLM, Hugging Face and Triton keep downloads and compiled kernels (an emptyDir: a pod
/// downloads a Hub model once per start).
const CACHE_DIR: &str = "/root/.cache";
/// Shared memory for PyTorch's worker processes (tensor parallelism), as vLLM's own
/// Kubernetes guide mounts it.
const SHM_SIZE: &str = "2Gi";
/// Seconds the startup probe allows: a Hub download, loading the weights and capturing CUDA
/// graphs can take minutes on a large model.
const STARTUP_SECONDS: i32 = 1200;

/// The vLLM engine pod for `isvc` at `levers`: the variant of `levers.tier`.
pub(super) fn pod(isvc: &InferenceService, levers: &Levers) -> EnginePod {
    let spec = &isvc.spec;
    let engine = &spec.engine;
    // The CEL rules guarantee a variant for every allowed tier; without one (an older CRD),
    // the served name stands in, and vLLM says clearly that it cannot find such a model.
    let variant = spec.quantization.variant(levers.tier);
    let model = variant.map_or_else(|| served_name(isvc), |v| v.model.clone());
    let mut args = vec![
        format!("--model={model}"),
        format!("--served-model-name={}", served_name(isvc)),
        "--host=0.0.0.0".into(),
        format!("--port={HTTP_PORT}"),
        format!("--max-num-seqs={}", levers.max_batch_size),
        format!("--max-num-batched-tokens={}", levers.max_num_batched_tokens.max(levers.max_batch_size)),
    ];
    if let Some(context) = spec.model.context_length {
        args.push(format!("--max-model-len={context}"));
    }
    args.extend(variant.iter().flat_map(|v| v.args.iter().cloned()));
    args.extend(engine.args.iter().cloned());

    let mut volumes = vec![empty_dir("cache", None, None), empty_dir("shm", Some(SHM_SIZE), Some("Memory"))];
    let mut mounts = vec![mount("cache", CACHE_DIR, false), mount("shm", "/dev/shm", false)];
    if let Some((volume, path)) = spec.model.source.as_ref().and_then(source_volume) {
        // The source's path is the directory of the volume that appears at /models.
        volumes.push(volume);
        mounts.push(VolumeMount { sub_path: Some(path.to_string()), ..mount("model", MODEL_DIR, true) });
    }
    let container = Container {
        name: ENGINE_CONTAINER.into(),
        image: Some(engine.image().to_string()),
        image_pull_policy: engine.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(args),
        ports: Some(vec![container_port(VLLM_PORT_NAME, HTTP_PORT)]),
        env: non_empty(engine.env.clone()),
        resources: Some(engine.resources.clone()),
        startup_probe: Some(probe("/health", VLLM_PORT_NAME, 10, STARTUP_SECONDS / 10)),
        liveness_probe: Some(probe("/health", VLLM_PORT_NAME, 10, 3)),
        readiness_probe: Some(probe("/health", VLLM_PORT_NAME, 5, 2)),
        lifecycle: Some(pre_stop_sleep()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let security = PodSecurityContext {
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    };
    EnginePod { container, init_containers: Vec::new(), volumes, security }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{TIER_LABEL, deployment, fixtures};
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use pacer_crds::{DEFAULT_VLLM_IMAGE, Tier};

    fn levers() -> Levers {
        Levers {
            replicas: 2,
            max_batch_size: 64,
            batch_wait_ms: 0,
            max_num_batched_tokens: 2048,
            tier: Tier::Fp8,
        }
    }

    fn pod_of(isvc: &InferenceService, levers: &Levers) -> PodSpec {
        deployment(isvc, levers).spec.and_then(|s| s.template.spec).expect("pod")
    }

    fn args_of(isvc: &InferenceService, levers: &Levers) -> Vec<String> {
        pod_of(isvc, levers).containers[0].args.clone().expect("args")
    }

    #[test]
    fn a_vllm_pod_serves_the_tiers_variant_with_the_levers_as_flags() {
        let isvc = fixtures::vllm();
        let args = args_of(&isvc, &levers());
        for want in [
            "--model=Qwen/Qwen2.5-7B-Instruct-FP8-dynamic",
            "--served-model-name=qwen",
            "--host=0.0.0.0",
            "--port=8000",
            "--max-num-seqs=64",
            "--max-num-batched-tokens=2048",
            "--kv-cache-dtype=fp8",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        assert!(
            !args.iter().any(|a| a == "serve" || a.starts_with("--tier") || a.starts_with("--settings-file"))
        );
        let bf16 = args_of(&isvc, &Levers { tier: Tier::Bf16, ..levers() });
        assert!(bf16.iter().any(|a| a == "--model=Qwen/Qwen2.5-7B-Instruct"), "{bf16:?}");
        assert!(!bf16.iter().any(|a| a == "--kv-cache-dtype=fp8"), "a variant's flags stay with it");
        let pod = pod_of(&isvc, &levers());
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some(DEFAULT_VLLM_IMAGE));
        for probe in [&c.startup_probe, &c.liveness_probe, &c.readiness_probe] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("probe");
            assert_eq!(get.path.as_deref(), Some("/health"));
            assert_eq!(get.port, IntOrString::String(VLLM_PORT_NAME.into()));
        }
        let ports = c.ports.as_ref().expect("ports");
        assert_eq!(ports.len(), 1);
        assert_eq!((ports[0].name.as_deref(), ports[0].container_port), (Some("http"), HTTP_PORT));
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
        let limits = c.resources.as_ref().and_then(|r| r.limits.clone()).expect("limits");
        assert!(limits.contains_key("nvidia.com/gpu"));
        let volumes = pod.volumes.expect("volumes");
        assert!(!volumes.iter().any(|v| v.name == "settings"), "vLLM reads no settings file");
        let shm = volumes.iter().find(|v| v.name == "shm").and_then(|v| v.empty_dir.clone()).expect("shm");
        assert_eq!(shm.medium.as_deref(), Some("Memory"));
    }

    #[test]
    fn the_batch_lever_rolls_a_vllm_template_as_the_tier_lever_does() {
        let isvc = fixtures::vllm();
        let template = |l: &Levers| deployment(&isvc, l).spec.map(|s| s.template);
        assert_ne!(template(&levers()), template(&Levers { max_batch_size: 32, ..levers() }));
        assert_ne!(template(&levers()), template(&Levers { max_num_batched_tokens: 4096, ..levers() }));
        assert_ne!(template(&levers()), template(&Levers { tier: Tier::Bf16, ..levers() }));
        assert_eq!(template(&levers()), template(&Levers { replicas: 7, ..levers() }));
        let labels = template(&levers()).and_then(|t| t.metadata).and_then(|m| m.labels).expect("labels");
        assert_eq!(labels[TIER_LABEL], "fp8");
    }

    #[test]
    fn a_volume_source_appears_at_models_and_removed_fields_leave_the_pod() {
        let mut isvc = fixtures::vllm();
        isvc.spec.model.source = Some(pacer_crds::ModelSource {
            pvc: Some(pacer_crds::PvcSource { claim_name: "weights".into(), path: "hub".into() }),
            ..Default::default()
        });
        isvc.spec.model.context_length = Some(8192);
        isvc.spec.engine.image = Some("registry.example.com/vllm:pinned".into());
        let pod = pod_of(&isvc, &levers());
        let c = &pod.containers[0];
        let m = c
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .find(|m| m.name == "model")
            .expect("model mount");
        assert_eq!(
            (m.mount_path.as_str(), m.sub_path.as_deref(), m.read_only),
            ("/models", Some("hub"), Some(true))
        );
        let claim =
            pod.volumes.as_ref().expect("volumes").iter().find_map(|v| v.persistent_volume_claim.clone());
        assert_eq!(claim.map(|c| c.claim_name), Some("weights".to_string()));
        assert!(c.args.as_ref().expect("args").iter().any(|a| a == "--max-model-len=8192"));
        assert_eq!(c.image.as_deref(), Some("registry.example.com/vllm:pinned"));
        // Removed again: no model volume, no context flag, the default image.
        isvc.spec.model.source = None;
        isvc.spec.model.context_length = None;
        isvc.spec.engine.image = None;
        let pod = pod_of(&isvc, &levers());
        let c = &pod.containers[0];
        assert!(!c.volume_mounts.as_ref().expect("mounts").iter().any(|m| m.name == "model"));
        assert!(!pod.volumes.as_ref().expect("volumes").iter().any(|v| v.name == "model"));
        assert!(!c.args.as_ref().expect("args").iter().any(|a| a.starts_with("--max-model-len")));
        assert_eq!(c.image.as_deref(), Some(DEFAULT_VLLM_IMAGE));
    }

    #[test]
    fn engine_args_come_after_the_variants_and_the_operators() {
        let mut isvc = fixtures::vllm();
        isvc.spec.engine.args = vec!["--gpu-memory-utilization=0.85".into()];
        let args = args_of(&isvc, &levers());
        assert_eq!(args.last().map(String::as_str), Some("--gpu-memory-utilization=0.85"));
        let model = args.iter().position(|a| a.starts_with("--model=")).expect("model");
        let variant = args.iter().position(|a| a == "--kv-cache-dtype=fp8").expect("variant flag");
        assert!(model < variant);
    }
}
