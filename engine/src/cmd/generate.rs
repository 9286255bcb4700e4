//! `pacer-engine generate`: stream a completion (or a chat reply) to stdout, with prefill and
//! decode timings.

use super::model::ModelArgs;
use super::model::load;
use anyhow::{Context, Result};
use clap::Args;
use pacer_engine::chat::ChatMessage;
use pacer_engine::generate::{GenerateRequest, Sequence, run_to_completion};
use pacer_engine::model::BLOCK_TOKENS;
use pacer_engine::sampling::SamplingParams;
use std::io::Write;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (the user message with --chat).
    #[arg(long, env = "PACER_GENERATE_PROMPT", short)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long, env = "PACER_GENERATE_CHAT")]
    chat: bool,
    /// System message for --chat (the template's default when omitted).
    #[arg(long, env = "PACER_GENERATE_SYSTEM")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, env = "PACER_GENERATE_MAX_TOKENS", default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, env = "PACER_GENERATE_TEMPERATURE", default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, env = "PACER_GENERATE_TOP_K", default_value_t = 0)]
    top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, env = "PACER_GENERATE_TOP_P", default_value_t = 1.0)]
    top_p: f32,
    /// Random seed for sampling.
    #[arg(long, env = "PACER_GENERATE_SEED")]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long, env = "PACER_GENERATE_STOP")]
    stop: Vec<String>,
    /// Prompt tokens per prefill step (chunked prefill).
    #[arg(long, env = "PACER_GENERATE_PREFILL_CHUNK", default_value_t = 512)]
    prefill_chunk: usize,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let GenerateArgs {
        model,
        prompt,
        chat,
        system,
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop,
        prefill_chunk,
    } = args;
    let loaded = load(&model)?;
    let text = if chat {
        let template =
            loaded.chat_template.as_ref().context("this model has no chat template; drop --chat")?;
        let mut messages: Vec<ChatMessage> =
            system.into_iter().map(|s| ChatMessage::new("system", s)).collect();
        messages.push(ChatMessage::new("user", prompt));
        template.render(&messages, true)?
    } else {
        prompt
    };
    let tokens = loaded.tokenizer.encode(&text)?;
    let context = loaded.model.config.context_length;
    let budget = (tokens.len() + max_tokens).min(context);
    let mut kv = loaded.model.new_kv_cache(budget.div_ceil(BLOCK_TOKENS) * BLOCK_TOKENS)?;
    let request = GenerateRequest {
        prompt: tokens,
        max_tokens,
        sampling: SamplingParams { temperature, top_k, top_p, seed },
        stop,
        ignore_eos: false,
        logprobs: None,
    };
    let mut seqs = vec![Sequence::new(request, context)?];
    let mut stdout = std::io::stdout().lock();
    let mut finish = None;
    let stats =
        run_to_completion(&loaded.model, &loaded.tokenizer, &mut kv, &mut seqs, prefill_chunk, |_, d| {
            let _ = stdout.write_all(d.text.as_bytes());
            let _ = stdout.flush();
            finish = d.finish.or(finish);
        })?;
    writeln!(stdout)?;
    let decode_tokens = stats.generated_tokens.saturating_sub(1);
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tok/s) | decode: {} tokens in {:.1} ms ({:.1} tok/s) | finish: {}",
        stats.prompt_tokens,
        stats.prefill_seconds * 1e3,
        stats.prompt_tokens as f64 / stats.prefill_seconds.max(1e-9),
        decode_tokens,
        stats.decode_seconds * 1e3,
        decode_tokens as f64 / stats.decode_seconds.max(1e-9),
        finish.map_or("none", |f| f.as_str()),
    );
    Ok(())
}
