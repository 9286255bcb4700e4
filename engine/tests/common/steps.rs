//! Driving the model directly in tests: one sequence alone, a few prompts, greedy chat
//! requests run to completion.

use pacer_engine::LoadedModel;
use pacer_engine::chat::ChatMessage;
use pacer_engine::generate::{FinishReason, GenerateRequest, Sequence, run_to_completion};
use pacer_engine::model::{SeqCache, SeqStep};
use pacer_engine::sampling::SamplingParams;

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn alone(m: &LoadedModel, tokens: &[u32]) -> Vec<f32> {
    let mut kv = m.model.new_kv_cache(tokens.len() + 16).unwrap();
    let mut seq = SeqCache::new();
    m.model
        .forward(&mut kv, &mut [SeqStep { cache: &mut seq, tokens, logits: true }])
        .unwrap()
        .remove(0)
        .unwrap()
}

pub fn prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    [
        "Hi",
        "The capital of France is",
        "fn main() { println!(\"hello\"); } // a longer prompt spanning blocks",
    ]
    .iter()
    .map(|t| m.tokenizer.encode(t).unwrap())
    .collect()
}

pub fn chat_request(
    m: &LoadedModel,
    question: &str,
    max_tokens: usize,
    stop: Vec<String>,
) -> GenerateRequest {
    let text = m.chat_template.as_ref().unwrap().render(&[ChatMessage::new("user", question)], true).unwrap();
    GenerateRequest {
        prompt: m.tokenizer.encode(&text).unwrap(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop,
        ignore_eos: false,
        logprobs: None,
    }
}

pub fn generate(
    m: &LoadedModel,
    reqs: Vec<GenerateRequest>,
    chunk: usize,
) -> Vec<(String, Option<FinishReason>, usize)> {
    let ctx = m.model.config.context_length;
    let mut seqs: Vec<Sequence> = reqs.into_iter().map(|r| Sequence::new(r, ctx).unwrap()).collect();
    let mut texts = vec![String::new(); seqs.len()];
    let mut kv = m.model.new_kv_cache(4096).unwrap();
    run_to_completion(&m.model, &m.tokenizer, &mut kv, &mut seqs, chunk, |i, d| texts[i].push_str(&d.text))
        .unwrap();
    assert_eq!(kv.free_tokens(), kv.capacity_tokens(), "finished sequences return their KV blocks");
    texts.into_iter().zip(&seqs).map(|(t, s)| (t, s.finish(), s.generated().len())).collect()
}
