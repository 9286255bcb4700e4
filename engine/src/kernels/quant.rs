//! Weight storage formats and the quantization of activation rows to 8-bit blocks.
//!
//! Quantized weights keep GGML's block layout byte for byte (so a GGUF tensor is used as read,
//! without repacking): `q8_0` = f16 scale + 32 × i8, `q4_0` = f16 scale + 16 bytes of nibbles,
//! `q4_1` = f16 scale + f16 min + 16 bytes of nibbles. In a 4-bit block, byte j holds element j in
//! its low nibble and element j + 16 in its high nibble.

use super::BLOCK;
use half::f16;

/// Storage format of a weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Plain f32.
    F32,
    /// 8-bit blocks with one scale (34 bytes per 32 values).
    Q8_0,
    /// 4-bit blocks with one scale, values `d * (q - 8)` (18 bytes per 32 values).
    Q4_0,
    /// 4-bit blocks with scale and minimum, values `d * q + m` (20 bytes per 32 values).
    Q4_1,
}

impl Format {
    /// Bytes per block of [`BLOCK`] values (f32: 4 bytes per value).
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4 * BLOCK,
            Format::Q8_0 => 34,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
        }
    }

    /// GGML's name for the format.
    pub const fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Q8_0 => "q8_0",
            Format::Q4_0 => "q4_0",
            Format::Q4_1 => "q4_1",
        }
    }
}

/// A weight matrix of `rows` output features by `cols` input features, row-major, each row a
/// run of blocks (quantized) or of f32 values.
#[derive(Debug, Clone)]
pub struct Weight {
    format: Format,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    floats: Vec<f32>,
    /// `bytes` is in the 8-row interleaved layout (see `interleave.rs`), not GGML's.
    interleaved: bool,
}

impl Weight {
    /// Wraps f32 values (`rows * cols` of them).
    pub fn from_f32(rows: usize, cols: usize, floats: Vec<f32>) -> Self {
        assert_eq!(floats.len(), rows * cols, "f32 weight size");
        Weight { format: Format::F32, rows, cols, bytes: Vec::new(), floats, interleaved: false }
    }

    /// Wraps raw GGML blocks. `cols` must be a multiple of [`BLOCK`].
    pub fn from_blocks(format: Format, rows: usize, cols: usize, bytes: Vec<u8>) -> Self {
        assert!(format != Format::F32 && cols.is_multiple_of(BLOCK), "block weight shape");
        assert_eq!(bytes.len(), rows * cols / BLOCK * format.block_bytes(), "block weight size");
        Weight { format, rows, cols, bytes, floats: Vec::new(), interleaved: false }
    }

    /// Stacks matrices with the same format and column count into one (more rows), so that
    /// projections that read the same input (q/k/v, gate/up) run as one matmul.
    pub fn concat_rows(parts: &[Weight]) -> Self {
        let first = &parts[0];
        assert!(parts.iter().all(|p| p.format == first.format && p.cols == first.cols && !p.interleaved));
        let rows = parts.iter().map(|p| p.rows).sum();
        Weight {
            format: first.format,
            rows,
            cols: first.cols,
            bytes: parts.iter().flat_map(|p| p.bytes.iter().copied()).collect(),
            floats: parts.iter().flat_map(|p| p.floats.iter().copied()).collect(),
            interleaved: false,
        }
    }

    /// Puts the matrix in the layout the fastest available kernel wants: block matrices whose
    /// rows come in groups of eight are interleaved when the AVX2 kernels run (8-bit ones only
    /// with VNNI).
    pub fn prepared(self) -> Self {
        let isa = super::isa();
        let kernel = match self.format {
            Format::Q4_0 | Format::Q4_1 => isa.has_avx2(),
            // The 8-bit record needs vpdpbusd (u8 × i8 into i32); maddubs would saturate.
            Format::Q8_0 => isa.has_vnni(),
            Format::F32 => false,
        };
        let wants = kernel && self.rows.is_multiple_of(super::interleave::GROUP) && !self.interleaved;
        if !wants {
            return self;
        }
        let bytes = super::interleave::interleave(self.format, self.rows, self.cols, &self.bytes);
        Weight { bytes, interleaved: true, ..self }
    }

    /// Whether the blocks are in the 8-row interleaved layout.
    pub(crate) fn interleaved(&self) -> bool {
        self.interleaved
    }

    /// Storage format.
    pub fn format(&self) -> Format {
        self.format
    }
    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes the matrix occupies in memory.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len() + 4 * self.floats.len()
    }
    /// Raw blocks (empty for f32).
    pub(crate) fn blocks(&self) -> &[u8] {
        &self.bytes
    }
    /// f32 values (empty for block formats).
    pub(crate) fn floats(&self) -> &[f32] {
        &self.floats
    }

    /// Bytes of one row of blocks.
    pub(crate) fn row_bytes(&self) -> usize {
        self.cols / BLOCK * self.format.block_bytes()
    }

    /// Dequantizes row `r` into `out` (length `cols`): the embedding lookup of a tied head.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols);
        if self.format == Format::F32 {
            out.copy_from_slice(&self.floats[r * self.cols..(r + 1) * self.cols]);
            return;
        }
        if self.interleaved {
            super::interleave::dequantize_row(self.format, self.cols, &self.bytes, r, out);
            return;
        }
        let row = &self.bytes[r * self.row_bytes()..(r + 1) * self.row_bytes()];
        for (blk, dst) in row.chunks_exact(self.format.block_bytes()).zip(out.chunks_exact_mut(BLOCK)) {
            dequantize_block(self.format, blk, dst);
        }
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale `d`, offset `m` (value = d·q + m; q4_0's is −8·d) and the 16 nibble bytes of a GGML
/// q4_0 or q4_1 block.
pub(crate) fn q4_fields(format: Format, blk: &[u8]) -> (f32, f32, &[u8]) {
    let d = f16_at(blk, 0);
    match format {
        Format::Q4_1 => (d, f16_at(blk, 2), &blk[4..20]),
        _ => (d, -8.0 * d, &blk[2..18]),
    }
}

/// Dequantizes one GGML block into 32 f32 values.
pub(crate) fn dequantize_block(format: Format, blk: &[u8], dst: &mut [f32]) {
    match format {
        Format::F32 => unreachable!("f32 has no blocks"),
        Format::Q8_0 => {
            let d = f16_at(blk, 0);
            for (o, &q) in dst.iter_mut().zip(&blk[2..34]) {
                *o = d * f32::from(q as i8);
            }
        }
        Format::Q4_0 | Format::Q4_1 => {
            let (d, m, qs) = q4_fields(format, blk);
            for (j, &q) in qs.iter().enumerate() {
                dst[j] = d * f32::from(q & 0x0f) + m;
                dst[j + 16] = d * f32::from(q >> 4) + m;
            }
        }
    }
}

/// Activation rows quantized to 8-bit blocks, the other operand of a quantized matmul.
/// For each block: `q` (32 × i8), scale `d`, and `s = d * Σq` (used by formats with an offset).
#[derive(Debug, Default)]
pub struct QActivations {
    /// Rows.
    pub rows: usize,
    /// Values per row (a multiple of [`BLOCK`]).
    pub cols: usize,
    /// `rows * cols` quantized values.
    pub q: Vec<i8>,
    /// `rows * cols / BLOCK` scales.
    pub d: Vec<f32>,
    /// `rows * cols / BLOCK` scaled sums.
    pub s: Vec<f32>,
}

/// Quantizes `rows` rows of `cols` f32 values (row-major in `x`) to 8-bit blocks; a prefill's
/// many rows are split across the compute pool (serially this was a tenth of a long prefill).
pub fn quantize_activations(x: &[f32], rows: usize, cols: usize) -> QActivations {
    quantize_activations_on(x, rows, cols, rows >= 8)
}

/// [`quantize_activations`], split across the pool only if `parallel` (a task of a parallel
/// matmul quantizes its own rows on its own thread).
pub(crate) fn quantize_activations_on(x: &[f32], rows: usize, cols: usize, parallel: bool) -> QActivations {
    use rayon::prelude::*;
    assert!(cols.is_multiple_of(BLOCK) && x.len() == rows * cols);
    let nb = cols / BLOCK;
    let mut out = QActivations {
        rows,
        cols,
        q: vec![0; rows * cols],
        d: vec![0.0; rows * nb],
        s: vec![0.0; rows * nb],
    };
    let work = |(((q, d), s), x): RowParts<'_>| quantize_row(x, q, d, s);
    if parallel {
        let rows_out = out.q.par_chunks_mut(cols).zip(out.d.par_chunks_mut(nb)).zip(out.s.par_chunks_mut(nb));
        rows_out.zip(x.par_chunks(cols)).for_each(work);
    } else {
        let rows_out = out.q.chunks_mut(cols).zip(out.d.chunks_mut(nb)).zip(out.s.chunks_mut(nb));
        rows_out.zip(x.chunks(cols)).for_each(work);
    }
    out
}

/// A row's quantized values, scales and scaled sums, with its input.
type RowParts<'a> = (((&'a mut [i8], &'a mut [f32]), &'a mut [f32]), &'a [f32]);

/// One row: per block of 32, scale `d = max|x| / 127`, `q = round(x / d)` (ties to even),
/// `s = d · Σq`. With AVX2 the explicit vector version in `x86.rs` runs (the compiler's
/// vectorization of the loop below stored the bytes one by one: a tenth of an AMX prefill);
/// it gives the same bits.
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::isa().has_avx2() {
        return super::x86::quantize_row(x, q, d, s);
    }
    quantize_row_portable(x, q, d, s);
}

/// [`quantize_row`] in portable Rust: the reference for the AVX2 version, and the path of CPUs
/// without AVX2.
pub(crate) fn quantize_row_portable(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((src, dst), d), s) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(d).zip(s) {
        let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in dst.iter_mut().zip(src) {
            let i = (v * inv).round_ties_even() as i32;
            *o = i as i8;
            sum += i;
        }
        *d = scale;
        *s = scale * sum as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_block_layout_low_then_high_nibbles() {
        let mut blk = vec![0u8; 18];
        blk[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        blk[2] = 0x9a; // element 0 = 0xa - 8 = 2, element 16 = 0x9 - 8 = 1
        let mut out = [0f32; 32];
        dequantize_block(Format::Q4_0, &blk, &mut out);
        assert_eq!(out[0], 1.0);
        assert_eq!(out[16], 0.5);
        assert_eq!(out[1], -4.0);
    }

    #[test]
    fn activation_quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        let qa = quantize_activations(&x, 2, 32);
        for (i, &v) in x.iter().enumerate() {
            let d = qa.d[i / BLOCK];
            assert!((f32::from(qa.q[i]) * d - v).abs() <= d * 0.5 + 1e-6);
        }
        let sum: i32 = qa.q[..32].iter().map(|&q| i32::from(q)).sum();
        assert!((qa.s[0] - qa.d[0] * sum as f32).abs() < 1e-5);
    }
}
