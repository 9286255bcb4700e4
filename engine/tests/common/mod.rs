//! Shared helpers for the engine's real-model tests.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

pub mod http;
pub mod steps;

use pacer_engine::{ComputeDevice, LoadedModel, Tier};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The real model: `PACER_MODEL`, else the file `scripts/fetch-model.sh` caches. A missing
/// model fails the test (the test command fetches it first); it is never silently skipped.
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("PACER_MODEL").map(PathBuf::from).or_else(pacer_engine::default_model_path);
    match path {
        Some(p) if p.exists() => p,
        p => panic!("model not found at {p:?}: run scripts/fetch-model.sh or set PACER_MODEL"),
    }
}

type ModelCache = Mutex<Vec<((Tier, ComputeDevice), Arc<LoadedModel>)>>;

/// One loaded model per tier per test binary (loading converts ~135M parameters), on the CPU
/// kernels.
pub fn loaded(tier: Tier) -> Arc<LoadedModel> {
    loaded_on(tier, ComputeDevice::Cpu)
}

/// As [`loaded`], with the forward step on `device`.
pub fn loaded_on(tier: Tier, device: ComputeDevice) -> Arc<LoadedModel> {
    static CACHE: OnceLock<ModelCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = cache.iter().find(|(k, _)| *k == (tier, device)) {
        return m.clone();
    }
    pacer_engine::threads::init_pool(pacer_engine::threads::compute_threads(None));
    let m = Arc::new(LoadedModel::open_on(&model_path(), tier, device).expect("load model"));
    cache.push(((tier, device), m.clone()));
    m
}

/// Reads a JSON file from `tests/data`.
pub fn data(name: &str) -> serde_json::Value {
    // `PACER_TEST_DATA`: where a test binary built elsewhere finds the data (scripts/gpu-check.sh).
    let dir = std::env::var_os("PACER_TEST_DATA")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"), PathBuf::from);
    let p = dir.join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("read test data")).expect("parse test data")
}
