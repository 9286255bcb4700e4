//! Pacer's Kubernetes API: the `InferenceService` custom resource (`serving.pacer.dev/v1alpha1`).
//!
//! - [`InferenceServiceSpec`]: what a user declares — the model and how pods get it, the engine
//!   pods, the latency SLA, and the ranges the planner may move each lever within.
//! - [`InferenceServiceStatus`]: what the operator reports — conditions, replicas, the live lever
//!   values, observed percentiles and the last decision.
//! - [`Runtime`]: the inference server the engine pods run, `pacer-engine` or vLLM, and a
//!   vLLM tier's model [`Variant`].
//! - [`conditions`]: condition types and reasons, as constants shared by operator and tests.
//! - [`check`]: what the schema cannot check of a spec, and why a spec cannot be built.
//! - [`settings`]: the engine settings document a service runs at (the engine's contract).
//! - [`admission`] (feature `admission`): a manifest checked with the CRD's own schema and CEL
//!   rules as the API server would, off any cluster (local mode's config).
//! - How a service reads as the planner's input: [`InferenceServiceSpec::planner_spec`],
//!   [`InferenceService::initial_levers`] and [`InferenceService::current_levers`]. The
//!   quantization [`Tier`] is the engine contract's type, re-exported.
//!
//! Validation lives in the schema (types, enums, bounds, patterns) and in CEL rules
//! (`x-kubernetes-validations`) for everything that relates two fields, each with a message a
//! person can act on. The YAML under `crds/` is generated from these types by
//! `pacer-operator crd` and never edited by hand.
#![forbid(unsafe_code)]

#[cfg(feature = "admission")]
pub mod admission;
pub mod check;
pub mod conditions;
mod model;
mod planner;
mod runtime;
pub mod schema;
pub mod settings;
mod spec;
mod status;

pub use model::*;
pub use pacer_engine_api::Tier;
pub use runtime::*;
pub use spec::*;
pub use status::*;

/// The API group of every Pacer resource.
pub const GROUP: &str = "serving.pacer.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every Pacer object: [`GROUP`]/[`VERSION`].
pub const API_VERSION: &str = "serving.pacer.dev/v1alpha1";
/// The label that ties engine pods, their Prometheus series and the custom resource together.
pub const INFERENCESERVICE_LABEL: &str = "serving.pacer.dev/inferenceservice";

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn the_api_version_is_the_derived_one() {
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        assert_eq!(InferenceService::api_version(&()), API_VERSION);
        assert_eq!(InferenceService::group(&()), GROUP);
    }
}
