//! The quantization tiers of the engine's weights: the names `pacer-engine --tier`, engine
//! profiles and the InferenceService API (`quantization.allowedTiers`) all use: one list of
//! tiers for the engine, the planner and the CRD.
//!
//! Two runtimes name their tiers apart: `pacer-engine` derives `f32`, `q8_0`, `native` and
//! `q4_0` from one GGUF file; a vLLM deployment runs one model variant per precision class
//! (`bf16`, `fp16`, `fp8`, `int8`, `int4`), each a model and flags the spec names.

use serde::{Deserialize, Serialize};

/// A quantization tier of the engine's weights (`pacer-engine --tier`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Tier {
    /// Full precision.
    #[serde(rename = "f32")]
    F32,
    /// 8-bit blocks.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// As stored in the GGUF file.
    #[serde(rename = "native")]
    Native,
    /// 4-bit blocks: the smallest and fastest.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// vLLM: 16-bit brain-float weights and activations (a model's usual full precision).
    #[serde(rename = "bf16")]
    Bf16,
    /// vLLM: 16-bit IEEE half-precision weights and activations.
    #[serde(rename = "fp16")]
    Fp16,
    /// vLLM: 8-bit floating-point weights (and activations where the GPU has FP8 units).
    #[serde(rename = "fp8")]
    Fp8,
    /// vLLM: 8-bit integer weights (W8A8 or W8A16 checkpoints).
    #[serde(rename = "int8")]
    Int8,
    /// vLLM: 4-bit integer weights (AWQ, GPTQ or W4A16 checkpoints).
    #[serde(rename = "int4")]
    Int4,
}

impl Tier {
    /// Every tier: `pacer-engine`'s, then vLLM's, each most precise first.
    pub const ALL: [Tier; 9] = [
        Tier::F32,
        Tier::Q8_0,
        Tier::Native,
        Tier::Q4_0,
        Tier::Bf16,
        Tier::Fp16,
        Tier::Fp8,
        Tier::Int8,
        Tier::Int4,
    ];
    /// The tiers `pacer-engine --tier` loads from one GGUF file.
    pub const PACER: [Tier; 4] = [Tier::F32, Tier::Q8_0, Tier::Native, Tier::Q4_0];
    /// The precision classes of vLLM model variants.
    pub const VLLM: [Tier; 5] = [Tier::Bf16, Tier::Fp16, Tier::Fp8, Tier::Int8, Tier::Int4];

    /// The name `pacer-engine --tier` and the CRD use.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::F32 => "f32",
            Tier::Q8_0 => "q8_0",
            Tier::Native => "native",
            Tier::Q4_0 => "q4_0",
            Tier::Bf16 => "bf16",
            Tier::Fp16 => "fp16",
            Tier::Fp8 => "fp8",
            Tier::Int8 => "int8",
            Tier::Int4 => "int4",
        }
    }

    /// Bits per weight, roughly: what says whether a change of tier gains or gives up
    /// precision (`native` counts as the 5 bits of SmolLM2's Q4_1 file).
    pub fn bits(self) -> u32 {
        match self {
            Tier::F32 => 32,
            Tier::Bf16 | Tier::Fp16 => 16,
            Tier::Q8_0 | Tier::Fp8 | Tier::Int8 => 8,
            Tier::Native => 5,
            Tier::Q4_0 | Tier::Int4 => 4,
        }
    }

    /// The tier of that name, if there is one.
    pub fn named(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether `pacer-engine` loads this tier (else it is a vLLM precision class).
    pub fn is_pacer(self) -> bool {
        Tier::PACER.contains(&self)
    }

    /// The `pacer-engine` tier of that name (any case), or a message that lists them: what
    /// `pacer-engine --tier` accepts.
    pub fn parse_pacer(name: &str) -> Result<Tier, String> {
        let tier: Tier = name.parse()?;
        if tier.is_pacer() {
            Ok(tier)
        } else {
            Err(format!(
                "tier `{name}` is a vLLM precision class; pacer-engine loads {}",
                names(&Tier::PACER)
            ))
        }
    }
}

fn names(tiers: &[Tier]) -> String {
    tiers.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
}

impl std::str::FromStr for Tier {
    type Err = String;
    /// Any tier by name, in any case.
    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown tier `{s}` (expected one of {})", names(&Tier::ALL)))
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Tier;

    #[test]
    fn names_round_trip_through_serde_and_named() {
        for tier in Tier::ALL {
            let json = serde_json::to_string(&tier).expect("serialize");
            assert_eq!(json, format!("\"{}\"", tier.as_str()));
            assert_eq!(Tier::named(tier.as_str()), Some(tier));
        }
        assert_eq!(Tier::named("q5_k"), None);
    }

    #[test]
    fn names_parse_in_any_case_and_pacer_engine_takes_its_own() {
        for tier in Tier::ALL {
            assert_eq!(tier.as_str().to_uppercase().parse::<Tier>(), Ok(tier));
        }
        assert!("q4_k".parse::<Tier>().expect_err("no such tier").contains("unknown tier"));
        assert_eq!(Tier::parse_pacer("native"), Ok(Tier::Native));
        assert!(Tier::parse_pacer("bf16").expect_err("vLLM's").contains("pacer-engine loads f32"));
    }

    #[test]
    fn every_tier_belongs_to_one_runtime() {
        for tier in Tier::ALL {
            assert_ne!(Tier::PACER.contains(&tier), Tier::VLLM.contains(&tier), "{tier}");
        }
        assert_eq!(Tier::PACER.len() + Tier::VLLM.len(), Tier::ALL.len());
    }
}
