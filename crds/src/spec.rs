//! The `InferenceService` spec: model, engine pods, SLA, and the ranges of the three levers.

use crate::{InferenceServiceStatus, ModelSpec, PullPolicy, Tier};
use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements, Toleration};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default engine image; the chart and the samples pin the same tag.
pub const DEFAULT_ENGINE_IMAGE: &str = concat!("ghcr.io/pacer-dev/pacer-engine:", env!("CARGO_PKG_VERSION"));

/// An LLM served under a latency SLA: Pacer keeps the declared percentile of time-to-first-token
/// and inter-token latency under their targets by moving replicas, batch settings and the
/// quantization tier within the ranges given here.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "serving.pacer.dev",
    version = "v1alpha1",
    kind = "InferenceService",
    plural = "inferenceservices",
    shortname = "pisvc",
    category = "pacer",
    namespaced,
    status = "InferenceServiceStatus",
    validation = Rule::new("size(self.metadata.name) <= 52 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be at most 52 lowercase letters, digits or '-', start with a letter and end with a letter or digit: it names the engine Service (a DNS-1035 label)"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Whether every desired engine replica is ready",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "string",
        description = "Ready / desired engine replicas",
        json_path = ".status.summary.replicas"
    ),
    printcolumn(
        name = "Tier",
        type_ = "string",
        description = "Quantization tier the engine pods run",
        json_path = ".status.tier"
    ),
    printcolumn(
        name = "TTFT",
        type_ = "string",
        description = "Observed time-to-first-token at the SLA percentile / target",
        json_path = ".status.summary.ttft"
    ),
    printcolumn(
        name = "ITL",
        type_ = "string",
        description = "Observed inter-token latency at the SLA percentile / target",
        json_path = ".status.summary.itl"
    ),
    printcolumn(
        name = "SLA",
        type_ = "string",
        description = "Met, Violated, or Unknown while there are no fresh metrics",
        json_path = ".status.summary.sla"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(format!(
    "!has(self.policy) || !has(self.sla) || !has(self.policy.evaluationInterval) || !has(self.sla.window) || !({ok_interval}) || !({ok_window}) || duration(self.policy.evaluationInterval) <= duration(self.sla.window)",
    ok_interval = crate::schema::duration_within("self.policy.evaluationInterval", "0s", "1h"),
    ok_window = crate::schema::duration_within("self.sla.window", "0s", "24h"),
))
.message("policy.evaluationInterval must not exceed sla.window: evaluations further apart than the window would leave traffic unobserved"))]
#[x_kube(validation = Rule::new("(has(self.engine.runtime) && self.engine.runtime == 'vllm') || self.quantization.allowedTiers.all(t, t in ['f32', 'q8_0', 'native', 'q4_0'])")
    .message("quantization.allowedTiers of pacer-engine are f32, q8_0, native or q4_0 (bf16, fp16, fp8, int8 and int4 are vLLM's: set engine.runtime vllm)"))]
#[x_kube(validation = Rule::new("!(has(self.engine.runtime) && self.engine.runtime == 'vllm') || self.quantization.allowedTiers.all(t, t in ['bf16', 'fp16', 'fp8', 'int8', 'int4'])")
    .message("with engine.runtime vllm, quantization.allowedTiers are vLLM precisions: bf16, fp16, fp8, int8 or int4"))]
#[x_kube(validation = Rule::new("!(has(self.engine.runtime) && self.engine.runtime == 'vllm') || self.quantization.allowedTiers.all(t, has(self.quantization.variants) && self.quantization.variants.exists(v, v.tier == t))")
    .message("with engine.runtime vllm, every tier in quantization.allowedTiers needs a quantization.variants entry naming the model that runs it"))]
#[x_kube(validation = Rule::new("(has(self.engine.runtime) && self.engine.runtime == 'vllm') || !has(self.quantization.variants) || size(self.quantization.variants) == 0")
    .message("quantization.variants name vLLM models: set engine.runtime vllm, or remove them (pacer-engine derives every tier from model.source's GGUF file)"))]
#[x_kube(validation = Rule::new("(has(self.engine.runtime) && self.engine.runtime == 'vllm') || has(self.model.source)")
    .message("model.source is required with engine.runtime pacer: it names the GGUF file the engine serves"))]
#[x_kube(validation = Rule::new("!(has(self.engine.runtime) && self.engine.runtime == 'vllm') || !has(self.model.source) || !has(self.model.source.url)")
    .message("model.source.url downloads one GGUF file for pacer-engine; vLLM loads quantization.variants[].model by id, or from a directory that a pvc or image source mounts at /models"))]
#[x_kube(validation = Rule::new("!(has(self.engine.runtime) && self.engine.runtime == 'vllm') || !has(self.batching) || !has(self.batching.maxStepMs)")
    .message("batching.maxStepMs is pacer-engine's ITL budget and vLLM has none: remove it with engine.runtime vllm"))]
#[x_kube(validation = Rule::new("!(has(self.engine.runtime) && self.engine.runtime == 'vllm') || !has(self.batching) || !has(self.batching.prefillHoldMs)")
    .message("batching.prefillHoldMs is pacer-engine's prompt hold and vLLM has none: remove it with engine.runtime vllm"))]
#[x_kube(validation = Rule::new("!has(self.batching) || !has(self.batching.prefillHoldMs) || self.batching.prefillHoldMs < self.sla.ttftMs")
    .message("batching.prefillHoldMs must be below sla.ttftMs: a held prompt may wait the whole hold before its first token"))]
pub struct InferenceServiceSpec {
    /// The model to serve and where engine pods get it.
    pub model: ModelSpec,
    /// The engine pods: image, resources, scheduling and extra settings.
    #[serde(default)]
    pub engine: EngineSpec,
    /// The latency promise Pacer holds.
    pub sla: SlaSpec,
    /// How many engine replicas the planner may run.
    #[serde(default)]
    pub replicas: ReplicaRange,
    /// The batch settings the planner may move, live, without restarting pods.
    #[serde(default)]
    pub batching: BatchingSpec,
    /// The quantization tiers the planner may switch between (a rolling update).
    #[serde(default)]
    pub quantization: QuantizationSpec,
    /// Whether Pacer acts or only recommends, and how often it evaluates.
    #[serde(default)]
    pub policy: PolicySpec,
}

/// The engine pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.device) || !self.device.startsWith('cuda') || (has(self.resources.limits) && 'nvidia.com/gpu' in self.resources.limits)"
).message("engine.device cuda needs a GPU: set resources.limits[\"nvidia.com/gpu\"]"))]
#[x_kube(validation = Rule::new(
    "!has(self.runtime) || self.runtime != 'vllm' || (has(self.resources.limits) && 'nvidia.com/gpu' in self.resources.limits)"
).message("engine.runtime vllm runs vLLM's CUDA image: set engine.resources.limits[\"nvidia.com/gpu\"]"))]
#[x_kube(validation = Rule::new(
    "!has(self.runtime) || self.runtime != 'vllm' || (!has(self.device) && !has(self.threads))"
).message("engine.device and engine.threads are pacer-engine settings: with engine.runtime vllm, pass vLLM's own flags in engine.args"))]
pub struct EngineSpec {
    /// The inference server: `pacer` (`pacer-engine`, the default) or `vllm` (vLLM's OpenAI
    /// server on a GPU, one model variant per tier in `quantization.variants`).
    #[serde(default)]
    pub runtime: crate::Runtime,
    /// The engine image. Default: the `pacer-engine` release of this operator, or a pinned
    /// `vllm/vllm-openai` release with `runtime: vllm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(r"!self.matches('\\s')")
        .message("engine.image must be an image reference without whitespace, e.g. ghcr.io/pacer-dev/pacer-engine:0.1.0"))]
    pub image: Option<String>,
    /// When to pull the engine image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_enum::<PullPolicy>")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets for pulling the engine (and model) images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// CPU, memory and accelerator (`nvidia.com/gpu`) requests and limits of the engine container.
    #[serde(default = "default_resources")]
    #[schemars(schema_with = "crate::schema::resources")]
    pub resources: ResourceRequirements,
    /// Compute threads. Default: the CPUs the container may use (its CPU limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<u32>,
    /// Where the forward step runs (`pacer-engine --device`): `cpu` (the CPU kernels), `cuda`
    /// or `cuda:N` (the candle backend on a GPU; needs the CUDA image and a GPU limit),
    /// `candle-cpu`, or `auto`. Default: `cuda` when `resources.limits` has `nvidia.com/gpu`,
    /// else `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^(auto|cpu|candle-cpu|cuda(:[0-9]{1,2})?)$')")
        .message("engine.device must be cpu, cuda, cuda:N, candle-cpu or auto"))]
    pub device: Option<String>,
    /// Extra `pacer-engine serve` arguments, appended after the ones Pacer sets. They may not
    /// set a flag Pacer owns (`--port`, `--model`, `--tier`, `--settings-file`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::engine_args")]
    pub args: Vec<String>,
    /// Extra environment variables of the engine container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::env_vars")]
    pub env: Vec<EnvVar>,
    /// Nodes the engine pods may run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::node_selector")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the engine pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::tolerations")]
    pub tolerations: Vec<Toleration>,
}

impl EngineSpec {
    /// The image the engine pods run: `image`, else the runtime's default.
    pub fn image(&self) -> &str {
        match (&self.image, self.runtime) {
            (Some(image), _) => image,
            (None, crate::Runtime::Pacer) => DEFAULT_ENGINE_IMAGE,
            (None, crate::Runtime::Vllm) => crate::DEFAULT_VLLM_IMAGE,
        }
    }
}

fn default_resources() -> ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".to_string(), q("2")), ("memory".to_string(), q("1Gi"))])),
        limits: Some(BTreeMap::from([("memory".to_string(), q("2Gi"))])),
        ..ResourceRequirements::default()
    }
}

impl Default for EngineSpec {
    fn default() -> Self {
        EngineSpec {
            runtime: crate::Runtime::Pacer,
            image: None,
            image_pull_policy: None,
            image_pull_secrets: Vec::new(),
            resources: default_resources(),
            threads: None,
            device: None,
            args: Vec::new(),
            env: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        }
    }
}

/// The latency SLA: at the given percentile over the window, TTFT and ITL (and optionally E2E)
/// stay at or under their targets.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.e2eMs) || self.e2eMs >= self.ttftMs")
    .message("sla.e2eMs must be at least sla.ttftMs: a request cannot finish before its first token"))]
pub struct SlaSpec {
    /// The percentile the targets apply to, e.g. 95 for P95 or 99.9 for P99.9.
    #[serde(default = "default_percentile")]
    #[x_kube(validation = Rule::new("self >= 50.0 && self < 100.0")
        .message("sla.percentile must be at least 50 and below 100, e.g. 95 or 99.9"))]
    pub percentile: f64,
    /// Target time to first token, in milliseconds.
    #[schemars(range(min = 1, max = 3600000))]
    pub ttft_ms: u32,
    /// Target inter-token latency, in milliseconds.
    #[schemars(range(min = 1, max = 600000))]
    pub itl_ms: u32,
    /// Optional target for the whole request, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400000))]
    pub e2e_ms: Option<u32>,
    /// The window percentiles are computed over, as a duration (`5m`, `90s`).
    #[serde(default = "default_window")]
    #[schemars(length(max = 16), pattern(r"^([0-9]+(s|m|h))+$"))]
    #[x_kube(validation = Rule::new(crate::schema::duration_within("self", "30s", "24h"))
        .message("sla.window must be between 30s and 24h"))]
    pub window: String,
}

fn default_percentile() -> f64 {
    95.0
}

fn default_window() -> String {
    "5m".to_string()
}

/// The range of engine replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("replicas.min must not exceed replicas.max"))]
pub struct ReplicaRange {
    /// Fewest replicas, also the number a new InferenceService starts with.
    #[schemars(range(min = 1, max = 1000))]
    pub min: i32,
    /// Most replicas.
    #[schemars(range(min = 1, max = 1000))]
    pub max: i32,
}

impl Default for ReplicaRange {
    fn default() -> Self {
        ReplicaRange { min: 1, max: 4 }
    }
}

/// The live batch settings the planner may move. The engine refuses a batch larger than its
/// token budget (each running sequence decodes one token per step), so the ranges must allow
/// a budget at least the batch: a spec the engine would refuse is refused here instead.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxBatchSize.max <= self.maxNumBatchedTokens.max")
    .message("batching.maxBatchSize.max must not exceed batching.maxNumBatchedTokens.max: every sequence of a batch decodes a token in each step"))]
#[x_kube(validation = Rule::new("self.maxBatchSize.initial <= self.maxNumBatchedTokens.initial")
    .message("batching.maxBatchSize.initial must not exceed batching.maxNumBatchedTokens.initial: the engine refuses a batch larger than its token budget"))]
pub struct BatchingSpec {
    /// Most sequences in an engine's running batch: larger raises throughput and ITL.
    #[serde(default = "default_max_batch_size")]
    pub max_batch_size: MaxBatchSizeRange,
    /// How long an idle engine waits to fill a batch, in ms: larger raises TTFT, helps batching.
    #[serde(default = "default_batch_wait_ms")]
    pub batch_wait_ms: BatchWaitRange,
    /// Most prompt and decode tokens one engine step carries (`--max-num-batched-tokens`): a
    /// smaller budget cuts long prompts into smaller chunks, so the steps that carry them (and
    /// the inter-token gaps of every running stream) stay short, at some cost in TTFT. The
    /// planner keeps it at least the batch size, so every running sequence decodes each step.
    #[serde(default = "default_max_num_batched_tokens")]
    pub max_num_batched_tokens: TokenBudgetRange,
    /// The engines' ITL budget in ms (`--max-step-ms`): while streams decode, an engine cuts
    /// prompt chunks so each step is predicted to last at most this long, which bounds every
    /// running stream's inter-token gap at some cost in TTFT and capacity; the planner predicts
    /// with it. Unset (the default), the engines run without a time bound and the planner holds
    /// the ITL target with the token budget, which the simulator finds cheaper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub max_step_ms: Option<u32>,
    /// The engines' prompt hold in ms (`--prefill-hold-ms`): while streams decode, a new prompt
    /// waits up to this long so prompts start together, in few long steps, instead of one long
    /// step each; prompt work then runs whole while long gaps stay rare. It trades TTFT (up to
    /// the hold) for fewer long inter-token gaps, which is what wins on mixed prompt lengths
    /// (docs/benchmarks.md). Fixed: the planner does not move it and does not yet predict with
    /// it, so leave room for it in `sla.ttftMs`. Unset (the default), there is no hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub prefill_hold_ms: Option<u32>,
}

impl Default for BatchingSpec {
    fn default() -> Self {
        BatchingSpec {
            max_batch_size: default_max_batch_size(),
            batch_wait_ms: default_batch_wait_ms(),
            max_num_batched_tokens: default_max_num_batched_tokens(),
            max_step_ms: None,
            prefill_hold_ms: None,
        }
    }
}

fn default_max_num_batched_tokens() -> TokenBudgetRange {
    TokenBudgetRange { min: 64, max: 512, initial: 512 }
}

fn default_max_batch_size() -> MaxBatchSizeRange {
    MaxBatchSizeRange { min: 1, max: 32, initial: 8 }
}

fn default_batch_wait_ms() -> BatchWaitRange {
    BatchWaitRange { min: 0, max: 20, initial: 0 }
}

/// The range of `maxBatchSize`, and the value a new InferenceService starts with.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max")
    .message("batching.maxBatchSize.min must not exceed batching.maxBatchSize.max"))]
#[x_kube(validation = Rule::new("self.min <= self.initial && self.initial <= self.max")
    .message("batching.maxBatchSize.initial must lie within [min, max]"))]
pub struct MaxBatchSizeRange {
    /// Smallest value the planner may set.
    #[schemars(range(min = 1, max = 1024))]
    pub min: u32,
    /// Largest value the planner may set.
    #[schemars(range(min = 1, max = 1024))]
    pub max: u32,
    /// The value new engine pods start with.
    #[schemars(range(min = 1, max = 1024))]
    pub initial: u32,
}

/// The range of `batchWaitMs`, and the value a new InferenceService starts with.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max")
    .message("batching.batchWaitMs.min must not exceed batching.batchWaitMs.max"))]
#[x_kube(validation = Rule::new("self.min <= self.initial && self.initial <= self.max")
    .message("batching.batchWaitMs.initial must lie within [min, max]"))]
pub struct BatchWaitRange {
    /// Smallest value the planner may set.
    #[schemars(range(max = 10000))]
    pub min: u32,
    /// Largest value the planner may set.
    #[schemars(range(max = 10000))]
    pub max: u32,
    /// The value new engine pods start with.
    #[schemars(range(max = 10000))]
    pub initial: u32,
}

/// The range of `maxNumBatchedTokens`, and the value a new InferenceService starts with.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max")
    .message("batching.maxNumBatchedTokens.min must not exceed batching.maxNumBatchedTokens.max"))]
#[x_kube(validation = Rule::new("self.min <= self.initial && self.initial <= self.max")
    .message("batching.maxNumBatchedTokens.initial must lie within [min, max]"))]
pub struct TokenBudgetRange {
    /// Smallest value the planner may set.
    #[schemars(range(min = 16, max = 65536))]
    pub min: u32,
    /// Largest value the planner may set.
    #[schemars(range(min = 16, max = 65536))]
    pub max: u32,
    /// The value new engine pods start with.
    #[schemars(range(min = 16, max = 65536))]
    pub initial: u32,
}

/// Which quantization tiers the planner may use.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.preferredTier) || self.preferredTier in self.allowedTiers")
    .message("quantization.preferredTier must be one of quantization.allowedTiers"))]
#[x_kube(validation = Rule::new("!self.allowDegrade || size(self.allowedTiers) >= 2")
    .message("quantization.allowDegrade needs at least two allowedTiers to degrade to"))]
pub struct QuantizationSpec {
    /// The tiers the planner may run, ordered from most precise to fastest.
    #[serde(default = "default_allowed_tiers")]
    #[schemars(length(min = 1, max = 4))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_tiers: Vec<Tier>,
    /// The tier to run while the SLA holds. Default: the first allowed tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_enum::<Tier>")]
    pub preferred_tier: Option<Tier>,
    /// Whether the planner may move to a faster, less precise tier when replicas are at their
    /// maximum and the SLA is still violated.
    #[serde(default)]
    pub allow_degrade: bool,
    /// With `engine.runtime: vllm`, the model variant of each tier: the model `vllm serve`
    /// loads and the flags it needs (one entry per tier). Moving to another tier rolls the pods
    /// onto its variant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["tier".into()]))]
    pub variants: Vec<crate::Variant>,
}

fn default_allowed_tiers() -> Vec<Tier> {
    vec![Tier::Native]
}

impl Default for QuantizationSpec {
    fn default() -> Self {
        QuantizationSpec {
            allowed_tiers: default_allowed_tiers(),
            preferred_tier: None,
            allow_degrade: false,
            variants: Vec::new(),
        }
    }
}

impl QuantizationSpec {
    /// The vLLM variant of `tier`, if the spec names one.
    pub fn variant(&self, tier: Tier) -> Option<&crate::Variant> {
        self.variants.iter().find(|v| v.tier == tier)
    }

    /// The tier to run while the SLA holds: `preferredTier`, else the first allowed tier.
    pub fn preferred(&self) -> Tier {
        self.preferred_tier.or_else(|| self.allowed_tiers.first().copied()).unwrap_or(Tier::Native)
    }
}

/// Whether Pacer acts on its decisions.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyMode {
    /// Apply decisions to the engine pods.
    #[default]
    Enforce,
    /// Only report recommendations in status and Events.
    Advisory,
}

/// How Pacer evaluates and acts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// `Enforce` applies decisions; `Advisory` only recommends.
    #[serde(default)]
    pub mode: PolicyMode,
    /// How often the planner evaluates the SLA (also the reconcile requeue interval).
    #[serde(default = "default_evaluation_interval")]
    #[schemars(length(max = 16), pattern(r"^([0-9]+(s|m|h))+$"))]
    #[x_kube(validation = Rule::new(crate::schema::duration_within("self", "5s", "1h"))
        .message("policy.evaluationInterval must be between 5s and 1h"))]
    pub evaluation_interval: String,
    /// How long a violation must last before capacity is added (at most 1h, as HPA's
    /// stabilization window).
    #[serde(default = "default_scale_up_stabilization")]
    #[schemars(length(max = 16), pattern(r"^([0-9]+(s|m|h))+$"))]
    #[x_kube(validation = Rule::new(crate::schema::duration_within("self", "0s", "1h"))
        .message("policy.scaleUpStabilization must be between 0s and 1h"))]
    pub scale_up_stabilization: String,
    /// How long headroom must last before capacity or precision is given back (at most 1h, as
    /// HPA's stabilization window).
    #[serde(default = "default_scale_down_stabilization")]
    #[schemars(length(max = 16), pattern(r"^([0-9]+(s|m|h))+$"))]
    #[x_kube(validation = Rule::new(crate::schema::duration_within("self", "0s", "1h"))
        .message("policy.scaleDownStabilization must be between 0s and 1h"))]
    pub scale_down_stabilization: String,
}

fn default_evaluation_interval() -> String {
    "30s".to_string()
}

fn default_scale_up_stabilization() -> String {
    "60s".to_string()
}

fn default_scale_down_stabilization() -> String {
    "5m".to_string()
}

impl Default for PolicySpec {
    fn default() -> Self {
        PolicySpec {
            mode: PolicyMode::Enforce,
            evaluation_interval: default_evaluation_interval(),
            scale_up_stabilization: default_scale_up_stabilization(),
            scale_down_stabilization: default_scale_down_stabilization(),
        }
    }
}

/// Parses the durations the schema admits (`30s`, `5m`, `1h30m`): digits followed by `s`, `m`
/// or `h`, repeated. Returns `None` for anything else.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        total = total.checked_add(n.checked_mul(match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return None,
        })?)?;
    }
    (digits.is_empty() && !text.is_empty()).then(|| std::time::Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_the_schema_admits() {
        assert_eq!(parse_duration("30s"), Some(std::time::Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Some(std::time::Duration::from_secs(5400)));
        assert_eq!(parse_duration("5m"), Some(std::time::Duration::from_secs(300)));
        for bad in ["", "5", "m", "5x", "1.5s", "-1s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn preferred_tier_falls_back_to_the_first_allowed() {
        let mut q = QuantizationSpec { allowed_tiers: vec![Tier::Q8_0, Tier::Q4_0], ..Default::default() };
        assert_eq!(q.preferred(), Tier::Q8_0);
        q.preferred_tier = Some(Tier::Q4_0);
        assert_eq!(q.preferred(), Tier::Q4_0);
    }
}
