//! An engine profile: how long one scheduler step takes on one machine at one tier, as measured
//! by `pacer-engine profile`, plus the tier's quality against the most precise tier. The planner's
//! capacity model is seeded from it and the simulator runs on it.
//!
//! The step time is a linear model fitted to measured steps:
//! `t = base + per_decode_row·rows + per_prefill_token·prefill + per_context_token·context`,
//! where `context` is the sum over decode rows of the tokens each attends to.

use crate::Tier;
use serde::{Deserialize, Serialize};

/// The profile format version this code reads.
pub const PROFILE_SCHEMA: u32 = 1;

/// One tier of one model on one machine, as `pacer-engine profile` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineProfile {
    /// Format version ([`PROFILE_SCHEMA`]).
    pub schema: u32,
    /// The GGUF file's name.
    pub model: String,
    /// The tier (`pacer-engine --tier`).
    pub tier: Tier,
    /// Compute threads the engine ran with.
    pub threads: u32,
    /// The CPU (or GPU) the figures were measured on.
    pub device: String,
    /// Seconds from process start to a loaded model.
    pub load_seconds: f64,
    /// Seconds of the first (warm-up) forward.
    pub warmup_seconds: f64,
    /// The fitted step-time model.
    pub step: StepModel,
    /// The measured steps the model was fitted to.
    #[serde(default)]
    pub samples: Vec<StepSample>,
    /// Agreement with the most precise tier on a fixed text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<Quality>,
}

/// Seconds per scheduler step as a linear function of its work.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepModel {
    /// Fixed cost of a step.
    pub base_s: f64,
    /// Cost of each decode row.
    pub per_decode_row_s: f64,
    /// Cost of each prompt token processed in the step.
    pub per_prefill_token_s: f64,
    /// Cost of each context token a decode row attends to.
    pub per_context_token_s: f64,
}

impl StepModel {
    /// Predicted seconds of a step with `rows` decode rows attending to `context` tokens in
    /// total, plus `prefill` prompt tokens.
    pub fn step_seconds(&self, rows: f64, prefill: f64, context: f64) -> f64 {
        self.base_s
            + self.per_decode_row_s * rows
            + self.per_prefill_token_s * prefill
            + self.per_context_token_s * context
    }

    /// Predicted seconds of a step like `sample`.
    pub fn predict(&self, sample: &StepSample) -> f64 {
        self.step_seconds(
            f64::from(sample.decode_rows),
            f64::from(sample.prefill_tokens),
            f64::from(sample.context_tokens),
        )
    }
}

/// One measured step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepSample {
    /// Decode rows in the step.
    pub decode_rows: u32,
    /// Prompt tokens in the step.
    pub prefill_tokens: u32,
    /// Context tokens the decode rows attend to (each row's cached tokens plus itself), summed.
    pub context_tokens: u32,
    /// Median seconds of the step.
    pub seconds: f64,
}

/// A tier's quality against the most precise tier, teacher-forced on a fixed text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// The tier compared against.
    pub reference_tier: Tier,
    /// Tokens compared.
    pub tokens: u32,
    /// Share of positions where both tiers' most likely next token agree.
    pub top1_agreement: f64,
    /// Mean KL divergence of this tier's next-token distribution from the reference's, in nats.
    pub mean_kl: f64,
}

/// Why a profile could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Reading the file failed.
    #[error("reading profile {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a profile.
    #[error("profile {path} is not valid: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl EngineProfile {
    /// Parses and checks the text of a profile file; `path` names it in errors. (Reading the
    /// file is the caller's: this crate does no IO.)
    pub fn parse(text: &str, path: &str) -> Result<EngineProfile, ProfileError> {
        let profile: EngineProfile = serde_json::from_str(text)
            .map_err(|e| ProfileError::Invalid { path: path.to_owned(), message: e.to_string() })?;
        profile.check().map_err(|message| ProfileError::Invalid { path: path.to_owned(), message })?;
        Ok(profile)
    }

    /// Checks the schema version and that the step model is physical.
    pub fn check(&self) -> Result<(), String> {
        if self.schema != PROFILE_SCHEMA {
            return Err(format!("schema {} is not the supported {PROFILE_SCHEMA}", self.schema));
        }
        let s = &self.step;
        let coefficients = [s.base_s, s.per_decode_row_s, s.per_prefill_token_s, s.per_context_token_s];
        if coefficients.iter().any(|c| !c.is_finite() || *c < 0.0) || s.base_s + s.per_decode_row_s <= 0.0 {
            return Err(format!("step model {s:?} must have finite, non-negative coefficients"));
        }
        Ok(())
    }
}
