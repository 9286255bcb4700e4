//! Unit tests of `candle_backend.rs`.

use super::super::{Backend, Model, read_content};
use super::*;
use crate::ComputeDevice;

/// The test model at `f32` on candle's CPU device (or `PACER_TEST_DEVICE`'s, as in the
/// integration tests), its embedding made a candle variable so that every op downstream of
/// it is recorded in the graph of the logits.
fn tracked_model() -> Model {
    let path = std::env::var("PACER_MODEL").expect("PACER_MODEL: the test model (scripts/fetch-model.sh)");
    let device = std::env::var("PACER_TEST_DEVICE")
        .map_or(ComputeDevice::CandleCpu, |d| d.parse().expect("PACER_TEST_DEVICE: a device"));
    let (content, mut reader) = read_content(Path::new(&path)).expect("read the model");
    let mut m =
        Model::from_gguf(Path::new(&path), &content, &mut reader, Tier::F32, device).expect("load the model");
    let Backend::Candle(w) = &mut m.backend else { panic!("{device} loads the candle backend") };
    w.embedding = candle_core::Var::from_tensor(&w.embedding).expect("var").as_tensor().clone();
    m
}

/// The candle ops on the path from the embedding to the logits of one step: sequences
/// decoding with `cached` tokens each, beside `chunk` prompt rows of one more.
fn ops_with(m: &Model, cached: &[usize], chunk: usize) -> usize {
    let Backend::Candle(w) = &m.backend else { unreachable!("a candle model") };
    let blocks_per_seq = 16;
    let decode = cached.len();
    let kv = DeviceKv::new(&m.config, (decode + 1) * blocks_per_seq, w.device()).expect("kv");
    let tables: Vec<Vec<u32>> = (0..=decode)
        .map(|i| (0..blocks_per_seq).map(|b| (i * blocks_per_seq + b) as u32).collect())
        .collect();
    let mut seqs: Vec<SeqRows<'_>> =
        tables.iter().zip(cached).map(|(t, &start)| SeqRows { table: t, start, rows: 1 }).collect();
    if chunk > 0 {
        seqs.push(SeqRows { table: &tables[decode], start: 0, rows: chunk });
    }
    let rows: usize = seqs.iter().map(|s| s.rows).sum();
    let tokens = vec![1u32; rows];
    let wanted: Vec<u32> = (0..rows as u32).collect();
    let logits = w.step_logits(&m.config, &kv, &seqs, &tokens, &wanted).expect("step").expect("logits");
    assert_eq!(logits.dims2().expect("2-d"), (rows, m.config.vocab_size));
    logits.sorted_nodes().len()
}

/// [`ops_with`] for `decode` sequences with 16 tokens cached each.
fn ops(m: &Model, decode: usize, chunk: usize) -> usize {
    ops_with(m, &vec![16; decode], chunk)
}

/// The logits of a decode step after a 40-token prefill, with the KV cache in `dtype`.
fn logits_with_kv(m: &Model, dtype: DType) -> Vec<f32> {
    let Backend::Candle(w) = &m.backend else { unreachable!("a candle model") };
    let kv = DeviceKv::with_dtype(&m.config, 4, w.device(), dtype).expect("kv");
    let table = [0, 1, 2, 3];
    let prompt: Vec<u32> = (0..40).map(|i| 200 + 37 * i).collect();
    let step = |start: usize, tokens: &[u32]| {
        let seqs = [SeqRows { table: &table, start, rows: tokens.len() }];
        w.step(&m.config, &kv, &seqs, tokens, &[tokens.len() as u32 - 1]).expect("step")
    };
    step(0, &prompt);
    step(40, &[1234])
}

/// f16 keys and values (the GPU's KV cache) move the logits by far less than a tier does
/// and keep the top token.
#[test]
fn an_f16_kv_cache_stays_close_to_f32() {
    let m = tracked_model();
    let (f32s, f16s) = (logits_with_kv(&m, DType::F32), logits_with_kv(&m, DType::F16));
    let worst = f32s.iter().zip(&f16s).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("f16 KV: worst |Δlogit| {worst:.2e} against f32");
    assert!(worst < 0.05, "{worst}");
    assert_eq!(crate::sampling::argmax(&f32s), crate::sampling::argmax(&f16s));
}

/// A GPU step is bound by kernel launches: the number of candle ops in one step must not
/// grow with the number of sequences in it (it grew by about fourteen per sequence and
/// layer when attention ran sequence by sequence).
#[test]
fn a_steps_op_count_does_not_grow_with_the_batch() {
    let m = tracked_model();
    let decode_only: Vec<usize> = [1, 8, 64].iter().map(|&b| ops(&m, b, 0)).collect();
    assert!(decode_only[0] > m.config.layers * 10, "the graph was recorded: {decode_only:?}");
    // At batch 1 a permute of size-1 axes, and the q|k columns of the one row, are already
    // contiguous, and candle skips the copy after each (two ops per layer fewer, no
    // kernel); from batch 8 on the count is flat.
    let flat = |n: &[usize]| n[0] <= n[1] && n[1] == n[2] && n[1] - n[0] <= 2 * m.config.layers;
    assert!(flat(&decode_only), "decode steps at batch 1, 8, 64: {decode_only:?}");
    let mixed: Vec<usize> = [1, 8, 64].iter().map(|&b| ops(&m, b, 24)).collect();
    assert!(flat(&mixed), "with a prompt chunk beside them: {mixed:?}");
    let chunks: Vec<usize> = [24, 40].iter().map(|&c| ops(&m, 8, c)).collect();
    assert_eq!(chunks[0], chunks[1], "chunks of other lengths");
    // Contexts of three length classes (up to 64, 128 and 256 keys) make three groups, as
    // many ops for three sequences as for sixty.
    let classes = [16, 100, 200];
    let three = ops_with(&m, &classes, 0);
    let sixty: Vec<usize> = (0..60).map(|i| classes[i % 3] + i / 3).collect();
    assert_eq!(ops_with(&m, &sixty, 0), three, "sixty sequences in three context classes");
    assert!(three > decode_only[1], "more classes, more groups: {three} vs {}", decode_only[1]);
    println!(
        "candle ops per step at batch 1, 8, 64: {decode_only:?} decoding, {mixed:?} beside a prompt chunk"
    );
}
