//! Generation as a per-sequence state machine over the batched forward: a [`Sequence`] says what
//! it needs fed next (a prompt chunk or its last token) and turns the logits it gets back into a
//! token, text and, eventually, a finish reason. [`run_to_completion`] drives a set of them with
//! chunked prefill; the server's continuous-batching scheduler drives the same state machine.

use crate::error::EngineError;
use crate::model::{KvCache, Model, SeqCache, SeqStep};
use crate::sampling::{Sampler, SamplingParams, TokenLogprob, token_logprob};
use crate::stop::StopMatcher;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use serde::Serialize;

/// What to generate for one prompt.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (already templated and tokenized).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Never stop at, nor draw, the end-of-turn tokens: generate `max_tokens` of text
    /// (benchmarks want fixed lengths).
    pub ignore_eos: bool,
    /// Report each generated token's log probability and this many most likely alternatives
    /// (`None`: no log probabilities).
    pub logprobs: Option<usize>,
}

/// Why a sequence ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    /// OpenAI's string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One generated token and the text it released.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The sampled id.
    pub token: u32,
    /// Text that is now safe to show (may be empty while UTF-8 or a stop string is pending).
    pub text: String,
    /// Set on the sequence's last delta.
    pub finish: Option<FinishReason>,
    /// The token's log probability, when the request asked for them (not for an end-of-turn
    /// token, whose text is not part of the answer).
    pub logprob: Option<TokenLogprob>,
}

/// A sequence being generated.
#[derive(Debug)]
pub struct Sequence {
    /// Its KV cache.
    pub cache: SeqCache,
    prompt: Vec<u32>,
    prefilled: usize,
    generated: Vec<u32>,
    /// After a preemption: the prompt and all but the last generated token, prefilled again
    /// to rebuild the freed KV cache (empty otherwise).
    recompute: Vec<u32>,
    max_tokens: usize,
    context_length: usize,
    ignore_eos: bool,
    logprobs: Option<usize>,
    sampler: Sampler,
    stops: StopMatcher,
    detok: StreamDecoder,
    finish: Option<FinishReason>,
}

impl Sequence {
    /// Validates `req` against the model's context and starts a sequence.
    pub fn new(req: GenerateRequest, context_length: usize) -> Result<Self, EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if req.prompt.len() >= context_length {
            return Err(EngineError::ContextOverflow { prompt: req.prompt.len(), context: context_length });
        }
        req.sampling.validate().map_err(EngineError::InvalidRequest)?;
        Ok(Sequence {
            cache: SeqCache::new(),
            prefilled: 0,
            generated: Vec::new(),
            recompute: Vec::new(),
            max_tokens: req.max_tokens,
            context_length,
            ignore_eos: req.ignore_eos,
            logprobs: req.logprobs,
            sampler: Sampler::new(req.sampling),
            stops: StopMatcher::new(req.stop),
            detok: StreamDecoder::new(),
            finish: if req.max_tokens == 0 { Some(FinishReason::Length) } else { None },
            prompt: req.prompt,
        })
    }

    /// Prompt length.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }
    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }
    /// Set once the sequence is done.
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }
    /// Marks the first `n` prefill tokens as already in the cache (a prefix-cache hit).
    pub fn skip_cached(&mut self, n: usize) {
        debug_assert!(self.prefilled == 0 && n < self.prefill_tokens().len());
        self.prefilled = n;
    }
    /// The first `n` tokens the sequence has fed or will feed (prompt, then generated).
    pub fn tokens(&self, n: usize) -> std::borrow::Cow<'_, [u32]> {
        if n <= self.prompt.len() {
            std::borrow::Cow::Borrowed(&self.prompt[..n])
        } else {
            let extra = (n - self.prompt.len()).min(self.generated.len());
            std::borrow::Cow::Owned([self.prompt.as_slice(), &self.generated[..extra]].concat())
        }
    }
    /// The tokens prefill feeds: the prompt, or after a preemption the recompute sequence.
    pub fn prefill_tokens(&self) -> &[u32] {
        if self.recompute.is_empty() { &self.prompt } else { &self.recompute }
    }
    /// Whether prompt (or recompute) tokens remain to be prefilled.
    pub fn in_prefill(&self) -> bool {
        self.prefilled < self.prefill_tokens().len()
    }
    /// Tokens the KV cache must hold for this sequence to be admitted: everything prefill will
    /// feed plus the first token after it.
    pub fn admission_tokens(&self) -> usize {
        self.prefill_tokens().len() + 1
    }

    /// Prompt (or recompute) tokens not yet in the cache.
    pub fn remaining_prefill(&self) -> usize {
        self.prefill_tokens().len() - self.prefilled
    }

    /// Forgets the KV cache (already released to the pool) so the sequence can be admitted
    /// again later: it will prefill its prompt and the tokens it generated but the last, then
    /// go on decoding from that last token. Nothing already streamed is produced twice, and
    /// greedy output is the same as without the preemption.
    pub fn preempt(&mut self) {
        debug_assert!(self.cache.is_empty(), "release the cache before preempting");
        self.prefilled = 0;
        self.recompute = match self.generated.split_last() {
            Some((_, earlier)) => [self.prompt.as_slice(), earlier].concat(),
            None => Vec::new(),
        };
    }

    /// The tokens to feed next, at most `budget` of them (≥ 1), and whether the step must
    /// return logits for this sequence (only after the prompt's last token, or when decoding;
    /// not after a recompute, whose next token is known).
    pub fn next_input(&self, budget: usize) -> (&[u32], bool) {
        if self.in_prefill() {
            let source = self.prefill_tokens();
            let end = (self.prefilled + budget.max(1)).min(source.len());
            (&source[self.prefilled..end], end == source.len() && self.recompute.is_empty())
        } else {
            let last = self.generated.len() - 1;
            (&self.generated[last..], true)
        }
    }

    /// Records that `fed` tokens went through a step, and samples from `logits` if given.
    pub fn after_step(&mut self, fed: usize, logits: Option<&[f32]>, tokenizer: &Tokenizer) -> Option<Delta> {
        if self.in_prefill() {
            self.prefilled += fed;
        }
        let logits = logits?;
        // Under `ignore_eos` the end-of-turn tokens are never drawn (as llama.cpp's server does):
        // the output is text to the last token, not special tokens that stream nothing.
        let banned: &[u32] = if self.ignore_eos { tokenizer.stop_ids() } else { &[] };
        let token = self.sampler.sample_excluding(logits, banned);
        self.generated.push(token);
        let end_of_turn = !self.ignore_eos && tokenizer.stop_ids().contains(&token);
        let logprob = self.logprobs.filter(|_| !end_of_turn).map(|top| token_logprob(logits, token, top));
        let (mut text, finish, release_held) = if end_of_turn {
            (String::new(), Some(FinishReason::Stop), true)
        } else {
            let piece = self.detok.push(tokenizer, token);
            let out = self.stops.push(&piece);
            if out.stopped {
                // Whatever follows a stop string is discarded with it.
                (out.text, Some(FinishReason::Stop), false)
            } else if self.generated.len() >= self.max_tokens
                || self.prompt.len() + self.generated.len() >= self.context_length
            {
                (out.text, Some(FinishReason::Length), true)
            } else {
                (out.text, None, false)
            }
        };
        if release_held {
            // Text held for an incomplete UTF-8 character or a stop-string prefix that never
            // completed is real output: release it with the last delta.
            let tail = self.detok.finish();
            let out = self.stops.push(&tail);
            text.push_str(&out.text);
            if !out.stopped {
                text.push_str(&self.stops.flush());
            }
        }
        self.finish = finish;
        Some(Delta { token, text, finish, logprob })
    }
}

/// Timings of a [`run_to_completion`] call.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RunStats {
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds spent in steps that only prefilled.
    pub prefill_seconds: f64,
    /// Seconds spent in steps that decoded.
    pub decode_seconds: f64,
}

/// Generates every sequence to completion: each step feeds every unfinished sequence (a prompt
/// chunk of at most `prefill_chunk` tokens, or one decode token), frees finished sequences'
/// KV blocks, and reports each delta to `on_delta(sequence index, delta)`.
pub fn run_to_completion(
    model: &Model,
    tokenizer: &Tokenizer,
    kv: &mut KvCache,
    seqs: &mut [Sequence],
    prefill_chunk: usize,
    mut on_delta: impl FnMut(usize, &Delta),
) -> Result<RunStats, EngineError> {
    let mut stats =
        RunStats { prompt_tokens: seqs.iter().map(Sequence::prompt_len).sum(), ..Default::default() };
    loop {
        let active: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].finish.is_none()).collect();
        if active.is_empty() {
            return Ok(stats);
        }
        let prefill_only = active.iter().all(|&i| seqs[i].in_prefill());
        let started = std::time::Instant::now();
        // Feed lengths and logits flags first, then borrow the caches mutably for the step.
        let inputs: Vec<(Vec<u32>, bool)> = active
            .iter()
            .map(|&i| {
                let (t, l) = seqs[i].next_input(prefill_chunk);
                (t.to_vec(), l)
            })
            .collect();
        let mut caches: Vec<SeqCache> = active.iter().map(|&i| std::mem::take(&mut seqs[i].cache)).collect();
        let result = {
            let mut steps: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(&inputs)
                .map(|(cache, (tokens, logits))| SeqStep { cache, tokens, logits: *logits })
                .collect();
            model.forward(kv, &mut steps)
        };
        for (&i, cache) in active.iter().zip(caches) {
            seqs[i].cache = cache;
        }
        let logits = result?;
        let elapsed = started.elapsed().as_secs_f64();
        if prefill_only {
            stats.prefill_seconds += elapsed;
        } else {
            stats.decode_seconds += elapsed;
        }
        for ((&i, (tokens, _)), l) in active.iter().zip(&inputs).zip(logits) {
            if let Some(delta) = seqs[i].after_step(tokens.len(), l.as_deref(), tokenizer) {
                stats.generated_tokens += 1;
                on_delta(i, &delta);
            }
            if seqs[i].finish.is_some() {
                kv.release(&mut seqs[i].cache);
            }
        }
    }
}
