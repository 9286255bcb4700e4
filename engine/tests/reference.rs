//! The engine against llama.cpp on the same GGUF, through vectors llama.cpp produced
//! (`scripts/make-reference.sh`): tokenizer ids, and teacher-forced next-token logits of the
//! `f32` tier against llama.cpp on an f32 GGUF of the same weights with an f32 KV cache.

#![allow(clippy::unwrap_used)]

mod common;

use pacer_engine::model::{SeqCache, SeqStep};
use pacer_engine::{ComputeDevice, LoadedModel, Tier};

/// Next-token logits after every prefix of `tokens`, feeding one token per step (which also
/// exercises the KV cache at every position).
fn teacher_forced(m: &LoadedModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = m.model.new_kv_cache(tokens.len() + 16).unwrap();
    let mut seq = SeqCache::new();
    tokens
        .iter()
        .map(|tok| {
            let step = SeqStep { cache: &mut seq, tokens: std::slice::from_ref(tok), logits: true };
            m.model.forward(&mut kv, &mut [step]).unwrap().remove(0).unwrap()
        })
        .collect()
}

#[test]
fn tokenizer_matches_llama_cpp_and_round_trips() {
    let m = common::loaded(Tier::Q4_0);
    let reference = common::data("tokenizer_reference.json");
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = m.tokenizer.encode(text).unwrap();
        assert_eq!(got, want, "token ids differ for {text:?}");
        // Special tokens are not shown when decoding, so compare against the text without them.
        let mut visible = text.to_string();
        for &id in &want {
            if m.tokenizer.bytes_of(id).is_empty() {
                visible = visible.replace(m.tokenizer.token(id).unwrap(), "");
            }
        }
        assert_eq!(m.tokenizer.decode(&got), visible, "decode does not round-trip {text:?}");
    }
}

/// Largest |logit difference| allowed against llama.cpp's f32 run. Both sides compute in f32
/// from identical weights; what remains is summation order (SIMD widths, GEMM blocking,
/// attention reductions) over 30 layers, which stays far below 1e-3 on logits of
/// magnitude 10–30: measured worst 3.2e-5 over 121 positions (printed by the test). 1e-3 keeps
/// a 30× margin for other CPUs' SIMD widths while catching any real error: a wrong RoPE pairing,
/// mask, norm epsilon or KV slot moves logits by tenths to whole units.
const LOGIT_TOLERANCE: f32 = 1e-3;

#[test]
fn f32_logits_match_llama_cpp_teacher_forced() {
    check_f32_against_llama_cpp(&common::loaded(Tier::F32), LOGIT_TOLERANCE);
}

/// The candle backend's device: candle's CPU device here, `PACER_TEST_DEVICE=cuda` on a GPU
/// machine (`scripts/gpu-check.sh`).
fn candle_device() -> ComputeDevice {
    std::env::var("PACER_TEST_DEVICE").map_or(ComputeDevice::CandleCpu, |d| d.parse().unwrap())
}

/// The candle backend against the same llama.cpp logits. Its f32 matmuls (candle's GEMM, or
/// cuBLAS) and softmax sum in yet another order than the kernels; measured worst here 2.5e-5
/// (printed). The same 1e-3 bound holds it to the kernels' standard.
#[test]
fn candle_f32_logits_match_llama_cpp_teacher_forced() {
    check_f32_against_llama_cpp(&common::loaded_on(Tier::F32, candle_device()), LOGIT_TOLERANCE);
}

fn check_f32_against_llama_cpp(m: &LoadedModel, tolerance: f32) {
    let reference = common::data("logits_reference.json");
    let mut worst = 0f32;
    let mut checked = 0;
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let tokens: Vec<u32> =
            case["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let positions = case["positions"].as_array().unwrap();
        assert_eq!(positions.len(), tokens.len());
        for (p, (logits, want)) in teacher_forced(m, &tokens).iter().zip(positions).enumerate() {
            let want_ids: Vec<u32> =
                want["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let want_logits: Vec<f32> =
                want["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let mut order: Vec<u32> = (0..logits.len() as u32).collect();
            order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
            assert_eq!(order[0], want_ids[0], "{name} position {p}: top-1 differs");
            let mut got5 = order[..5].to_vec();
            let mut want5 = want_ids[..5].to_vec();
            // Near-ties may swap order within the top 5; the set must be the same.
            got5.sort_unstable();
            want5.sort_unstable();
            assert_eq!(got5, want5, "{name} position {p}: top-5 sets differ");
            for (&id, &wl) in want_ids.iter().zip(&want_logits) {
                let d = (logits[id as usize] - wl).abs();
                worst = worst.max(d);
                assert!(d <= tolerance, "{name} position {p} token {id}: {} vs {wl}", logits[id as usize]);
            }
            checked += 1;
        }
    }
    eprintln!("{}: checked {checked} positions; worst |Δlogit| = {worst:.2e}", m.model.device);
    assert!(checked > 50);
}

/// Share of reference positions where `tier`'s top-1 token equals llama.cpp's f32 top-1, and
/// the largest logit error on the reference's top-10 tokens.
fn agreement_with_f32_reference(m: &LoadedModel) -> (f64, f32) {
    let reference = common::data("logits_reference.json");
    let (mut agree, mut total, mut worst) = (0usize, 0usize, 0f32);
    for case in reference["cases"].as_array().unwrap() {
        let tokens: Vec<u32> =
            case["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        for (logits, want) in teacher_forced(m, &tokens).iter().zip(case["positions"].as_array().unwrap()) {
            let top = pacer_engine::sampling::argmax(logits);
            agree += usize::from(u64::from(top) == want["ids"][0].as_u64().unwrap());
            total += 1;
            for (id, wl) in want["ids"].as_array().unwrap().iter().zip(want["logits"].as_array().unwrap()) {
                worst =
                    worst.max((logits[id.as_u64().unwrap() as usize] - wl.as_f64().unwrap() as f32).abs());
            }
        }
    }
    (agree as f64 / total as f64, worst)
}

/// The quantized tiers trade precision for speed; this pins how much. Measured here (printed):
/// q8_0 98.3%, native (Q4_1) 97.5%, q4_0 69.4% top-1 agreement. llama.cpp on its own q8_0 and
/// q4_0 GGUFs of these weights agrees 96.7% and 66.9% on the same positions: q4_0's loss is
/// the cost of requantizing Q4_1 weights to a symmetric 4-bit grid, not a kernel error. The
/// thresholds sit a few points below, so a kernel bug (agreement near chance) fails.
#[test]
fn quantized_tiers_stay_close_to_f32() {
    check_quantized_tiers(ComputeDevice::Cpu);
}

/// The same bounds on the candle backend, whose quantized matmuls are candle's (ggml-style
/// blocks; on the CPU device the activations are quantized to 8 bits as llama.cpp does).
/// Measured here (printed): q8_0 94.2%, native 99.2%, q4_0 70.2%.
#[test]
fn candle_quantized_tiers_stay_close_to_f32() {
    check_quantized_tiers(candle_device());
}

fn check_quantized_tiers(device: ComputeDevice) {
    for (tier, min_agreement) in [(Tier::Q8_0, 0.9), (Tier::Native, 0.9), (Tier::Q4_0, 0.6)] {
        let (agreement, worst) = agreement_with_f32_reference(&common::loaded_on(tier, device));
        eprintln!(
            "{device} {tier}: top-1 agreement with f32 {:.1}%, worst |Δlogit| {worst:.3}",
            agreement * 100.0
        );
        assert!(
            agreement >= min_agreement,
            "{device} {tier}: top-1 agreement {agreement:.3} < {min_agreement}"
        );
    }
}
