//! Hyper-parameters of a llama-family model, read from GGUF metadata, and the quantization tier
//! chosen at load.

use crate::error::EngineError;
use candle_core::quantized::gguf_file::{Content, Value};

/// Architectures whose GGUF tensors follow llama's layout (names, tied or separate head,
/// "norm" RoPE on pre-permuted q/k weights).
pub const LLAMA_FAMILY: &[&str] = &["llama", "mistral", "smollm"];

/// Shape and numerics of a llama-family transformer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlamaConfig {
    /// `general.architecture`.
    pub architecture: String,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub embedding: usize,
    /// Feed-forward inner size.
    pub feed_forward: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Trained context length: the longest sequence the engine accepts.
    pub context_length: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
}

fn get<'a>(c: &'a Content, key: &str) -> Result<&'a Value, EngineError> {
    c.metadata.get(key).ok_or_else(|| EngineError::model(format!("GGUF metadata has no `{key}`")))
}

fn get_usize(c: &Content, key: &str) -> Result<usize, EngineError> {
    let v = get(c, key)?;
    v.to_u64()
        .or_else(|_| v.to_u32().map(u64::from))
        .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
        .map(|x| x as usize)
        .map_err(|e| EngineError::model(format!("`{key}` is not an integer: {e}")))
}

fn get_f32(c: &Content, key: &str) -> Option<f32> {
    c.metadata.get(key).and_then(|v| v.to_f32().ok().or_else(|| v.to_f64().ok().map(|x| x as f32)))
}

impl LlamaConfig {
    /// Reads the configuration from GGUF metadata; rejects non-llama architectures.
    pub fn from_gguf(c: &Content) -> Result<Self, EngineError> {
        let arch = get(c, "general.architecture")?
            .to_string()
            .map_err(|e| EngineError::model(format!("general.architecture: {e}")))?
            .clone();
        if !LLAMA_FAMILY.contains(&arch.as_str()) {
            return Err(EngineError::model(format!(
                "architecture `{arch}` is not supported (llama-family GGUFs only: {LLAMA_FAMILY:?})"
            )));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let embedding = get_usize(c, &k("embedding_length"))?;
        let heads = get_usize(c, &k("attention.head_count"))?;
        let kv_heads = get_usize(c, &k("attention.head_count_kv")).unwrap_or(heads);
        let head_dim = get_usize(c, &k("rope.dimension_count")).unwrap_or(embedding / heads.max(1));
        let vocab_size = match c.metadata.get("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()) {
            Some(tokens) => tokens.len(),
            None => get_usize(c, &k("vocab_size"))?,
        };
        let cfg = LlamaConfig {
            name: c.metadata.get("general.name").and_then(|v| v.to_string().ok()).cloned(),
            layers: get_usize(c, &k("block_count"))?,
            embedding,
            feed_forward: get_usize(c, &k("feed_forward_length"))?,
            heads,
            kv_heads,
            head_dim,
            context_length: get_usize(c, &k("context_length"))?,
            rope_base: get_f32(c, &k("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: get_f32(c, &k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            vocab_size,
            architecture: arch,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), EngineError> {
        let ok = self.layers > 0
            && self.heads > 0
            && self.kv_heads > 0
            && self.heads.is_multiple_of(self.kv_heads)
            && self.head_dim.is_multiple_of(2)
            && self.heads * self.head_dim == self.embedding
            && self.embedding.is_multiple_of(crate::kernels::BLOCK)
            && self.feed_forward.is_multiple_of(crate::kernels::BLOCK);
        if ok { Ok(()) } else { Err(EngineError::model(format!("unsupported model shape: {self:?}"))) }
    }
}

/// Quantization tier of the weight matrices, chosen at load: the contract's type, so the
/// engine, the planner and the CRD share one list. `pacer-engine` loads [`Tier::PACER`]; norms
/// always stay f32.
///
/// ```
/// use pacer_engine::Tier;
///
/// assert_eq!("q4_0".parse::<Tier>(), Ok(Tier::Q4_0));
/// assert_eq!(Tier::Native.to_string(), "native");
/// assert!("q4_k".parse::<Tier>().is_err());
/// ```
pub use pacer_engine_api::Tier;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_print() {
        for t in Tier::PACER {
            assert_eq!(t.as_str().parse::<Tier>(), Ok(t));
        }
        assert!("q4_k".parse::<Tier>().unwrap_err().contains("unknown tier"));
    }
}
