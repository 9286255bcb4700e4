//! The repository's own contracts, checked on every run (no cluster, no model):
//! - the crate graph: arrows only point down the layers of `docs/architecture.md`; the engine
//!   depends on nothing under `operator/`; the operator's image links no engine, bench, local
//!   mode or simulator;
//! - every metric name in `config/`, `charts/` and `docs/metrics.md` is one of the contract's
//!   ([`pacer_engine_api::metrics::ALL`]), and `docs/metrics.md` lists every one of them;
//! - no source file outside tests grows past the size a reader can hold.

use pacer_engine_api::metrics::{self, Source};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every file under `dir` (relative to the root) whose name ends in one of `exts`.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    stack.push(path);
                }
            } else if exts.iter().any(|e| name.ends_with(e)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The layer of each workspace crate: a crate may depend only on crates of lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("pacer-engine-api", 0),
    ("pacer-runtime", 0),
    ("pacer-tests", 0),
    ("pacer-engine", 1),
    ("pacer-planner", 1),
    ("pacer-crds", 2),
    ("pacer-bench", 2),
    ("pacer-local", 3),
    ("pacer-simulator", 3),
    ("pacer-operator", 4),
];

struct Package {
    manifest: PathBuf,
    /// (dependency, kind: None for normal, optional)
    deps: Vec<(String, Option<String>, bool)>,
}

fn workspace() -> BTreeMap<String, Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let mut packages = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["name"].as_str().is_some_and(|n| n.starts_with("pacer-")))
            .map(|d| {
                (
                    d["name"].as_str().unwrap_or_default().to_string(),
                    d["kind"].as_str().map(str::to_string),
                    d["optional"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest path"));
        packages.insert(p["name"].as_str().expect("name").to_string(), Package { manifest, deps });
    }
    packages
}

#[test]
fn arrows_only_point_down() {
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let packages = workspace();
    let names: BTreeSet<&str> = packages.keys().map(String::as_str).collect();
    let known: BTreeSet<&str> = layers.keys().copied().collect();
    assert_eq!(names, known, "every workspace crate has a layer in LAYERS (and docs/architecture.md)");
    let mut up = Vec::new();
    for (name, p) in &packages {
        for (dep, kind, _) in &p.deps {
            // Tests may use anything; what ships may not.
            if kind.is_none() && layers[dep.as_str()] >= layers[name.as_str()] {
                up.push(format!(
                    "{name} (layer {}) → {dep} (layer {})",
                    layers[name.as_str()],
                    layers[dep.as_str()]
                ));
            }
        }
    }
    assert!(up.is_empty(), "arrows that do not point down: {up:#?}");
}

#[test]
fn the_engine_depends_on_nothing_under_operator() {
    let packages = workspace();
    let operator_dir = root().join("operator").canonicalize().expect("operator/");
    let mut seen = BTreeSet::new();
    let mut stack = vec!["pacer-engine".to_string()];
    while let Some(name) = stack.pop() {
        for (dep, kind, _) in &packages[&name].deps {
            if kind.is_none() && seen.insert(dep.clone()) {
                stack.push(dep.clone());
            }
        }
    }
    for dep in &seen {
        let dir = packages[dep].manifest.parent().expect("folder").canonicalize().expect("exists");
        assert!(!dir.starts_with(&operator_dir), "pacer-engine depends on {dep} ({})", dir.display());
    }
}

#[test]
fn the_operator_image_links_no_engine_bench_local_mode_or_simulator() {
    let packages = workspace();
    for (dep, kind, optional) in &packages["pacer-operator"].deps {
        if kind.is_none()
            && ["pacer-engine", "pacer-bench", "pacer-local", "pacer-simulator"].contains(&dep.as_str())
        {
            assert!(optional, "pacer-operator depends on {dep} without a feature: its image would link it");
        }
    }
}

/// Metric names in text: the engine's and the operator's, and the recording rules' series.
fn metric_names(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(
        r"\b(vllm:[a-z0-9_]+|pacer_(?:engine|operator|router)_[a-z0-9_]+|inferenceservice:[a-z0-9_:]+)",
    )
    .expect("regex");
    re.find_iter(text)
        .map(|m| {
            let name = m.as_str().trim_end_matches(':');
            metrics::named(name).map_or_else(|| name.to_string(), |m| m.name.to_string())
        })
        .collect()
}

#[test]
fn config_charts_and_docs_use_exactly_the_contracts_metric_names() {
    let known: BTreeSet<String> = metrics::ALL.iter().map(|m| m.name.to_string()).collect();
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    let mut sources = files("config", &[".yaml", ".yml", ".json"]);
    sources.extend(files("charts", &[".yaml", ".yml", ".json", ".tpl", ".txt", ".md"]));
    for path in &sources {
        for name in metric_names(&read(path)) {
            if !known.contains(&name) {
                unknown.push(format!("{name} in {}", path.display()));
            }
            used.insert(name);
        }
    }
    assert!(unknown.is_empty(), "names the contract does not list: {unknown:#?}");
    // What the rules record is used by something (the dashboard or an alert), or it is dead.
    for m in metrics::ALL.iter().filter(|m| m.source == Source::Recorded) {
        assert!(used.contains(m.name), "the recorded series {} is defined nowhere in config/", m.name);
    }
    let doc = metric_names(&read(&root().join("docs/metrics.md")));
    let missing: Vec<_> = known.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&known).collect();
    assert!(missing.is_empty(), "docs/metrics.md does not list {missing:?}");
    assert!(extra.is_empty(), "docs/metrics.md lists names the contract does not: {extra:?}");
}

/// Non-test source files stay small enough to read in one sitting.
const MAX_SOURCE_LINES: usize = 600;

#[test]
fn source_files_stay_small() {
    let mut long = Vec::new();
    for dir in ["bench", "crds", "engine", "operator", "runtime", "tests/src"] {
        for path in files(dir, &[".rs"]) {
            let rel = path.strip_prefix(root()).unwrap_or(&path).display().to_string();
            let is_test = rel.contains("/tests/") || rel.ends_with("/tests.rs") || rel.contains("/benches/");
            if is_test {
                continue;
            }
            // Inline unit tests do not count: only the code above `#[cfg(test)]`.
            let text = read(&path);
            let code = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or(&text);
            let lines = code.lines().count();
            if lines > MAX_SOURCE_LINES {
                long.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(long.is_empty(), "source files over {MAX_SOURCE_LINES} lines: {long:#?}");
}
