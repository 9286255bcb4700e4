//! `pacer-bench`: a client-side SLA benchmark for any OpenAI-compatible server, with the same
//! latency vocabulary the engine and the operator use server-side.
//!
//! - [`metrics`]: TTFT, TPOT, ITL, E2E, goodput and percentiles from request timelines (pure).
//! - [`load`]: arrival shapes (closed loop, Poisson / gamma / constant open loop) and
//!   synthetic prompts.
//! - [`dataset`]: requests from a JSON-lines file, and trace replay.
//! - [`client`]: one streaming request, timed per SSE event.
//! - [`run`]: a whole run; [`report`]: its JSON report and terminal tables.
//! - [`plots`]: SVG histograms, scatters and the sweep's latency-throughput curve.
//! - [`stats`]: bootstrap intervals for tail percentiles and A/B comparison.
//! - [`tokens`]: local token counting (tokenizer.json or GGUF) for servers without usage.
//! - [`search`]: the highest rate that holds an SLA (pure bracketing and bisection).
#![forbid(unsafe_code)]
// Output goes through `tracing` or a returned value; a print in a library is a leftover.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod client;
pub mod dataset;
pub mod jsonl;
pub mod load;
pub mod metrics;
pub mod plots;
pub mod report;
pub mod run;
pub mod search;
pub mod stats;
pub mod tokens;
