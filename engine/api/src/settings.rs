//! The live-settings document: the batch settings the operator writes into each service's
//! settings ConfigMap (and local mode into each replica's file), and the engine parses, checks and
//! applies without a restart. One typed struct for both sides, so writer and reader cannot drift.

use crate::defaults;
use serde::{Deserialize, Serialize};

/// The batching knobs the operator moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSettings {
    /// Most sequences in the running batch.
    pub max_batch_size: usize,
    /// How long an idle engine waits for more requests to fill a batch; 0 = never.
    pub batch_wait_ms: u64,
    /// Most tokens one step processes (decodes plus prompt chunks).
    pub max_num_batched_tokens: usize,
    /// The ITL budget: while streams decode, prompt chunks are cut so a step is predicted to
    /// take at most this long (measured by the engine's own fit of its step times); 0 = no
    /// time bound. Prompts alone still run at the full token budget.
    #[serde(default)]
    pub max_step_ms: u64,
    /// How long a new prompt may wait, from its arrival, for others to start in the same step
    /// while streams decode and long gaps are no longer rare (see `scheduler::tail`); 0 = it
    /// starts at once.
    #[serde(default)]
    pub prefill_hold_ms: u64,
}

impl Default for BatchSettings {
    fn default() -> Self {
        BatchSettings {
            max_batch_size: 16,
            batch_wait_ms: 0,
            max_num_batched_tokens: defaults::STEP_TOKEN_BUDGET as usize,
            max_step_ms: defaults::DEFAULT_MAX_STEP_MS,
            prefill_hold_ms: 0,
        }
    }
}

impl BatchSettings {
    /// Checks ranges; the message says what is wrong and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1024).contains(&self.max_batch_size) {
            return Err(format!("max_batch_size must be 1..=1024, got {}", self.max_batch_size));
        }
        if self.batch_wait_ms > 10_000 {
            return Err(format!("batch_wait_ms must be at most 10000, got {}", self.batch_wait_ms));
        }
        if self.max_step_ms > 60_000 {
            return Err(format!(
                "max_step_ms must be at most 60000 (0 = no time bound), got {}",
                self.max_step_ms
            ));
        }
        if self.prefill_hold_ms > 10_000 {
            return Err(format!(
                "prefill_hold_ms must be at most 10000 (0 = no hold), got {}",
                self.prefill_hold_ms
            ));
        }
        if self.max_num_batched_tokens < self.max_batch_size {
            return Err(format!(
                "max_num_batched_tokens ({}) must be at least max_batch_size ({}) so every running sequence can decode each step",
                self.max_num_batched_tokens, self.max_batch_size
            ));
        }
        Ok(())
    }

    /// Parses settings from JSON text, applying them over `base` (fields may be omitted).
    pub fn parse_over(base: BatchSettings, text: &str) -> Result<BatchSettings, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Partial {
            max_batch_size: Option<usize>,
            batch_wait_ms: Option<u64>,
            max_num_batched_tokens: Option<usize>,
            max_step_ms: Option<u64>,
            prefill_hold_ms: Option<u64>,
        }
        let p: Partial = serde_json::from_str(text).map_err(|e| format!("not valid settings JSON: {e}"))?;
        let s = BatchSettings {
            max_batch_size: p.max_batch_size.unwrap_or(base.max_batch_size),
            batch_wait_ms: p.batch_wait_ms.unwrap_or(base.batch_wait_ms),
            max_num_batched_tokens: p.max_num_batched_tokens.unwrap_or(base.max_num_batched_tokens),
            max_step_ms: p.max_step_ms.unwrap_or(base.max_step_ms),
            prefill_hold_ms: p.prefill_hold_ms.unwrap_or(base.prefill_hold_ms),
        };
        s.validate()?;
        Ok(s)
    }
}

impl BatchSettings {
    /// The document as the engine reads it (`pacer-engine serve --settings-file`), its keys in
    /// alphabetical order: the same settings always give the same bytes, so an unchanged
    /// ConfigMap is never rewritten.
    pub fn to_document(&self) -> String {
        serde_json::to_value(self)
            .map_or_else(|e| unreachable!("plain numbers serialize: {e}"), |v| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_files_apply_over_the_current_settings() {
        let base = BatchSettings::default();
        let s = BatchSettings::parse_over(base, r#"{"max_batch_size": 4}"#).unwrap();
        assert_eq!(s, BatchSettings { max_batch_size: 4, ..base });
    }

    #[test]
    fn invalid_settings_say_why() {
        let base = BatchSettings::default();
        assert!(
            BatchSettings::parse_over(base, r#"{"max_batch_size": 0}"#)
                .unwrap_err()
                .contains("max_batch_size")
        );
        assert!(
            BatchSettings::parse_over(base, r#"{"batch_size": 4}"#).unwrap_err().contains("unknown field")
        );
        assert!(BatchSettings::parse_over(base, "max_batch_size=4").unwrap_err().contains("JSON"));
        let err = BatchSettings::parse_over(base, r#"{"max_batch_size": 64, "max_num_batched_tokens": 32}"#);
        assert!(err.unwrap_err().contains("at least max_batch_size"));
        let err = BatchSettings::parse_over(base, r#"{"max_step_ms": 600000}"#);
        assert!(err.unwrap_err().contains("max_step_ms"));
        let s = BatchSettings::parse_over(base, r#"{"max_step_ms": 0}"#).unwrap();
        assert_eq!(s.max_step_ms, 0);
        let err = BatchSettings::parse_over(base, r#"{"prefill_hold_ms": 20000}"#);
        assert!(err.unwrap_err().contains("prefill_hold_ms"));
        let s = BatchSettings::parse_over(base, r#"{"prefill_hold_ms": 300}"#).unwrap();
        assert_eq!(s.prefill_hold_ms, 300);
    }

    #[test]
    fn the_document_has_sorted_keys_and_reads_back() {
        let s = BatchSettings { max_batch_size: 8, batch_wait_ms: 2, ..BatchSettings::default() };
        let doc = s.to_document();
        assert!(
            doc.starts_with(r#"{"batch_wait_ms":2,"max_batch_size":8,"max_num_batched_tokens":"#),
            "{doc}"
        );
        assert_eq!(BatchSettings::parse_over(BatchSettings::default(), &doc), Ok(s));
    }
}
