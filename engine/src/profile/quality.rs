//! A tier's quality against the reference tier: teacher-forced next-token distributions
//! compared position by position (top-1 agreement, mean KL divergence).

use super::{ProfilePlan, QUALITY_TEXT, Quality};
use crate::Tokenizer;
use crate::error::EngineError;
use crate::model::{Model, SeqCache, SeqStep};

/// Natural-log softmax of `logits`, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&l| l as f64 - log_z).collect()
}

/// KL(p ‖ q) in nats of the distributions with logits `reference` (p) and `other` (q).
/// Identical logits give exactly 0.
pub fn kl_divergence(reference: &[f32], other: &[f32]) -> f64 {
    let lp = log_softmax(reference);
    let lq = log_softmax(other);
    lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum()
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold(0, |best, (i, &l)| if l > logits[best] { i } else { best })
}

/// Teacher-forces `tokens` through `reference` and `model` one position at a time and
/// compares their next-token distributions at every position.
pub fn compare_tiers(
    reference: &Model,
    model: &Model,
    tokens: &[u32],
    mut progress: impl FnMut(),
) -> Result<Quality, EngineError> {
    let mut runs = Vec::with_capacity(2);
    for m in [reference, model] {
        runs.push((m, m.new_kv_cache(tokens.len() + 1)?, SeqCache::new()));
    }
    let (mut agree, mut kl) = (0usize, 0.0);
    for token in tokens {
        let mut logits = Vec::with_capacity(2);
        for (m, kv, seq) in &mut runs {
            let step = SeqStep { cache: seq, tokens: std::slice::from_ref(token), logits: true };
            let out = m.forward(kv, &mut [step])?.pop().flatten();
            logits.push(out.ok_or_else(|| EngineError::model("the forward returned no logits"))?);
        }
        agree += usize::from(argmax(&logits[0]) == argmax(&logits[1]));
        kl += kl_divergence(&logits[0], &logits[1]);
        progress();
    }
    let n = tokens.len().max(1) as f64;
    Ok(Quality {
        reference_tier: reference.tier,
        tokens: tokens.len() as u32,
        top1_agreement: agree as f64 / n,
        mean_kl: kl / n,
    })
}

/// The tokens of [`QUALITY_TEXT`] that `plan` compares.
pub fn quality_tokens(tokenizer: &Tokenizer, plan: &ProfilePlan) -> Result<Vec<u32>, EngineError> {
    let mut tokens = tokenizer.encode(QUALITY_TEXT)?;
    if let Some(n) = plan.quality_tokens {
        tokens.truncate(n);
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_and_top1_maths() {
        let p = [2.0f32, 1.0, 0.0];
        assert_eq!(kl_divergence(&p, &p), 0.0);
        // Shifting every logit does not change the distribution.
        let shifted = p.map(|l| l + 3.0);
        assert!(kl_divergence(&p, &shifted).abs() < 1e-12);
        // Against a uniform q over 3 tokens, KL(p‖q) = ln 3 − H(p).
        let q = [0.0f32; 3];
        let probs: Vec<f64> = log_softmax(&p).iter().map(|l| l.exp()).collect();
        let entropy: f64 = -probs.iter().map(|x| x * x.ln()).sum::<f64>();
        assert!((kl_divergence(&p, &q) - (3f64.ln() - entropy)).abs() < 1e-12);
        // KL is not symmetric, and positive when the distributions differ.
        let r = [0.0f32, 1.0, 2.0];
        assert!(kl_divergence(&p, &r) > 0.5);
        assert!((log_softmax(&p).iter().map(|l| l.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(argmax(&p), 0);
        assert_eq!(argmax(&r), 2);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
