//! Unit tests of `x86.rs`.

use super::super::quant::quantize_activations;
use super::super::testing::random_blocks;
use super::super::{isa, scalar};
use super::*;

#[test]
fn the_avx2_activation_quantizer_gives_the_portable_bits() {
    if !isa().has_avx2() {
        return;
    }
    let cols = 4 * BLOCK;
    // Mixed magnitudes and signs, a zero block, and a block whose scale is 1 with values
    // halfway between integers (ties, which go to even).
    let mut x: Vec<f32> = (0..cols).map(|i| ((i * 7919 % 509) as f32 - 254.0) / 3.0).collect();
    x[BLOCK..2 * BLOCK].fill(0.0);
    for (i, v) in x[2 * BLOCK..3 * BLOCK].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
    }
    let nb = cols / BLOCK;
    let (mut q1, mut d1, mut s1) = (vec![0i8; cols], vec![0f32; nb], vec![0f32; nb]);
    let (mut q2, mut d2, mut s2) = (vec![0i8; cols], vec![0f32; nb], vec![0f32; nb]);
    quantize_row(&x, &mut q1, &mut d1, &mut s1);
    super::super::quant::quantize_row_portable(&x, &mut q2, &mut d2, &mut s2);
    assert_eq!(q1, q2);
    assert_eq!(
        d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        d2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        s1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        s2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn f32_rows_match_plain_dot_products() {
    if !isa().has_avx2() {
        return;
    }
    let (rows, k, m) = (5, 70, 3);
    let w: Vec<f32> = (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 11 % 29) as f32 - 14.0) / 7.0).collect();
    let mut local = vec![0f32; rows * m];
    f32_rows(&w, k, 0..rows, &x, m, &mut local);
    for r in 0..rows {
        for i in 0..m {
            let want: f32 = (0..k).map(|j| w[r * k + j] * x[i * k + j]).sum();
            assert!((local[i * rows + r] - want).abs() < 1e-3, "row {r} act {i}");
        }
    }
}

/// The product forms of [`tile_x8_body`] this CPU can run.
fn product_forms() -> Vec<u8> {
    let mut forms = vec![DP_MADDUBS];
    if std::arch::is_x86_feature_detected!("avxvnni") {
        forms.push(DP_VEX);
    }
    if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl") {
        forms.push(DP_EVEX);
    }
    forms
}

#[test]
fn avx2_matches_scalar_for_every_format_and_tile_remainder() {
    if !isa().has_avx2() {
        eprintln!("no AVX2 on this CPU: the scalar kernels are the only path here");
        return;
    }
    let (rows, cols) = (16, 96);
    for format in [Format::Q8_0, Format::Q4_0, Format::Q4_1] {
        let w = random_blocks(format, rows, cols, 42);
        for m in 1..=9 {
            let x: Vec<f32> = (0..m * cols).map(|i| ((i * 7919 % 251) as f32 - 125.0) / 37.0).collect();
            let qa = quantize_activations(&x, m, cols);
            let mut a = vec![0f32; rows * m];
            let mut b = vec![0f32; rows * m];
            quantized_rows(&w, 0..rows, &qa, &mut a);
            scalar::quantized_rows(&w, 0..rows, &qa, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{format:?} m={m}: {x} vs {y}");
            }
            // The interleaved layout (4-bit only) gives the same products, in two halves
            // as the thread pool would split them.
            let wx = w.clone().prepared();
            if wx.interleaved() {
                // Every product form this CPU has: all give the same bits.
                let mut first: Option<Vec<f32>> = None;
                for dp in product_forms().into_iter().filter(|&dp| format != Format::Q8_0 || dp != DP_MADDUBS)
                {
                    let (mut lo, mut hi) = (vec![0f32; 8 * m], vec![0f32; (rows - 8) * m]);
                    // SAFETY: AVX2 was detected above, and `product_forms` the rest.
                    unsafe {
                        rows_avx2(&wx, 0..8, &qa, &mut lo, dp);
                        rows_avx2(&wx, 8..rows, &qa, &mut hi, dp);
                    }
                    let both: Vec<f32> = lo.iter().chain(&hi).copied().collect();
                    match &first {
                        None => first = Some(both),
                        Some(f) => assert!(
                            f.iter().zip(&both).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{format:?} m={m}: product form {dp} differs from the first"
                        ),
                    }
                    for i in 0..m {
                        let row =
                            lo[i * 8..(i + 1) * 8].iter().chain(&hi[i * (rows - 8)..(i + 1) * (rows - 8)]);
                        for (x, y) in row.zip(&b[i * rows..(i + 1) * rows]) {
                            assert!(
                                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                                "interleaved {format:?} m={m} form {dp}: {x} vs {y}"
                            );
                        }
                    }
                }
                let (mut r1, mut r2) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    w.dequantize_row(r, &mut r1);
                    wx.dequantize_row(r, &mut r2);
                    assert_eq!(r1, r2, "interleaved dequantization of row {r}");
                }
            }
        }
    }
}
