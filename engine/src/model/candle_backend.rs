//! The candle backend: the same batched step as the CPU kernels ([`super::forward`]), on candle
//! tensors on any candle [`Device`] — a CUDA GPU with the `cuda` feature, or candle's CPU
//! device, where CI runs it on every change against the same references as the kernels.
//!
//! What stays the engine's own: the scheduler, the paged pool's block accounting (and prefix
//! cache), sampling, the tokenizer and the server. What this module owns:
//! - the weights as candle [`QMatMul`]s (quantized blocks on the device, in the tier's format),
//!   with Q|K|V and gate|up each fused into one matrix at load (their rows concatenated, so
//!   one matmul each), plus the f32 embedding table, norms and RoPE tables;
//! - the KV storage: one `(slots, 2·kv_heads·head_dim)` tensor per layer, keys then values in
//!   each row, where slot `block · 16 + i` is token `i` of pool block `block`;
//! - the step, whose number of candle ops does not grow with the batch (a GPU step is bound by
//!   kernel launches long before it is bound by arithmetic): every row (decode tokens and
//!   prompt chunks of different sequences at their own positions) shares each weight matmul;
//!   RoPE turns every row's q and k heads in one call at their own positions; one scatter per
//!   layer writes every new row's keys and values into its slot; attention runs once per group
//!   of sequences (decode rows apart from prompt chunks, and by their context's power-of-two
//!   class: a handful of groups whatever the batch), each over its sequences' contexts gathered
//!   by one `index_select` from their block tables, padded to a multiple of [`CONTEXT_BUCKET`]
//!   keys (so shapes repeat from step to step) and masked (causally within a chunk, and past
//!   each sequence's end); each RMSNorm and each layer's RoPE is one fused op ([`super::candle_ops`]).
use super::candle_ops::{rms_norm, rope};
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

/// Keys of a group's contexts are padded to a multiple of this (shapes repeat from step to
/// step, as a GPU's kernels and allocator want; masked keys cost arithmetic, not launches).
pub(crate) const CONTEXT_BUCKET: usize = 64;
/// A chunk group's rows are padded to a multiple of this.
const ROW_BUCKET: usize = 16;

/// Matrices applied to the same input, as one matmul where their blocks allow.
#[derive(Debug)]
enum Projection {
    /// One matrix whose output columns are the parts' outputs, in order, of these widths.
    Fused(QMatMul, Vec<usize>),
    /// The parts' own matrices (their block formats differ, so their rows cannot be joined).
    Split(Vec<QMatMul>),
}

impl Projection {
    /// The output of each part, `(rows, width)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        match self {
            Projection::Fused(m, widths) => {
                let y = m.forward(x)?;
                let mut at = 0;
                widths
                    .iter()
                    .map(|w| {
                        let part = y.narrow(1, at, *w);
                        at += w;
                        part
                    })
                    .collect()
            }
            Projection::Split(ms) => ms.iter().map(|m| m.forward(x)).collect(),
        }
    }

    /// The output of the parts side by side, `(rows, Σ width)`.
    fn forward_joined(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Projection::Fused(m, _) => m.forward(x),
            Projection::Split(ms) => {
                Tensor::cat(&ms.iter().map(|m| m.forward(x)).collect::<candle_core::Result<Vec<_>>>()?, 1)
            }
        }
    }
}

/// One transformer block's parameters on the device.
#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    /// Q | K | V.
    qkv: Projection,
    out: QMatMul,
    ffn_norm: Tensor,
    /// gate | up.
    gate_up: Projection,
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

/// The KV pool's storage on the device: per layer one `(slots, 2·kv_heads·head_dim)` tensor,
/// a slot's keys then its values, so one scatter writes both and one gather reads both.
#[derive(Debug)]
pub(crate) struct DeviceKv {
    layers: Vec<Tensor>,
    /// f16 on a GPU (half the memory and the bandwidth of a context read), f32 elsewhere; the
    /// attention arithmetic is f32 either way.
    dtype: DType,
}

impl DeviceKv {
    /// Zeroed storage for `blocks` pool blocks of `cfg`'s model, in [`kv_dtype`]`(device)`.
    pub(crate) fn new(cfg: &LlamaConfig, blocks: usize, device: &Device) -> Result<Self, EngineError> {
        Self::with_dtype(cfg, blocks, device, kv_dtype(device))
    }

    /// The same in `dtype`.
    fn with_dtype(
        cfg: &LlamaConfig,
        blocks: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, EngineError> {
        let shape = (blocks * BLOCK_TOKENS, 2 * cfg.kv_heads * cfg.head_dim);
        Ok(DeviceKv {
            layers: (0..cfg.layers).map(|_| Tensor::zeros(shape, dtype, device)).collect::<Result<_, _>>()?,
            dtype,
        })
    }
}

/// The KV cache's element type on `device`: f16 on CUDA, f32 (the reference) on the CPU.
pub(crate) fn kv_dtype(device: &Device) -> DType {
    if device.is_cuda() { DType::F16 } else { DType::F32 }
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

/// A matrix in its tier's format, still in host memory.
enum HostMatrix {
    /// Quantized blocks, row after row (boxed: with the `cuda` feature a `QTensor` is far larger
    /// than a `Tensor`).
    Blocks(Box<QTensor>),
    /// Dense f32 (the `f32` tier).
    Dense(Tensor),
}

impl HostMatrix {
    /// `t` in `format`: dense for `f32`, the file's blocks when they already are `format`'s, else
    /// requantized from their f32 values (as the CPU kernels load it).
    fn new(t: QTensor, format: Format) -> Result<HostMatrix, EngineError> {
        let want = super::load::ggml_dtype(format);
        Ok(if format == Format::F32 {
            HostMatrix::Dense(t.dequantize(&Device::Cpu)?)
        } else if t.dtype() == want {
            HostMatrix::Blocks(Box::new(t))
        } else {
            HostMatrix::Blocks(Box::new(QTensor::quantize(&t.dequantize(&Device::Cpu)?, want)?))
        })
    }

    /// `(rows, columns)`.
    fn dims(&self) -> Result<(usize, usize), EngineError> {
        Ok(match self {
            HostMatrix::Blocks(t) => t.shape().dims2()?,
            HostMatrix::Dense(t) => t.dims2()?,
        })
    }

    /// The parts' rows one after the other, when their formats and widths agree: a quantized
    /// matrix is its rows' blocks in order, so joining the bytes joins the rows.
    fn join(parts: &[HostMatrix]) -> Result<Option<HostMatrix>, EngineError> {
        let columns = parts.iter().map(|p| p.dims().map(|d| d.1)).collect::<Result<Vec<_>, _>>()?;
        if columns.windows(2).any(|w| w[0] != w[1]) {
            return Ok(None);
        }
        let rows: usize = parts.iter().map(|p| p.dims().map(|d| d.0)).sum::<Result<usize, _>>()?;
        match parts {
            [HostMatrix::Dense(_), ..] => {
                let dense: Option<Vec<&Tensor>> =
                    parts.iter().map(|p| if let HostMatrix::Dense(t) = p { Some(t) } else { None }).collect();
                Ok(dense.map(|d| Tensor::cat(&d, 0)).transpose()?.map(HostMatrix::Dense))
            }
            [HostMatrix::Blocks(first), ..] => {
                let dtype = first.dtype();
                let mut bytes = Vec::new();
                for p in parts {
                    match p {
                        HostMatrix::Blocks(t) if t.dtype() == dtype => bytes.extend_from_slice(&t.data()?),
                        _ => return Ok(None),
                    }
                }
                let storage = QStorage::from_data(std::borrow::Cow::Owned(bytes), &Device::Cpu, dtype)?;
                Ok(Some(HostMatrix::Blocks(Box::new(QTensor::new(storage, (rows, columns[0]))?))))
            }
            [] => Ok(None),
        }
    }

    /// The matrix on `device`, and the bytes it takes there.
    fn place(self, device: &Device) -> Result<(QMatMul, usize), EngineError> {
        let m = match self {
            HostMatrix::Dense(t) => QMatMul::Tensor(t.to_device(device)?),
            HostMatrix::Blocks(t) if t.device().same_device(device) => QMatMul::from_qtensor(*t)?,
            HostMatrix::Blocks(t) => {
                // Same blocks, other device: move the bytes as they are.
                let (shape, dtype) = (t.shape().clone(), t.dtype());
                let storage = QStorage::from_data(t.data()?, device, dtype)?;
                QMatMul::from_qtensor(QTensor::new(storage, shape)?)?
            }
        };
        let bytes = match &m {
            QMatMul::QTensor(q) => q.storage_size_in_bytes(),
            QMatMul::Tensor(w) | QMatMul::TensorF16(w) => w.elem_count() * w.dtype().size_in_bytes(),
        };
        Ok((m, bytes))
    }
}

/// `t` at `tier` on `device`, and its bytes there.
fn matrix(t: QTensor, tier: Tier, embedding: bool, device: &Device) -> Result<(QMatMul, usize), EngineError> {
    let format = target_format(tier, t.dtype(), embedding);
    HostMatrix::new(t, format)?.place(device)
}

/// `parts` (matrices applied to one input) at `tier` on `device`, fused where their formats
/// allow, and their bytes there.
fn projection(parts: Vec<QTensor>, tier: Tier, device: &Device) -> Result<(Projection, usize), EngineError> {
    let host = parts
        .into_iter()
        .map(|t| {
            let format = target_format(tier, t.dtype(), false);
            HostMatrix::new(t, format)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let widths = host.iter().map(|h| h.dims().map(|d| d.0)).collect::<Result<Vec<_>, _>>()?;
    if let Some(joined) = HostMatrix::join(&host)? {
        let (m, bytes) = joined.place(device)?;
        return Ok((Projection::Fused(m, widths), bytes));
    }
    let (mut ms, mut bytes) = (Vec::with_capacity(host.len()), 0);
    for h in host {
        let (m, b) = h.place(device)?;
        bytes += b;
        ms.push(m);
    }
    Ok((Projection::Split(ms), bytes))
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
        let vector = |t: QTensor| -> Result<Tensor, EngineError> {
            Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_device(device)?)
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let mut p = |s: &str| take(&format!("blk.{i}.{s}.weight"));
            let (attn_norm, q, k, v, out) =
                (p("attn_norm")?, p("attn_q")?, p("attn_k")?, p("attn_v")?, p("attn_output")?);
            let (ffn_norm, gate, up, down) = (p("ffn_norm")?, p("ffn_gate")?, p("ffn_up")?, p("ffn_down")?);
            let (qkv, b1) = projection(vec![q, k, v], tier, device)?;
            let (gate_up, b2) = projection(vec![gate, up], tier, device)?;
            let (out, b3) = matrix(out, tier, false, device)?;
            let (down, b4) = matrix(down, tier, false, device)?;
            bytes += b1 + b2 + b3 + b4;
            layers.push(Layer {
                attn_norm: vector(attn_norm)?,
                qkv,
                out,
                ffn_norm: vector(ffn_norm)?,
                gate_up,
                down,
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
        let (head, b) = match take("output.weight") {
            Ok(h) => matrix(h, tier, true, device)?,
            Err(_) => matrix(embd, tier, true, device)?,
        };
        bytes += b;
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
        match self.step_logits(cfg, kv, seqs, tokens, wanted)? {
            Some(logits) => Ok(logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
            None => Ok(Vec::new()),
        }
    }

    /// [`Self::step`]'s logits as a tensor on the device (`None` when no row wants them).
    fn step_logits(
        &self,
        cfg: &LlamaConfig,
        kv: &DeviceKv,
        seqs: &[SeqRows<'_>],
        tokens: &[u32],
        wanted: &[u32],
    ) -> Result<Option<Tensor>, EngineError> {
        let dev = &self.device;
        let (hd, nh, nkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let kv_width = nkv * hd;
        let rows = tokens.len();
        let mut positions = Vec::with_capacity(rows);
        let mut slots = Vec::with_capacity(rows);
        for s in seqs {
            for p in s.start..s.start + s.rows {
                positions.push(p as u32);
                slots.push(s.slot(p));
            }
        }
        let pos = Tensor::from_vec(positions, rows, dev)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;
        // Each row's slot across its keys and values: one scatter per layer writes them all.
        let slot_ids =
            Tensor::from_vec(slots, (rows, 1), dev)?.broadcast_as((rows, 2 * kv_width))?.contiguous()?;
        let plan = Attention::plan(seqs, dev)?;

        let ids = Tensor::from_vec(tokens.to_vec(), rows, dev)?;
        let mut x = self.embedding.index_select(&ids, 0)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, cfg.rms_eps)?;
            let qkv = layer.qkv.forward_joined(&h)?;
            // q and k heads side by side turn in one call, each row at its own position.
            let qk = rope(&qkv.narrow(1, 0, (nh + nkv) * hd)?, nh + nkv, hd, &cos, &sin)?;
            let q = qk.narrow(1, 0, nh * hd)?.contiguous()?;
            let new_kv = Tensor::cat(
                &[qk.narrow(1, nh * hd, kv_width)?, qkv.narrow(1, (nh + nkv) * hd, kv_width)?],
                1,
            )?;
            kv.layers[li].scatter_set(&slot_ids, &new_kv.to_dtype(kv.dtype)?, 0)?;
            let attn = plan.attend(&q, &kv.layers[li], (nh, nkv, hd), scale)?;
            x = (x + layer.out.forward(&attn)?)?;
            let h = rms_norm(&x, &layer.ffn_norm, cfg.rms_eps)?;
            let gu = layer.gate_up.forward(&h)?;
            x = (x + layer.down.forward(&(gu[0].silu()? * &gu[1])?)?)?;
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let last = x.index_select(&Tensor::from_vec(wanted.to_vec(), wanted.len(), dev)?, 0)?;
        let last = rms_norm(&last, &self.output_norm, cfg.rms_eps)?;
        Ok(Some(self.head.forward(&last)?))
    }
}

/// Sequences attended in one batched call: each with its rows padded to `rows` and its context
/// to `keys`.
#[derive(Debug)]
struct Group {
    seqs: usize,
    rows: usize,
    keys: usize,
    /// `(seqs · rows)`: the step row each padded row reads (padding repeats a sequence's first).
    query_rows: Tensor,
    /// `(seqs · keys)`: the slot of each context position (padding reads the first).
    context: Tensor,
    /// `(seqs, rows, keys)`: 0 where a row may look, −∞ where it may not (its future, padding).
    mask: Tensor,
}

/// How one step's attention runs: groups of decode rows (one row per sequence) and of prompt
/// chunks, each for one class of context length, and where each step row's output lands.
#[derive(Debug)]
struct Attention {
    groups: Vec<Group>,
    /// `(rows)`: for each step row, its row in the groups' outputs laid end to end.
    order: Tensor,
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to).max(1) * to
}

impl Attention {
    fn plan(seqs: &[SeqRows<'_>], dev: &Device) -> candle_core::Result<Attention> {
        let mut firsts = Vec::with_capacity(seqs.len());
        let mut first = 0;
        for s in seqs {
            firsts.push(first);
            first += s.rows;
        }
        let mut order = vec![0u32; first];
        let mut groups = Vec::new();
        let mut laid = 0;
        // Decode rows apart from prompt chunks (whose rows are padded), and each by its context's
        // power-of-two class, so a long context does not pad every short one to its length: at
        // most twice the keys read, and a handful of groups whatever the batch.
        let mut by_class: std::collections::BTreeMap<(bool, u32), Vec<usize>> = Default::default();
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.rows > 0) {
            let class = (s.start + s.rows).div_ceil(CONTEXT_BUCKET).next_power_of_two().trailing_zeros();
            by_class.entry((s.rows > 1, class)).or_default().push(i);
        }
        for ((chunked, _), members) in by_class {
            let rows = if chunked {
                round_up(members.iter().map(|&i| seqs[i].rows).max().unwrap_or(1), ROW_BUCKET)
            } else {
                1
            };
            let keys = round_up(
                members.iter().map(|&i| seqs[i].start + seqs[i].rows).max().unwrap_or(1),
                CONTEXT_BUCKET,
            );
            let n = members.len();
            let mut query_rows = Vec::with_capacity(n * rows);
            let mut context = Vec::with_capacity(n * keys);
            let mut mask = Vec::with_capacity(n * rows * keys);
            for (k, &i) in members.iter().enumerate() {
                let s = &seqs[i];
                let end = s.start + s.rows;
                for r in 0..rows {
                    let real = r < s.rows;
                    query_rows.push((firsts[i] + if real { r } else { 0 }) as u32);
                    if real {
                        order[firsts[i] + r] = (laid + k * rows + r) as u32;
                    }
                    let sees = s.start + if real { r } else { 0 };
                    mask.extend((0..keys).map(|j| if j <= sees { 0f32 } else { f32::NEG_INFINITY }));
                }
                context.extend((0..keys).map(|j| s.slot(if j < end { j } else { 0 })));
            }
            groups.push(Group {
                seqs: n,
                rows,
                keys,
                query_rows: Tensor::from_vec(query_rows, n * rows, dev)?,
                context: Tensor::from_vec(context, n * keys, dev)?,
                mask: Tensor::from_vec(mask, (n, rows, keys), dev)?,
            });
            laid += n * rows;
        }
        let order = Tensor::from_vec(order, first, dev)?;
        Ok(Attention { groups, order })
    }

    /// Grouped-query attention of every row's `q` `(rows, nh·hd)` over its sequence's context in
    /// `layer_kv` `(slots, 2·nkv·hd)`. Returns `(rows, nh·hd)`.
    fn attend(
        &self,
        q: &Tensor,
        layer_kv: &Tensor,
        (nh, nkv, hd): (usize, usize, usize),
        scale: f64,
    ) -> candle_core::Result<Tensor> {
        let group = nh / nkv;
        let mut outs = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let (s, r, l) = (g.seqs, g.rows, g.keys);
            // (s·l, 2·nkv·hd) → keys and values (s·nkv, l, hd).
            let ctx =
                layer_kv.index_select(&g.context, 0)?.to_dtype(DType::F32)?.reshape((s, l, 2, nkv, hd))?;
            let part = |which: usize| -> candle_core::Result<Tensor> {
                ctx.narrow(2, which, 1)?.squeeze(2)?.permute((0, 2, 1, 3))?.contiguous()?.reshape((
                    s * nkv,
                    l,
                    hd,
                ))
            };
            let (k, v) = (part(0)?, part(1)?);
            // (s·r, nh·hd) → (s·nkv, r·group, hd): the query heads that share a KV head together.
            let qs = q
                .index_select(&g.query_rows, 0)?
                .reshape((s, r, nkv, group, hd))?
                .permute((0, 2, 1, 3, 4))?
                .contiguous()?
                .reshape((s * nkv, r * group, hd))?;
            let scores = (qs.matmul(&k.t()?)? * scale)?
                .reshape((s, nkv, r, group, l))?
                .broadcast_add(&g.mask.reshape((s, 1, r, 1, l))?)?;
            let max = scores.max_keepdim(D::Minus1)?;
            let e = scores.broadcast_sub(&max)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.reshape((s * nkv, r * group, l))?;
            let o = p.matmul(&v)?.reshape((s, nkv, r, group, hd))?.permute((0, 2, 1, 3, 4))?;
            outs.push(o.contiguous()?.reshape((s * r, nh * hd))?);
        }
        let all = match outs.len() {
            0 => return Ok(q.clone()),
            1 => outs.remove(0),
            _ => Tensor::cat(&outs, 0)?,
        };
        all.index_select(&self.order, 0)
    }
}

#[cfg(test)]
mod tests;
