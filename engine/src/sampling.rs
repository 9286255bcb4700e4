//! Next-token sampling: greedy, temperature, top-k, top-p, with a seeded generator so a request
//! with a `seed` is reproducible.

use serde::{Deserialize, Serialize};

/// How to pick the next token from logits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches p; 1 keeps all.
    pub top_p: f32,
    /// Seed for the random draw; `None` draws one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: None }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Checks ranges; the message names the offending field as OpenAI's API does.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(format!("temperature must be between 0 and 2, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// SplitMix64: tiny, fast, and stable across versions, so seeded outputs never change when a
/// dependency is upgraded. Shared with `pacer-bench` for its seeded schedules and prompts.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A sampler for one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
}

/// Index of the largest value; the lowest index wins a tie.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The log probability of a chosen token under the model's distribution (the raw logits,
/// before temperature, top-k or top-p, as vLLM reports them), and the `top` most likely tokens
/// with theirs, most likely first (ties by lower id).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub token: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The most likely tokens and their log probabilities.
    pub top: Vec<(u32, f32)>,
}

/// The most alternatives a request may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// [`TokenLogprob`] of `chosen` with `top` alternatives, from `logits` (log-softmax in f64).
pub fn token_logprob(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&v| f64::from(v - max).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |v: f32| (f64::from(v) - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::new();
    if top > 0 {
        let mut all: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = top.min(all.len());
        if k < all.len() {
            all.select_nth_unstable_by(k - 1, by_logit);
            all.truncate(k);
        }
        all.sort_unstable_by(by_logit);
        best = all.into_iter().map(|(i, v)| (i, lp(v))).collect();
    }
    TokenLogprob { token: chosen, logprob: lp(logits[chosen as usize]), top: best }
}

impl Sampler {
    /// A sampler with `params`; unseeded samplers draw their seed from the OS-seeded hasher.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0);
            h.finish()
        });
        Sampler { params, rng: SplitMix64(seed) }
    }

    /// Picks the next token id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_excluding(logits, &[])
    }

    /// Picks the next token id, never one of `banned` (the end-of-turn tokens under
    /// `ignore_eos`) unless every token is banned.
    pub fn sample_excluding(&mut self, logits: &[f32], banned: &[u32]) -> u32 {
        let p = self.params;
        let allowed = |i: u32| !banned.contains(&i);
        if p.temperature <= 0.0 || p.top_k == 1 {
            let top = argmax(logits);
            if allowed(top) {
                return top;
            }
            let mut best = None::<usize>;
            for (i, &v) in logits.iter().enumerate() {
                if allowed(i as u32) && best.is_none_or(|b| v > logits[b]) {
                    best = Some(i);
                }
            }
            return best.map_or(top, |b| b as u32);
        }
        let mut cand: Vec<(u32, f32)> =
            logits.iter().enumerate().map(|(i, &v)| (i as u32, v)).filter(|&(i, _)| allowed(i)).collect();
        if cand.is_empty() {
            return self.sample_excluding(logits, &[]);
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let max = cand[0].1;
        let mut probs: Vec<f64> =
            cand.iter().map(|&(_, v)| f64::from((v - max) / p.temperature).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    mass += x;
                    mass >= f64::from(p.top_p)
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.next_f64() * total;
        for (i, &x) in probs.iter().enumerate() {
            if u < x {
                return cand[i].0;
            }
            u -= x;
        }
        cand[probs.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_of_the_raw_logits() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lp = token_logprob(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((f64::from(lp.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        // Most likely first, ties by the lower id.
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        let mass: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| f64::from(token_logprob(&logits, i as u32, 0).logprob).exp())
            .sum();
        assert!((mass - 1.0).abs() < 1e-6);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprob(&logits, 0, 99).top.len(), 4);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample(&[0.0, 1.0, 0.5]), 1);
    }

    #[test]
    fn banned_tokens_are_never_drawn() {
        let logits = [0.0f32, 5.0, 4.0, -1.0];
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample_excluding(&logits, &[1]), 2);
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample_excluding(&logits, &[3]), 1);
        let p = SamplingParams { temperature: 2.0, top_k: 2, seed: Some(9), ..Default::default() };
        let mut s = Sampler::new(p);
        let drawn: std::collections::BTreeSet<u32> =
            (0..500).map(|_| s.sample_excluding(&logits, &[1])).collect();
        // Top-k is taken among the allowed tokens: the two best left are 2 and 0.
        assert_eq!(drawn, [0, 2].into());
        // With everything banned the ban is dropped rather than inventing a token.
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample_excluding(&[1.0, 2.0], &[0, 1]), 1);
        assert!(Sampler::new(p).sample_excluding(&[1.0, 2.0], &[0, 1]) < 2);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let p = SamplingParams { temperature: 1.5, top_k: 1, ..Default::default() };
        assert_eq!(Sampler::new(p).sample(&[0.0, 1.0, 0.5]), 1);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let logits = [5.0, 4.9, 0.0, -1.0, 4.8];
        let p = SamplingParams { temperature: 1.0, top_k: 2, seed: Some(7), ..Default::default() };
        let mut s = Sampler::new(p);
        assert!((0..200).map(|_| s.sample(&logits)).all(|t| t == 0 || t == 1));
        // Token 0 alone holds < 0.5 of the mass, so top_p = 0.3 keeps only it.
        let p = SamplingParams { temperature: 1.0, top_p: 0.3, seed: Some(7), ..Default::default() };
        let mut s = Sampler::new(p);
        assert!((0..200).map(|_| s.sample(&logits)).all(|t| t == 0));
    }

    #[test]
    fn a_seed_reproduces_the_draws_and_the_distribution_is_followed() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let p = SamplingParams { temperature: 1.0, seed: Some(42), ..Default::default() };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..4000).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..4000).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn validation_names_the_field() {
        let p = SamplingParams { temperature: 3.0, ..Default::default() };
        assert!(p.validate().unwrap_err().contains("temperature"));
        let p = SamplingParams { top_p: 0.0, ..Default::default() };
        assert!(p.validate().unwrap_err().contains("top_p"));
    }
}
