//! Reading a llama-family GGUF into [`Weights`] at a chosen [`Tier`]: the tensors are parsed with
//! candle's GGUF reader, then each matrix is kept as stored or converted (dequantized to f32,
//! or requantized with candle's quantizer), in parallel across layers.
//!
//! Tensor naming follows candle-transformers' `quantized_llama` (Apache-2.0/MIT, by the candle
//! authors), from which this loader is adapted: `token_embd`, `output_norm`, `output` (absent
//! when tied), `blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,ffn_up,
//! ffn_down}`.

use super::config::{LlamaConfig, Tier};
use crate::error::EngineError;
use crate::kernels::{Format, Weight};
use candle_core::Device;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// One transformer block's parameters. Projections that read the same input are stacked so
/// each runs as one matmul: `qkv` = [q; k; v], `gate_up` = [gate; up].
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Stacked q, k, v projections.
    pub qkv: Weight,
    /// Attention output projection.
    pub out: Weight,
    /// RMSNorm weight before the feed-forward block.
    pub ffn_norm: Vec<f32>,
    /// Stacked gate and up projections.
    pub gate_up: Weight,
    /// Down projection.
    pub down: Weight,
}

/// All parameters of a model at one tier.
#[derive(Debug)]
pub struct Weights {
    /// Token embedding, also the output head when the model ties them.
    pub embedding: Weight,
    /// Separate output head, when the file has one.
    pub head: Option<Weight>,
    /// Final RMSNorm weight.
    pub output_norm: Vec<f32>,
    /// Transformer blocks.
    pub layers: Vec<Layer>,
}

impl Weights {
    /// Bytes held by all parameters.
    pub fn size_bytes(&self) -> usize {
        let mats = self
            .layers
            .iter()
            .map(|l| l.qkv.size_bytes() + l.out.size_bytes() + l.gate_up.size_bytes() + l.down.size_bytes());
        let norms = self.layers.iter().map(|l| 4 * (l.attn_norm.len() + l.ffn_norm.len()));
        self.embedding.size_bytes()
            + self.head.as_ref().map_or(0, Weight::size_bytes)
            + 4 * self.output_norm.len()
            + mats.sum::<usize>()
            + norms.sum::<usize>()
    }

    /// The output head (the embedding when tied).
    pub fn head(&self) -> &Weight {
        self.head.as_ref().unwrap_or(&self.embedding)
    }
}

/// Parses the GGUF header and metadata of `path`.
pub fn read_content(
    path: &Path,
) -> Result<(gguf_file::Content, std::io::BufReader<std::fs::File>), EngineError> {
    let file = std::fs::File::open(path)
        .map_err(|e| EngineError::model(format!("cannot open model file {}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::new(file);
    let content = gguf_file::Content::read(&mut reader)
        .map_err(|e| EngineError::model(format!("{} is not a readable GGUF file: {e}", path.display())))?;
    Ok((content, reader))
}

/// The block format a matrix gets at `tier`, given the format it is stored in.
/// The embedding (and a tied head) is the most precision-sensitive matrix, so the 4-bit tier
/// keeps it at 8 bits, as llama.cpp's quantizer does for the output tensor.
pub(super) fn target_format(tier: Tier, stored: GgmlDType, is_embedding: bool) -> Format {
    match tier {
        Tier::F32 => Format::F32,
        Tier::Q8_0 => Format::Q8_0,
        Tier::Q4_0 if is_embedding => Format::Q8_0,
        Tier::Q4_0 => Format::Q4_0,
        Tier::Native => match stored {
            GgmlDType::F32 => Format::F32,
            GgmlDType::Q4_0 => Format::Q4_0,
            GgmlDType::Q4_1 => Format::Q4_1,
            // F16/BF16 and formats without a kernel here run as 8-bit blocks.
            _ => Format::Q8_0,
        },
        // vLLM's precision classes: `Model::from_gguf` refuses them before any matrix.
        Tier::Bf16 | Tier::Fp16 | Tier::Fp8 | Tier::Int8 | Tier::Int4 => Format::F32,
    }
}

pub(super) fn ggml_dtype(format: Format) -> GgmlDType {
    match format {
        Format::F32 => GgmlDType::F32,
        Format::Q8_0 => GgmlDType::Q8_0,
        Format::Q4_0 => GgmlDType::Q4_0,
        Format::Q4_1 => GgmlDType::Q4_1,
    }
}

/// Converts a GGUF matrix (candle shape `(rows, cols)`) to a kernel [`Weight`] in `format`.
fn to_weight(name: &str, t: &QTensor, format: Format) -> Result<Weight, EngineError> {
    let (rows, cols) = t
        .shape()
        .dims2()
        .map_err(|_| EngineError::model(format!("`{name}` is not a matrix: {:?}", t.shape())))?;
    if format == Format::F32 {
        let values = t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        return Ok(Weight::from_f32(rows, cols, values));
    }
    let want = ggml_dtype(format);
    let bytes = if t.dtype() == want {
        t.data()?.into_owned()
    } else {
        let dense = t.dequantize(&Device::Cpu)?;
        QTensor::quantize(&dense, want)?.data()?.into_owned()
    };
    Ok(Weight::from_blocks(format, rows, cols, bytes))
}

fn to_vector(name: &str, t: &QTensor, len: usize) -> Result<Vec<f32>, EngineError> {
    let v = t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
    if v.len() != len {
        return Err(EngineError::model(format!("`{name}` has {} values, expected {len}", v.len())));
    }
    Ok(v)
}

/// Every tensor of the GGUF, by name, as stored (on the CPU).
pub(super) fn read_tensors(
    path: &Path,
    content: &gguf_file::Content,
    reader: &mut std::io::BufReader<std::fs::File>,
) -> Result<HashMap<String, QTensor>, EngineError> {
    let mut raw = HashMap::new();
    for name in content.tensor_infos.keys() {
        let t = content
            .tensor(reader, name, &Device::Cpu)
            .map_err(|e| EngineError::model(format!("{}: tensor `{name}`: {e}", path.display())))?;
        raw.insert(name.clone(), t);
    }
    Ok(raw)
}

/// Loads every parameter of the model in `path` at `tier`.
pub fn load_weights(
    path: &Path,
    content: &gguf_file::Content,
    reader: &mut std::io::BufReader<std::fs::File>,
    cfg: &LlamaConfig,
    tier: Tier,
) -> Result<Weights, EngineError> {
    // Read every tensor first (sequential file IO), then convert in parallel (CPU-bound).
    let raw = read_tensors(path, content, reader)?;
    let take = |name: &str| -> Result<&QTensor, EngineError> {
        raw.get(name).ok_or_else(|| EngineError::model(format!("{} has no tensor `{name}`", path.display())))
    };
    let matrix = |name: &str, embedding: bool| -> Result<Weight, EngineError> {
        let t = take(name)?;
        to_weight(name, t, target_format(tier, t.dtype(), embedding))
    };
    let d = cfg.embedding;
    let layers = crate::threads::pool().install(|| {
        (0..cfg.layers)
            .into_par_iter()
            .map(|i| {
                let p = |s: &str| format!("blk.{i}.{s}.weight");
                let stacked = |names: &[&str]| -> Result<Weight, EngineError> {
                    let parts = names.iter().map(|n| matrix(&p(n), false)).collect::<Result<Vec<_>, _>>()?;
                    Ok(Weight::concat_rows(&parts).prepared())
                };
                let layer = Layer {
                    attn_norm: to_vector(&p("attn_norm"), take(&p("attn_norm"))?, d)?,
                    qkv: stacked(&["attn_q", "attn_k", "attn_v"])?,
                    out: matrix(&p("attn_output"), false)?.prepared(),
                    ffn_norm: to_vector(&p("ffn_norm"), take(&p("ffn_norm"))?, d)?,
                    gate_up: stacked(&["ffn_gate", "ffn_up"])?,
                    down: matrix(&p("ffn_down"), false)?.prepared(),
                };
                check_layer(i, &layer, cfg)?;
                Ok(layer)
            })
            .collect::<Result<Vec<_>, EngineError>>()
    })?;
    let embedding = matrix("token_embd.weight", true)?.prepared();
    let head = if raw.contains_key("output.weight") {
        Some(matrix("output.weight", true)?.prepared())
    } else {
        None
    };
    if embedding.rows() != cfg.vocab_size || embedding.cols() != d {
        return Err(EngineError::model(format!(
            "token_embd is {}×{}, expected {}×{d}",
            embedding.rows(),
            embedding.cols(),
            cfg.vocab_size
        )));
    }
    Ok(Weights {
        embedding,
        head,
        output_norm: to_vector("output_norm", take("output_norm.weight")?, d)?,
        layers,
    })
}

fn check_layer(i: usize, l: &Layer, cfg: &LlamaConfig) -> Result<(), EngineError> {
    let qkv_rows = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim;
    let shapes = [
        ("attn_q/k/v", l.qkv.rows(), l.qkv.cols(), qkv_rows, cfg.embedding),
        ("attn_output", l.out.rows(), l.out.cols(), cfg.embedding, cfg.heads * cfg.head_dim),
        ("ffn_gate/up", l.gate_up.rows(), l.gate_up.cols(), 2 * cfg.feed_forward, cfg.embedding),
        ("ffn_down", l.down.rows(), l.down.cols(), cfg.embedding, cfg.feed_forward),
    ];
    for (name, r, c, want_r, want_c) in shapes {
        if (r, c) != (want_r, want_c) {
            return Err(EngineError::model(format!("blk.{i}.{name} is {r}×{c}, expected {want_r}×{want_c}")));
        }
    }
    Ok(())
}
