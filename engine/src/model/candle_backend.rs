//! The candle backend: the same batched step as the CPU kernels ([`super::forward`]), on candle
//! tensors on any candle [`Device`] — a CUDA GPU with the `cuda` feature, or candle's CPU
//! device, where CI runs it on every change against the same references as the kernels.
//!
//! What stays the engine's own: the scheduler, the paged pool's block accounting (and prefix
//! cache), sampling, the tokenizer and the server. What this module owns:
//! - the weights as candle [`QMatMul`]s (quantized blocks on the device, in the tier's format)
//!   plus the f32 embedding table, norms and RoPE tables;
//! - the KV storage: one `(slots, kv_heads·head_dim)` tensor per layer for keys and one for
//!   values, where slot `block · 16 + i` is token `i` of pool block `block`. The step writes
//!   each sequence's new keys with `slice_set` (one call per run of slots inside a block) and
//!   reads a sequence's context with `index_select` over its block table;
//! - the step itself: every row (decode tokens and prompt chunks of different sequences at
//!   their own positions) shares each weight matmul; attention runs per sequence over that
//!   sequence's gathered keys with a causal mask for its own rows.

use super::config::LlamaConfig;
use super::kv::BLOCK_TOKENS;
use super::load::target_format;
use super::{ComputeDevice, Tier};
use crate::error::EngineError;
use crate::kernels::Format;
use candle_core::quantized::{QMatMul, QStorage, QTensor, gguf_file};
use candle_core::{D, DType, Device, Module, Tensor};
use std::path::Path;

/// The candle [`Device`] for `device` (`candle-cpu` or `cuda:N`).
pub(crate) fn candle_device(device: ComputeDevice) -> Result<Device, EngineError> {
    match device {
        ComputeDevice::Cpu | ComputeDevice::CandleCpu => Ok(Device::Cpu),
        ComputeDevice::Cuda(ordinal) => {
            if !cfg!(feature = "cuda") {
                return Err(EngineError::model(
                    "--device cuda needs a build with the `cuda` feature (cargo build --features cuda, or the CUDA image)",
                ));
            }
            Device::new_cuda(ordinal).map_err(|e| {
                // candle appends a backtrace when RUST_BACKTRACE is set; the first line is the error.
                let e = e.to_string();
                let e = e.lines().next().unwrap_or_default();
                EngineError::model(format!(
                    "CUDA device {ordinal} is not usable ({e}): is a GPU assigned to this process and its driver installed?"
                ))
            })
        }
    }
}

/// One transformer block's parameters on the device.
#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    q: QMatMul,
    k: QMatMul,
    v: QMatMul,
    out: QMatMul,
    ffn_norm: Tensor,
    gate: QMatMul,
    up: QMatMul,
    down: QMatMul,
}

/// Every parameter of the model on one candle device.
#[derive(Debug)]
pub(crate) struct CandleWeights {
    device: Device,
    /// `(vocab, embedding)`, f32: rows are gathered by token id.
    embedding: Tensor,
    head: QMatMul,
    output_norm: Tensor,
    layers: Vec<Layer>,
    /// `(context, head_dim / 2)` each.
    cos: Tensor,
    sin: Tensor,
    bytes: usize,
}

/// The KV pool's storage on the device, one keys and one values tensor per layer.
#[derive(Debug)]
pub(crate) struct DeviceKv {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
}

impl DeviceKv {
    /// Zeroed storage for `blocks` pool blocks of `cfg`'s model.
    pub(crate) fn new(cfg: &LlamaConfig, blocks: usize, device: &Device) -> Result<Self, EngineError> {
        let shape = (blocks * BLOCK_TOKENS, cfg.kv_heads * cfg.head_dim);
        let zeros = || Tensor::zeros(shape, DType::F32, device);
        Ok(DeviceKv {
            keys: (0..cfg.layers).map(|_| zeros()).collect::<Result<_, _>>()?,
            values: (0..cfg.layers).map(|_| zeros()).collect::<Result<_, _>>()?,
        })
    }
}

/// One sequence's rows in a step, as the backend sees them.
#[derive(Debug)]
pub(crate) struct SeqRows<'a> {
    /// The sequence's pool blocks, covering at least `start + rows`.
    pub table: &'a [u32],
    /// Position of the first new row (tokens already cached).
    pub start: usize,
    /// New rows (tokens) this step.
    pub rows: usize,
}

impl SeqRows<'_> {
    fn slot(&self, pos: usize) -> u32 {
        self.table[pos / BLOCK_TOKENS] * BLOCK_TOKENS as u32 + (pos % BLOCK_TOKENS) as u32
    }
}

fn qmatmul(t: QTensor, format: Format, device: &Device) -> Result<(QMatMul, usize), EngineError> {
    let want = super::load::ggml_dtype(format);
    let m = if format == Format::F32 {
        QMatMul::Tensor(t.dequantize(&Device::Cpu)?.to_device(device)?)
    } else if t.dtype() == want && t.device().same_device(device) {
        QMatMul::from_qtensor(t)?
    } else if t.dtype() == want {
        // Same blocks, other device: move the bytes as they are (no requantization).
        let shape = t.shape().clone();
        let storage = QStorage::from_data(t.data()?, device, want)?;
        QMatMul::from_qtensor(QTensor::new(storage, shape)?)?
    } else {
        QMatMul::from_qtensor(QTensor::quantize_onto(&t.dequantize(&Device::Cpu)?, want, device)?)?
    };
    let bytes = match &m {
        QMatMul::QTensor(q) => q.storage_size_in_bytes(),
        QMatMul::Tensor(w) | QMatMul::TensorF16(w) => w.elem_count() * w.dtype().size_in_bytes(),
    };
    Ok((m, bytes))
}

impl CandleWeights {
    /// Loads every parameter of `path` at `tier` onto `device`. Matrices get the same block
    /// format as on the CPU kernels ([`target_format`]), so a tier means the same numbers on
    /// both backends.
    pub(crate) fn load(
        path: &Path,
        content: &gguf_file::Content,
        reader: &mut std::io::BufReader<std::fs::File>,
        cfg: &LlamaConfig,
        tier: Tier,
        device: &Device,
    ) -> Result<Self, EngineError> {
        let mut raw = super::load::read_tensors(path, content, reader)?;
        let mut take = |name: &str| -> Result<QTensor, EngineError> {
            raw.remove(name)
                .ok_or_else(|| EngineError::model(format!("{} has no tensor `{name}`", path.display())))
        };
        let mut bytes = 0;
        let mut matrix = |t: QTensor, embedding: bool| -> Result<QMatMul, EngineError> {
            let format = target_format(tier, t.dtype(), embedding);
            let (m, b) = qmatmul(t, format, device)?;
            bytes += b;
            Ok(m)
        };
        let vector = |t: QTensor| -> Result<Tensor, EngineError> {
            Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_device(device)?)
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let mut p = |s: &str| take(&format!("blk.{i}.{s}.weight"));
            let (attn_norm, q, k, v, out) =
                (p("attn_norm")?, p("attn_q")?, p("attn_k")?, p("attn_v")?, p("attn_output")?);
            let (ffn_norm, gate, up, down) = (p("ffn_norm")?, p("ffn_gate")?, p("ffn_up")?, p("ffn_down")?);
            layers.push(Layer {
                attn_norm: vector(attn_norm)?,
                q: matrix(q, false)?,
                k: matrix(k, false)?,
                v: matrix(v, false)?,
                out: matrix(out, false)?,
                ffn_norm: vector(ffn_norm)?,
                gate: matrix(gate, false)?,
                up: matrix(up, false)?,
                down: matrix(down, false)?,
            });
        }
        let embd = take("token_embd.weight")?;
        let (vocab, d) = embd.shape().dims2()?;
        if (vocab, d) != (cfg.vocab_size, cfg.embedding) {
            return Err(EngineError::model(format!(
                "token_embd is {vocab}×{d}, expected {}×{}",
                cfg.vocab_size, cfg.embedding
            )));
        }
        // The embedding gathers rows through the tier's format, as the kernels do: dequantize
        // the tier's blocks, not the file's.
        let embd_format = target_format(tier, embd.dtype(), true);
        let dense = embd.dequantize(&Device::Cpu)?;
        let embedding = if embd_format == Format::F32 || embd.dtype() == super::load::ggml_dtype(embd_format)
        {
            dense.clone()
        } else {
            QTensor::quantize(&dense, super::load::ggml_dtype(embd_format))?.dequantize(&Device::Cpu)?
        };
        let output_norm = vector(take("output_norm.weight")?)?;
        let head = match take("output.weight") {
            Ok(h) => matrix(h, true)?,
            Err(_) => matrix(embd, true)?,
        };
        bytes += embedding.elem_count() * 4;
        let half = cfg.head_dim / 2;
        let (cos, sin) = super::rope_tables(cfg);
        Ok(CandleWeights {
            device: device.clone(),
            embedding: embedding.to_device(device)?,
            head,
            output_norm,
            layers,
            cos: Tensor::from_vec(cos, (cfg.context_length, half), device)?,
            sin: Tensor::from_vec(sin, (cfg.context_length, half), device)?,
            bytes,
        })
    }

    /// Bytes the parameters take on the device.
    pub(crate) fn size_bytes(&self) -> usize {
        self.bytes
    }

    /// The device the parameters live on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Runs one step: `tokens` are the rows of `seqs` in order; returns the logits of the
    /// `wanted` rows, `wanted.len() × vocab`. The KV of every row is written before attention
    /// reads it, so a row sees its own key.
    pub(crate) fn step(
        &self,
        cfg: &LlamaConfig,
        kv: &DeviceKv,
        seqs: &[SeqRows<'_>],
        tokens: &[u32],
        wanted: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        let dev = &self.device;
        let (hd, nh, nkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let rows = tokens.len();
        let positions: Vec<u32> =
            seqs.iter().flat_map(|s| (s.start..s.start + s.rows).map(|p| p as u32)).collect();
        let pos = Tensor::from_vec(positions, rows, dev)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;
        // Runs of consecutive slots (a sequence's new rows inside one block): one write each.
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (first row, rows, first slot)
        let mut row = 0;
        for s in seqs {
            for p in s.start..s.start + s.rows {
                let slot = s.slot(p) as usize;
                match runs.last_mut() {
                    Some((r0, n, s0)) if *r0 + *n == row && *s0 + *n == slot => *n += 1,
                    _ => runs.push((row, 1, slot)),
                }
                row += 1;
            }
        }
        // Per sequence: the slots of its whole visible context and, for a chunk of several
        // rows, the causal mask of those rows over it.
        let mut contexts = Vec::with_capacity(seqs.len());
        for s in seqs {
            let end = s.start + s.rows;
            let slots: Vec<u32> = (0..end).map(|p| s.slot(p)).collect();
            let ids = Tensor::from_vec(slots, end, dev)?;
            let mask = if s.rows > 1 {
                let m: Vec<f32> = (0..s.rows)
                    .flat_map(|i| {
                        (0..end).map(move |j| if j <= s.start + i { 0.0 } else { f32::NEG_INFINITY })
                    })
                    .collect();
                Some(Tensor::from_vec(m, (s.rows, end), dev)?)
            } else {
                None
            };
            contexts.push((ids, mask));
        }

        let ids = Tensor::from_vec(tokens.to_vec(), rows, dev)?;
        let mut x = self.embedding.index_select(&ids, 0)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, cfg.rms_eps)?;
            let q = rope(&layer.q.forward(&h)?, nh, hd, &cos, &sin)?;
            let k = rope(&layer.k.forward(&h)?, nkv, hd, &cos, &sin)?;
            let v = layer.v.forward(&h)?.contiguous()?;
            for &(r0, n, slot) in &runs {
                kv.keys[li].slice_set(&k.narrow(0, r0, n)?.contiguous()?, 0, slot)?;
                kv.values[li].slice_set(&v.narrow(0, r0, n)?.contiguous()?, 0, slot)?;
            }
            let mut outs = Vec::with_capacity(seqs.len());
            let mut first = 0;
            for (s, (ids, mask)) in seqs.iter().zip(&contexts) {
                let qs = q.narrow(0, first, s.rows)?;
                let keys = kv.keys[li].index_select(ids, 0)?;
                let values = kv.values[li].index_select(ids, 0)?;
                outs.push(attend(&qs, &keys, &values, mask.as_ref(), (nh, nkv, hd), scale)?);
                first += s.rows;
            }
            let attn = Tensor::cat(&outs, 0)?;
            x = (x + layer.out.forward(&attn)?)?;
            let h = rms_norm(&x, &layer.ffn_norm, cfg.rms_eps)?;
            let act = (layer.gate.forward(&h)?.silu()? * layer.up.forward(&h)?)?;
            x = (x + layer.down.forward(&act)?)?;
        }
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let last = x.index_select(&Tensor::from_vec(wanted.to_vec(), wanted.len(), dev)?, 0)?;
        let last = rms_norm(&last, &self.output_norm, cfg.rms_eps)?;
        let logits = self.head.forward(&last)?;
        Ok(logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// `x · w / sqrt(mean(x²) + eps)` per row.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + f64::from(eps))?.sqrt()?)?.broadcast_mul(w)
}

/// Rotates each head's pairs `(x[2i], x[2i+1])` by the row's angle `i` (llama's RoPE on the
/// GGUF's pre-permuted q/k, as [`crate::kernels::rope_in_place`]); `x` is `(rows, heads·hd)`.
fn rope(x: &Tensor, heads: usize, hd: usize, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let rows = x.dim(0)?;
    let half = hd / 2;
    let x = x.reshape((rows, heads, half, 2))?;
    let (a, b) = (x.narrow(3, 0, 1)?, x.narrow(3, 1, 1)?);
    let c = cos.reshape((rows, 1, half, 1))?;
    let s = sin.reshape((rows, 1, half, 1))?;
    let ra = (a.broadcast_mul(&c)? - b.broadcast_mul(&s)?)?;
    let rb = (a.broadcast_mul(&s)? + b.broadcast_mul(&c)?)?;
    Tensor::cat(&[ra, rb], 3)?.reshape((rows, heads * hd))
}

/// Grouped-query attention of one sequence's `q` rows `(n, nh·hd)` over its context
/// `keys`/`values` `(end, nkv·hd)`; `mask` `(n, end)` hides the future of each row when the
/// sequence has several rows. Returns `(n, nh·hd)`.
fn attend(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: Option<&Tensor>,
    (nh, nkv, hd): (usize, usize, usize),
    scale: f64,
) -> candle_core::Result<Tensor> {
    let n = q.dim(0)?;
    let end = keys.dim(0)?;
    let group = nh / nkv;
    // (end, nkv·hd) → (nh, end, hd), each KV head repeated for its `group` query heads.
    let heads = |t: &Tensor| -> candle_core::Result<Tensor> {
        t.reshape((end, nkv, 1, hd))?
            .broadcast_as((end, nkv, group, hd))?
            .reshape((end, nh, hd))?
            .transpose(0, 1)?
            .contiguous()
    };
    let (k, v) = (heads(keys)?, heads(values)?);
    let q = q.reshape((n, nh, hd))?.transpose(0, 1)?.contiguous()?;
    let mut scores = (q.matmul(&k.t()?)? * scale)?;
    if let Some(m) = mask {
        scores = scores.broadcast_add(m)?;
    }
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(0, 1)?.reshape((n, nh * hd))
}
