//! Which inference server the engine pods run: `pacer-engine` (the default), or vLLM for teams
//! that already serve with it. The operator renders either; the planner holds the same SLA over
//! both, with the levers each can move (vLLM reads its batch settings only at start, so a change
//! of them is a rolling update, and a tier is another model variant).

use crate::Tier;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The vLLM image `runtime: vllm` runs when `engine.image` is unset: the release whose metric
/// names and buckets Pacer's queries and tests are written against (V1 engine metrics).
pub const DEFAULT_VLLM_IMAGE: &str = "docker.io/vllm/vllm-openai:v0.18.2";

/// The `vllm serve` flags the operator sets for `runtime: vllm`; neither `engine.args` nor a
/// variant's `args` may set them.
pub const VLLM_OWNED_FLAGS: [&str; 7] =
    ["host", "port", "model", "served-model-name", "max-num-seqs", "max-num-batched-tokens", "max-model-len"];

/// The inference server of the engine pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Runtime {
    /// `pacer-engine serve`: one GGUF file, every tier derived from it at load, batch settings
    /// moved live through a mounted ConfigMap.
    #[default]
    #[serde(rename = "pacer")]
    Pacer,
    /// vLLM's OpenAI server (`vllm serve`) on a GPU: one model variant per tier, batch settings
    /// as flags, so moving them rolls the pods.
    #[serde(rename = "vllm")]
    Vllm,
}

impl Runtime {
    /// The name the spec uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Pacer => "pacer",
            Runtime::Vllm => "vllm",
        }
    }

    /// Whether the engines take new batch settings live (else only at start: a rolling update).
    pub fn live_batch(self) -> bool {
        self == Runtime::Pacer
    }

    /// The tiers this runtime can run.
    pub fn tiers(self) -> &'static [Tier] {
        match self {
            Runtime::Pacer => &Tier::PACER,
            Runtime::Vllm => &Tier::VLLM,
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tier of a vLLM deployment: the model variant that runs it and the flags it needs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    /// The tier this variant runs (`bf16`, `fp16`, `fp8`, `int8` or `int4`); its rank is its
    /// place in `quantization.allowedTiers`.
    #[schemars(schema_with = "crate::schema::vllm_tier")]
    pub tier: Tier,
    /// What `vllm serve` loads: a Hugging Face model id (`Qwen/Qwen2.5-7B-Instruct`), or a
    /// directory under `/models` when `model.source` mounts a volume there.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(r"!self.matches('\\s') && !self.startsWith('-')")
        .message("quantization.variants[].model must be a model id or path without whitespace, e.g. Qwen/Qwen2.5-7B-Instruct-AWQ"))]
    pub model: String,
    /// Extra `vllm serve` flags of this variant, e.g. `--quantization=fp8` or
    /// `--kv-cache-dtype=fp8`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::variant_args")]
    pub args: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_runtime_runs_its_own_tiers() {
        assert!(Runtime::Pacer.tiers().contains(&Tier::Native));
        assert!(!Runtime::Pacer.tiers().contains(&Tier::Fp8));
        assert!(Runtime::Vllm.tiers().contains(&Tier::Fp8));
        assert!(Runtime::Pacer.live_batch() && !Runtime::Vllm.live_batch());
        assert_eq!(serde_json::to_string(&Runtime::Vllm).expect("json"), "\"vllm\"");
    }
}
