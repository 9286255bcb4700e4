//! Portable quantized dot products: the fallback on CPUs without AVX2, and the reference the
//! SIMD kernels are tested against.

use super::BLOCK;
use super::quant::{Format, QActivations, Weight, q4_fields};

/// Computes weight rows `rows` against every row of `qa` into `local[i * rows.len() + r_local]`.
pub(crate) fn quantized_rows(w: &Weight, rows: std::ops::Range<usize>, qa: &QActivations, local: &mut [f32]) {
    assert!(!w.interleaved(), "interleaved weights are only built for the AVX2 kernels");
    let m = qa.rows;
    let nb = w.cols() / BLOCK;
    let bb = w.format().block_bytes();
    let width = rows.len();
    for (li, r) in rows.enumerate() {
        let wrow = &w.blocks()[r * w.row_bytes()..(r + 1) * w.row_bytes()];
        for i in 0..m {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = &wrow[b * bb..(b + 1) * bb];
                let a = &qa.q[(i * nb + b) * BLOCK..(i * nb + b + 1) * BLOCK];
                let (da, sa) = (qa.d[i * nb + b], qa.s[i * nb + b]);
                acc += block_dot(w.format(), blk, a, da, sa);
            }
            local[i * width + li] = acc;
        }
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One weight block against one activation block (scale `da`, scaled sum `sa`).
fn block_dot(format: Format, blk: &[u8], a: &[i8], da: f32, sa: f32) -> f32 {
    match format {
        Format::Q8_0 => {
            let isum: i32 = blk[2..34].iter().zip(a).map(|(&w, &x)| i32::from(w as i8) * i32::from(x)).sum();
            f16_at(blk, 0) * da * isum as f32
        }
        Format::Q4_0 | Format::Q4_1 => {
            let (d, m, qs) = q4_fields(format, blk);
            let mut isum = 0i32;
            for (j, &q) in qs.iter().enumerate() {
                isum += i32::from(q & 0x0f) * i32::from(a[j]) + i32::from(q >> 4) * i32::from(a[j + 16]);
            }
            // Σ (d·q + m)·(da·a) = d·da·Σq·a + m·(da·Σa)
            d * da * isum as f32 + m * sa
        }
        Format::F32 => unreachable!("f32 weights take the float path"),
    }
}
