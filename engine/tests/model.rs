//! The model core on the real model: batching and chunking change nothing but speed, the
//! streaming detokenizer keeps characters whole, generation stops where it should, and a full
//! KV cache or an over-long prompt is an error, not a crash.

#![allow(clippy::unwrap_used)]

mod common;

use common::steps::{alone, chat_request, generate, max_abs_diff, prompts};

use pacer_engine::chat::ChatMessage;
use pacer_engine::generate::{FinishReason, GenerateRequest, Sequence, run_to_completion};
use pacer_engine::model::{SeqCache, SeqStep};
use pacer_engine::sampling::SamplingParams;
use pacer_engine::tokenizer::StreamDecoder;
use pacer_engine::{EngineError, Tier};

/// How far a sequence's logits may move when it shares a step with others or is chunked: not
/// at all at the quantized tiers (docs/engine.md promises bit-for-bit), and within 1e-3 at `f32`,
/// whose GEMM (taken for blocks of rows) sums in another order than a single row's dot products.
fn tolerance(tier: Tier) -> f32 {
    if tier == Tier::F32 { 1e-3 } else { 0.0 }
}

/// Batched rows go through the same kernels as a single row (see [`tolerance`]).
fn check_batched_equals_alone(tier: Tier) {
    let m = common::loaded(tier);
    let ps = prompts(&m);
    let single: Vec<Vec<f32>> = ps.iter().map(|p| alone(&m, p)).collect();
    let mut kv = m.model.new_kv_cache(256).unwrap();
    let mut caches: Vec<SeqCache> = ps.iter().map(|_| SeqCache::new()).collect();
    let mut steps: Vec<SeqStep<'_>> =
        caches.iter_mut().zip(&ps).map(|(cache, p)| SeqStep { cache, tokens: p, logits: true }).collect();
    let batched = m.model.forward(&mut kv, &mut steps).unwrap();
    for (i, (b, s)) in batched.iter().zip(&single).enumerate() {
        let d = max_abs_diff(b.as_ref().unwrap(), s);
        assert!(d <= tolerance(tier), "{tier} prompt {i}: batched differs from alone by {d}");
    }
}

#[test]
fn batched_prefill_of_different_lengths_equals_each_alone_q4_0() {
    check_batched_equals_alone(Tier::Q4_0);
}

#[test]
fn batched_prefill_of_different_lengths_equals_each_alone_f32() {
    check_batched_equals_alone(Tier::F32);
}

#[test]
fn mixed_prefill_and_decode_in_one_step_equals_each_alone() {
    let m = common::loaded(Tier::Q4_0);
    let ps = prompts(&m);
    let (a, b) = (&ps[1], &ps[2]);
    let mut kv = m.model.new_kv_cache(256).unwrap();
    // Sequence B is decoding (its prompt minus the last token is already cached) while
    // sequence A prefills from position 0 in the same step.
    let (mut ca, mut cb) = (SeqCache::new(), SeqCache::new());
    let split = b.len() - 1;
    m.model.forward(&mut kv, &mut [SeqStep { cache: &mut cb, tokens: &b[..split], logits: false }]).unwrap();
    let out = m
        .model
        .forward(
            &mut kv,
            &mut [
                SeqStep { cache: &mut ca, tokens: a, logits: true },
                SeqStep { cache: &mut cb, tokens: &b[split..], logits: true },
            ],
        )
        .unwrap();
    // Bit for bit: the quantized tier promises it.
    assert_eq!(max_abs_diff(out[0].as_ref().unwrap(), &alone(&m, a)), 0.0);
    assert_eq!(max_abs_diff(out[1].as_ref().unwrap(), &alone(&m, b)), 0.0);
    assert_eq!((ca.len(), cb.len()), (a.len(), b.len()));
}

#[test]
fn chunked_prefill_equals_one_shot() {
    for tier in [Tier::Q4_0, Tier::F32] {
        let m = common::loaded(tier);
        let text = "Chunked prefill splits a long prompt into pieces so that running decodes are never \
                    stalled for long; the result must not change at all.";
        let tokens = m.tokenizer.encode(text).unwrap();
        assert!(tokens.len() > 20);
        let whole = alone(&m, &tokens);
        let mut kv = m.model.new_kv_cache(tokens.len() + 16).unwrap();
        let mut seq = SeqCache::new();
        let mut last = None;
        for chunk in tokens.chunks(7) {
            last = m
                .model
                .forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens: chunk, logits: true }])
                .unwrap()
                .remove(0);
        }
        let d = max_abs_diff(&last.unwrap(), &whole);
        assert!(d <= tolerance(tier), "{tier}: chunked differs from one-shot by {d}");
    }
}

#[test]
fn streaming_detokenization_never_splits_a_character() {
    let m = common::loaded(Tier::Q4_0);
    let text = "Emoji 🙂🚀👩‍👩‍👧‍👦, accents café naïve, CJK 你好世界, and € signs.";
    let ids = m.tokenizer.encode(text).unwrap();
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    let mut held_back = false;
    for &id in &ids {
        let piece = dec.push(&m.tokenizer, id);
        assert!(!piece.contains('\u{FFFD}'), "a piece contains a broken character: {piece:?}");
        held_back |= piece.is_empty() && !m.tokenizer.bytes_of(id).is_empty();
        out.push_str(&piece);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
    assert!(held_back, "this text has multi-token characters, so some bytes must have been held");
}

#[test]
fn chat_template_renders_like_the_reference_conversation() {
    let m = common::loaded(Tier::Q4_0);
    let reference = common::data("tokenizer_reference.json");
    let chat_case = reference["cases"].as_array().unwrap().last().unwrap().clone();
    let messages = [
        ChatMessage::new("system", "You are a concise assistant."),
        ChatMessage::new("user", "What is the capital of France? Answer in one word."),
        ChatMessage::new("assistant", "Paris."),
        ChatMessage::new("user", "And of Japan? 🇯🇵"),
    ];
    let rendered = m.chat_template.as_ref().unwrap().render(&messages, true).unwrap();
    assert_eq!(
        rendered,
        chat_case["text"].as_str().unwrap(),
        "rendered by Python's jinja2 for the reference"
    );
    assert!(rendered.ends_with("<|im_start|>assistant\n"));
}

#[test]
fn greedy_chat_answers_and_stops_on_end_of_turn() {
    let m = common::loaded(Tier::Q4_0);
    let out = generate(&m, vec![chat_request(&m, "What is the capital of France?", 64, vec![])], 512);
    let (text, finish, _) = &out[0];
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(*finish, Some(FinishReason::Stop));
    assert!(!text.contains("<|im_end|>"));
}

/// Under `ignore_eos` the end-of-turn tokens are never drawn: the answer that stopped at 10-odd
/// tokens goes on as text to `max_tokens`, not as special tokens that stream nothing (which a
/// client sees as a doubled inter-token gap, and which llama.cpp's server never emits).
#[test]
fn ignore_eos_generates_text_to_max_tokens_without_end_of_turn_tokens() {
    let m = common::loaded(Tier::Q4_0);
    let ctx = m.model.config.context_length;
    let ended = generate(&m, vec![chat_request(&m, "What is the capital of France?", 64, vec![])], 512);
    assert!(ended[0].2 < 48, "the answer ends by itself well before 64 tokens: {ended:?}");
    let mut req = chat_request(&m, "What is the capital of France?", 64, vec![]);
    req.ignore_eos = true;
    let mut seqs = vec![Sequence::new(req, ctx).unwrap()];
    let mut kv = m.model.new_kv_cache(4096).unwrap();
    let mut text = String::new();
    run_to_completion(&m.model, &m.tokenizer, &mut kv, &mut seqs, 512, |_, d| text.push_str(&d.text))
        .unwrap();
    let generated = seqs[0].generated();
    assert_eq!((generated.len(), seqs[0].finish()), (64, Some(FinishReason::Length)));
    assert!(generated.iter().all(|t| !m.tokenizer.stop_ids().contains(t)), "{generated:?}");
    assert!(text.starts_with(&ended[0].0), "the same answer first: {text:?}");
}

#[test]
fn concurrent_greedy_sequences_generate_what_they_generate_alone() {
    let m = common::loaded(Tier::Q4_0);
    let questions =
        ["What is the capital of France?", "Name three colors.", "Write a haiku about rust.", "2+2="];
    let alone: Vec<_> = questions
        .iter()
        .map(|q| generate(&m, vec![chat_request(&m, q, 24, vec![])], 512).remove(0))
        .collect();
    let together = generate(&m, questions.iter().map(|q| chat_request(&m, q, 24, vec![])).collect(), 5);
    assert_eq!(alone, together);
}

#[test]
fn stop_strings_and_max_tokens_end_generation() {
    let m = common::loaded(Tier::Q4_0);
    let (text, finish, _) =
        generate(&m, vec![chat_request(&m, "What is the capital of France?", 64, vec!["Paris".into()])], 512)
            .remove(0);
    assert_eq!(finish, Some(FinishReason::Stop));
    assert!(!text.contains("Paris"), "the stop string is not shown: {text:?}");
    let (_, finish, n) =
        generate(&m, vec![chat_request(&m, "Tell me a long story.", 5, vec![])], 512).remove(0);
    assert_eq!((finish, n), (Some(FinishReason::Length), 5));
}

#[test]
fn a_seed_makes_sampling_reproducible() {
    let m = common::loaded(Tier::Q4_0);
    let req = |seed| {
        let mut r = chat_request(&m, "Invent a name for a cat.", 16, vec![]);
        r.sampling = SamplingParams { temperature: 1.0, top_k: 40, top_p: 0.95, seed: Some(seed) };
        r
    };
    let a = generate(&m, vec![req(1)], 512);
    assert_eq!(a, generate(&m, vec![req(1)], 512));
    let others: Vec<_> = (2..6).map(|s| generate(&m, vec![req(s)], 512)).collect();
    assert!(others.iter().any(|o| *o != a), "different seeds should not all agree");
}

#[test]
fn a_full_kv_cache_and_an_overlong_prompt_are_errors() {
    let m = common::loaded(Tier::Q4_0);
    let tokens = m.tokenizer.encode("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen").unwrap();
    let mut kv = m.model.new_kv_cache(16).unwrap();
    let mut seq = SeqCache::new();
    let err = m
        .model
        .forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens: &tokens, logits: true }])
        .unwrap_err();
    assert!(matches!(err, EngineError::KvCacheFull { .. }), "{err}");
    assert!(seq.is_empty() && kv.free_tokens() == 16, "a failed step reserves and writes nothing");

    let ctx = m.model.config.context_length;
    let req = GenerateRequest {
        prompt: vec![100; ctx],
        max_tokens: 1,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: false,
        logprobs: None,
    };
    assert!(matches!(Sequence::new(req, ctx), Err(EngineError::ContextOverflow { .. })));
}

#[test]
fn every_tier_loads_generates_and_is_sized_by_its_precision() {
    let mut sizes = Vec::new();
    for tier in Tier::PACER {
        let m = common::loaded(tier);
        let (text, _, n) =
            generate(&m, vec![chat_request(&m, "What is the capital of France?", 12, vec![])], 512).remove(0);
        assert!(n > 0 && !text.trim().is_empty(), "{tier}: {text:?}");
        sizes.push((tier, m.model.weight_bytes()));
    }
    let size = |t| sizes.iter().find(|(x, _)| *x == t).unwrap().1;
    // 32, 8.5, 5 and 4.5 bits per matmul weight (the embedding stays 8-bit below f32).
    assert!(size(Tier::F32) > size(Tier::Q8_0));
    assert!(size(Tier::Q8_0) > size(Tier::Native));
    assert!(size(Tier::Native) > size(Tier::Q4_0));
}

/// Tokenizing in pieces gives the same ids as tokenizing whole, wherever the cuts fall (tiny
/// pieces put one at every place one can), on the reference texts and on texts built to break
/// it: runs of spaces, spaces before newlines and tabs, Unicode spaces, digits, code, special
/// tokens; and a text over the limit is refused having read about the limit's worth of it.
#[test]
fn tokenizing_in_pieces_agrees_and_stops_at_the_limit() {
    let m = common::loaded(Tier::Q4_0);
    let t = &m.tokenizer;
    let reference = common::data("tokenizer_reference.json");
    let mut texts: Vec<String> = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    texts.extend(
        [
            "a  b   c    d \n e\t f \t\n  g",
            "  leading and trailing  ",
            "x\u{3000} y\u{a0} z\u{2003} w \u{85} v",
            "12 345 6789 1.5e10 0x1F  ",
            "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
            "<|im_start|>user hi there<|im_end|> <|im_start|>assistant ok<|im_end|>",
            "don't you'll we've  I'm 'tis ' s",
            "日本語 の テキスト 🇯🇵 🇫🇷 mixed with English words",
            "!!! ??? ... ---- ==== ;;;; a.\n\n b,\r\n c",
        ]
        .map(String::from),
    );
    for text in &texts {
        let whole = t.encode(text).unwrap();
        for chunk in [1, 2, 3, 7, 64] {
            let pieces = t.encode_chunked(text, usize::MAX, chunk).unwrap().unwrap();
            assert_eq!(pieces, whole, "in pieces of {chunk}: {text:?}");
        }
        assert_eq!(t.encode_within(text, usize::MAX).unwrap().unwrap(), whole);
    }

    // Megabytes of words, of one word, and of spaces: refused at the limit, having read a
    // bounded part of the text.
    let limit = 2048;
    for text in ["lorem ipsum dolor sit amet ".repeat(200_000), "a".repeat(4 << 20), " ".repeat(4 << 20)] {
        let over = t.encode_within(&text, limit).unwrap().unwrap_err();
        assert!(over.at_least >= limit, "{over:?}");
        assert!(
            over.read <= limit * 64 + pacer_engine::tokenizer::CHUNK_BYTES * 2
                || over.read == text.len() && over.at_least > limit,
            "read {} of {} bytes to refuse it",
            over.read,
            text.len()
        );
    }
    // Under the limit, the same ids as whole.
    let text = "lorem ipsum dolor sit amet ".repeat(50);
    assert_eq!(t.encode_within(&text, limit).unwrap().unwrap(), t.encode(&text).unwrap());
}

/// `pacer-engine bench` sizes its KV pool in whole blocks per sequence: a decode context that is
/// not a multiple of a block at a batch above one ran out of KV before.
#[test]
fn the_bench_fits_every_batch_and_step_count_in_its_pool() {
    let m = common::loaded(Tier::Q4_0);
    let plan = pacer_engine::bench::BenchPlan {
        prefill_lengths: vec![8],
        batch_sizes: vec![1, 2, 3],
        decode_steps: 4,
        repeats: 1,
        ..Default::default()
    };
    let figures = pacer_engine::bench::run(&m.model, &plan, |_| {}).expect("bench");
    assert_eq!(figures.len(), 4);
    assert!(figures.iter().all(|f| f.tokens_per_second > 0.0), "{figures:?}");
}
