//! `pacer-engine profile` on the real model: the JSON it writes is a schema-1 engine profile
//! whose step times are positive and grow with rows, whose fit matches its own samples, and
//! whose f32-against-f32 quality is exact; bad input fails fast with a clear message.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn engine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pacer-engine")).args(args).output().unwrap()
}

fn out_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.json", std::process::id()))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The largest mean relative error accepted between the fitted step model and its samples.
/// The committed profiles fit within ~5 %; the quick grid on a machine shared with compilers
/// is noisier, and the bound still rejects a fit that ignores the data.
const MAX_MEAN_RELATIVE_ERROR: f64 = 0.3;

#[test]
fn a_quick_f32_profile_is_a_valid_schema_1_profile() {
    let model = common::model_path();
    let out = out_path("profile-f32");
    let o = engine(&[
        "profile",
        "--quick",
        "--tier",
        "f32",
        "--threads",
        "1",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "profile failed: {}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("mean relative error"), "the fit's error is printed: {stdout}");

    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(p["schema"], 1);
    assert_eq!(p["tier"], "f32");
    assert_eq!(p["threads"], 1);
    assert_eq!(p["model"], model.file_name().unwrap().to_str().unwrap());
    assert!(!p["device"].as_str().unwrap().is_empty());
    assert!(p["load_seconds"].as_f64().unwrap() > 0.0);
    assert!(p["warmup_seconds"].as_f64().unwrap() > 0.0);

    let step = &p["step"];
    let coef = |k: &str| step[k].as_f64().unwrap();
    let (base, row, prefill, context) =
        (coef("base_s"), coef("per_decode_row_s"), coef("per_prefill_token_s"), coef("per_context_token_s"));
    for c in [base, row, prefill, context] {
        assert!(c.is_finite() && c >= 0.0, "coefficients are non-negative: {step}");
    }
    assert!(base + row > 0.0, "a decode step takes time: {step}");

    let samples = p["samples"].as_array().unwrap();
    assert!(samples.len() >= 6, "{samples:?}");
    let field = |s: &serde_json::Value, k: &str| s[k].as_f64().unwrap();
    for s in samples {
        assert!(field(s, "seconds") > 0.0, "{s}");
    }
    // At every context length, the step with the most decode rows takes longer than the step
    // with one (f32 at 16 rows is ~3× a single row, far above the noise).
    let decode: Vec<&serde_json::Value> = samples
        .iter()
        .filter(|s| field(s, "prefill_tokens") == 0.0 && field(s, "decode_rows") > 0.0)
        .collect();
    let per_row_context =
        |s: &serde_json::Value| (field(s, "context_tokens") / field(s, "decode_rows")).round();
    let mut contexts: Vec<f64> = decode.iter().map(|s| per_row_context(s)).collect();
    contexts.dedup();
    assert!(contexts.len() >= 2, "decode steps at several context lengths: {contexts:?}");
    for c in contexts {
        let at: Vec<_> = decode.iter().filter(|s| per_row_context(s) == c).collect();
        let fewest = at.iter().min_by_key(|s| s["decode_rows"].as_u64()).unwrap();
        let most = at.iter().max_by_key(|s| s["decode_rows"].as_u64()).unwrap();
        assert!(
            field(most, "seconds") > field(fewest, "seconds"),
            "more rows take longer: {most} vs {fewest}"
        );
    }
    assert!(samples.iter().any(|s| field(s, "decode_rows") > 0.0 && field(s, "prefill_tokens") > 0.0));

    // The fit, recomputed from the JSON alone.
    let errors: Vec<f64> = samples
        .iter()
        .map(|s| {
            let t = field(s, "seconds");
            let predicted = base
                + row * field(s, "decode_rows")
                + prefill * field(s, "prefill_tokens")
                + context * field(s, "context_tokens");
            ((predicted - t) / t).abs()
        })
        .collect();
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    assert!(mean < MAX_MEAN_RELATIVE_ERROR, "mean relative error {mean:.3} of {step} over {samples:?}");

    let q = &p["quality"];
    assert_eq!(q["reference_tier"], "f32");
    assert_eq!(q["tokens"], 48);
    assert_eq!(q["top1_agreement"].as_f64(), Some(1.0), "f32 agrees with itself: {q}");
    assert_eq!(q["mean_kl"].as_f64(), Some(0.0), "f32 against itself has zero KL: {q}");
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn a_bad_tier_is_refused() {
    let o = engine(&["profile", "--tier", "q3_k", "--out", out_path("bad-tier").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown tier `q3_k`"), "{}", stderr(&o));
}

#[test]
fn a_missing_model_is_named() {
    let out = out_path("missing-model");
    let o = engine(&["profile", "--model", "no/such/model.gguf", "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("model file no/such/model.gguf does not exist"), "{}", stderr(&o));
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn an_unwritable_out_path_fails_before_measuring() {
    let model = common::model_path();
    let started = std::time::Instant::now();
    let o =
        engine(&["profile", "--model", model.to_str().unwrap(), "--out", "no/such/directory/profile.json"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot write the profile to no/such/directory/profile.json"),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed().as_secs() < 5, "it failed before loading the model");
}
