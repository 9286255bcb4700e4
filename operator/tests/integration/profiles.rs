//! The engine profiles committed in `config/profiles/` are what the planner can read: each
//! parses and passes `EngineProfile::parse`'s checks, its name matches its content, and its
//! quality figures are sane (the f32 reference agrees with itself exactly).

#![allow(clippy::unwrap_used)]

use pacer_operator::planner::Tier;
use pacer_operator::planner::profile::{EngineProfile, PROFILE_SCHEMA};
use std::path::PathBuf;

fn profiles_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/profiles")
}

fn committed() -> Vec<(String, EngineProfile)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(profiles_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let profile =
                EngineProfile::parse(&text, &p.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
            (p.file_stem().unwrap().to_string_lossy().into_owned(), profile)
        })
        .collect()
}

#[test]
fn every_committed_profile_reads_and_checks() {
    let profiles = committed();
    let names: Vec<&str> = profiles.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "smollm2-135m-f32-t1",
        "smollm2-135m-q8_0-t1",
        "smollm2-135m-native-t1",
        "smollm2-135m-q4_0-t1",
        "smollm2-135m-native-t2",
    ] {
        assert!(names.contains(&expected), "{expected}.json is committed (found {names:?})");
    }
    for (name, p) in &profiles {
        assert_eq!(p.schema, PROFILE_SCHEMA);
        assert_eq!(name, &format!("smollm2-135m-{}-t{}", p.tier, p.threads), "file name matches content");
        assert_eq!(p.model, "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(!p.device.is_empty() && p.load_seconds > 0.0 && p.warmup_seconds > 0.0, "{name}");
        assert!(p.samples.len() >= 20, "{name}: the full grid, not --quick");
        let one_row = p.step.step_seconds(1.0, 0.0, 256.0);
        assert!(one_row > 1e-4 && one_row < 1.0, "{name}: a one-row decode step takes {one_row} s");
        let q = p.quality.as_ref().unwrap_or_else(|| panic!("{name} has quality figures"));
        assert_eq!(q.reference_tier, Tier::F32);
        assert!(q.tokens >= 400, "{name}: quality over the whole text");
        assert!((0.0..=1.0).contains(&q.top1_agreement) && q.mean_kl >= 0.0, "{name}: {q:?}");
        if p.tier == Tier::F32 {
            assert_eq!((q.top1_agreement, q.mean_kl), (1.0, 0.0), "{name}: f32 against itself");
        }
    }
}
