//! The quantization tiers of the engine's weights: the names `pacer-engine --tier`, engine
//! profiles and the InferenceService API (`quantization.allowedTiers`) all use. The API crate
//! re-exports this type, so there is one list of tiers.

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
}

impl Tier {
    /// Every tier, most precise first.
    pub const ALL: [Tier; 4] = [Tier::F32, Tier::Q8_0, Tier::Native, Tier::Q4_0];

    /// The name `pacer-engine --tier` and the CRD use.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::F32 => "f32",
            Tier::Q8_0 => "q8_0",
            Tier::Native => "native",
            Tier::Q4_0 => "q4_0",
        }
    }

    /// The tier of that name, if there is one.
    pub fn named(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == name)
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
}
