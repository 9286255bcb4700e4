//! The operator against the real systems it talks to, in one test binary with one control plane:
//! kube-apiserver, etcd, the controller manager, the scheduler and kwok nodes (started on first
//! use by `common::cluster()` and shared by every module; each test has its own namespace), a
//! real Prometheus, and engine processes on the real model where a module needs them.
//!
//! - `validation`, `local_validation`: the CRD's schema and CEL rules, and local mode's
//!   admission, refusing and accepting the same specs;
//! - `reconcile`, `podmonitor`: the controller's children, status, Events, leadership;
//! - `planner`: the SLA loop on real engines' series;
//! - `prometheus`: the metrics source against a real Prometheus;
//! - `chart`: the Helm chart, its values, and the monitoring config it ships;
//! - `profiles`: the committed engine profiles parse.
//!
//! The other tiers have binaries of their own: `local` (local mode on real engines) and
//! `closed_loop` (everything in a cluster), which run traffic in real time.

#[path = "../common/mod.rs"]
mod common;

mod chart;
#[cfg(feature = "local")]
mod local_validation;
mod planner;
mod podmonitor;
mod profiles;
#[cfg(feature = "local")]
mod prometheus;
mod reconcile;
mod validation;
