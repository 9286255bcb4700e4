//! Pacer's Kubernetes API: the `InferenceService` custom resource (`serving.pacer.dev/v1alpha1`).
//!
//! - [`InferenceServiceSpec`]: what a user declares — the model and how pods get it, the engine
//!   pods, the latency SLA, and the ranges the planner may move each lever within.
//! - [`InferenceServiceStatus`]: what the operator reports — conditions, replicas, the live lever
//!   values, observed percentiles and the last decision.
//! - [`Runtime`]: the inference server the engine pods run, `pacer-engine` or vLLM, and a
//!   vLLM tier's model [`Variant`].
//! - [`conditions`]: condition types and reasons, as constants shared by operator and tests.
//! - How a service reads as the planner's input: [`InferenceServiceSpec::planner_spec`],
//!   [`InferenceService::initial_levers`] and [`InferenceService::current_levers`]. The
//!   quantization [`Tier`] is the planner's type, re-exported.
//!
//! Validation lives in the schema (types, enums, bounds, patterns) and in CEL rules
//! (`x-kubernetes-validations`) for everything that relates two fields, each with a message a
//! person can act on. The YAML under `crds/` is generated from these types by
//! `pacer-operator crd` and never edited by hand.
#![forbid(unsafe_code)]

pub mod conditions;
mod planner;
mod runtime;
pub mod schema;
mod spec;
mod status;

pub use pacer_planner::Tier;
pub use runtime::*;
pub use spec::*;
pub use status::*;

/// The API group of every Pacer resource.
pub const GROUP: &str = "serving.pacer.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The label that ties engine pods, their Prometheus series and the custom resource together.
pub const INFERENCESERVICE_LABEL: &str = "serving.pacer.dev/inferenceservice";
