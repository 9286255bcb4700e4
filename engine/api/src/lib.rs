//! The engine's contract: what `pacer-engine` publishes and the control plane (the planner, the
//! CRD, the operator, local mode, the simulator) reads. Data and pure maths only (serde, and
//! schemars behind the `schema` feature), so the data plane depends on nothing of the control
//! plane and the control plane links no engine.
//!
//! - [`tier`]: the quantization tiers of both runtimes.
//! - [`profile`]: the engine profile schema (`pacer-engine profile` writes it, the planner and
//!   the simulator read it).
//! - [`settings`]: the live-settings document the operator writes and the engine applies.
//! - [`metrics`]: every metric name Pacer exports or records, in one list.
//! - [`buckets`]: the bucket bounds of the engine's histograms (and vLLM's).
//! - [`defaults`]: the engine scheduler's defaults and limits the capacity model assumes.
//! - [`lsq`]: the non-negative least squares the step-model fits share.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod buckets;
pub mod defaults;
pub mod lsq;
pub mod metrics;
pub mod profile;
pub mod settings;
pub mod tier;

pub use profile::{EngineProfile, Quality, StepModel, StepSample};
pub use settings::BatchSettings;
pub use tier::Tier;
