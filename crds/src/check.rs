//! What the schema cannot check of a spec (or what an older, less strict CRD let through), and
//! why a spec cannot be built: checked by the controller before it builds the children, and by
//! local mode after the admission checks.

use crate::{InferenceService, parse_duration};
use kube::ResourceExt;

/// Longest `InferenceService` name: it names a Service (a DNS-1035 label, ≤ 63) and suffixed
/// children such as `<name>-settings`.
pub const MAX_NAME_LEN: usize = 52;

/// Why a spec that passed the schema cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The name is too long or not a DNS-1035 label.
    #[error(
        "metadata.name {0:?} must be a DNS-1035 label of at most {MAX_NAME_LEN} characters (lowercase letters, digits and '-', starting with a letter): it names the engine Service"
    )]
    Name(String),
    /// A duration the schema's pattern should have caught.
    #[error("{field} {value:?} is not a duration such as 30s, 5m or 1h")]
    Duration {
        /// The field's path.
        field: &'static str,
        /// What the spec holds.
        value: String,
    },
    /// The API server refused a child built from the spec: something the CRD's rules let
    /// through (or an older CRD did) that the child's own validation refuses.
    #[error("the API server rejected {kind} {name}: {message}")]
    ChildRejected {
        /// The child's kind.
        kind: String,
        /// The child's name.
        name: String,
        /// The API server's message.
        message: String,
    },
}

impl SpecError {
    /// The condition reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            SpecError::Name(_) | SpecError::Duration { .. } => crate::conditions::reasons::INVALID_SPEC,
            SpecError::ChildRejected { .. } => crate::conditions::reasons::CHILD_REJECTED,
        }
    }
}

/// Checks what the schema cannot (or what an older, less strict CRD let through).
pub fn validate(isvc: &InferenceService) -> Result<(), SpecError> {
    let name = isvc.name_any();
    let dns1035 = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !dns1035 {
        return Err(SpecError::Name(name));
    }
    let p = &isvc.spec.policy;
    for (field, value) in [
        ("sla.window", &isvc.spec.sla.window),
        ("policy.evaluationInterval", &p.evaluation_interval),
        ("policy.scaleUpStabilization", &p.scale_up_stabilization),
        ("policy.scaleDownStabilization", &p.scale_down_stabilization),
    ] {
        if parse_duration(value).is_none() {
            return Err(SpecError::Duration { field, value: value.clone() });
        }
    }
    Ok(())
}
