//! `out = x · Wᵀ` for a batch of activation rows, split across the thread pool by weight rows.
//!
//! Each task owns a contiguous range of weight rows and computes them against every activation
//! row, so each weight byte is read from memory once per call however large the batch is. That
//! is what makes batched decode nearly free on a memory-bound CPU.

use super::quant::{Format, QActivations, Weight, quantize_activations};
use super::{Isa, dot, isa, scalar};
use rayon::prelude::*;

/// Rows of `x` at or above which an f32 product goes to a GEMM (register-blocked and
/// compute-bound) instead of the row-streaming dot kernel (memory-bound, best for decode).
const F32_GEMM_MIN_ROWS: usize = 8;

/// `out[i][j] = Σ_k x[i][k] · W[j][k]` for `m` rows of `x` (row-major, `w.cols()` wide);
/// `out` is row-major `m × w.rows()`.
pub fn matmul(x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    let (n, k) = (w.rows(), w.cols());
    assert_eq!(x.len(), m * k, "matmul input shape");
    assert_eq!(out.len(), m * n, "matmul output shape");
    if m == 0 {
        return;
    }
    if w.format() == Format::F32 {
        if m >= F32_GEMM_MIN_ROWS {
            gemm_f32(x, m, w, out);
            return;
        }
        let wf = w.floats();
        by_weight_rows(m, n, out, |rows, local| {
            for (li, r) in rows.enumerate() {
                let wr = &wf[r * k..(r + 1) * k];
                for i in 0..m {
                    local[li * m + i] = dot(&x[i * k..(i + 1) * k], wr);
                }
            }
        });
        return;
    }
    let qa = quantize_activations(x, m, k);
    let kernel = isa();
    by_weight_rows(m, n, out, |rows, local| quantized_rows(kernel, w, rows, &qa, local));
}

/// Runs `f(rows, local)` over disjoint ranges of weight rows in parallel; `local` holds the
/// range's results weight-row-major (`local[r * m + i]`), scattered into `out` afterwards.
fn by_weight_rows<F>(m: usize, n: usize, out: &mut [f32], f: F)
where
    F: Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
{
    let threads = rayon::current_num_threads();
    // A few tasks per thread balance uneven cores without paying rayon's per-task cost on
    // the many tiny matmuls of a decode step.
    let tasks = (threads * 4).min(n.div_ceil(16)).max(1);
    let per_task = n.div_ceil(tasks);
    let parts: Vec<(usize, Vec<f32>)> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let start = t * per_task;
            let end = ((t + 1) * per_task).min(n);
            let mut local = vec![0f32; end.saturating_sub(start) * m];
            if start < end {
                f(start..end, &mut local);
            }
            (start, local)
        })
        .collect();
    for (start, local) in parts {
        for (lr, vals) in local.chunks_exact(m).enumerate() {
            for (i, &v) in vals.iter().enumerate() {
                out[i * n + start + lr] = v;
            }
        }
    }
}

fn quantized_rows(
    kernel: Isa,
    w: &Weight,
    rows: std::ops::Range<usize>,
    qa: &QActivations,
    local: &mut [f32],
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => super::x86::quantized_rows(w, rows, qa, local),
        _ => scalar::quantized_rows(w, rows, qa, local),
    }
}

/// f32 GEMM with the `gemm` crate (the kernel candle uses on CPU), on the same rayon pool.
#[allow(unsafe_code)]
fn gemm_f32(x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    let (n, k) = (w.rows(), w.cols());
    let wf = w.floats();
    assert!(x.len() == m * k && wf.len() == n * k && out.len() == m * n);
    let threads = rayon::current_num_threads();
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the three slices are exactly m×k (x, row-major), n×k (W, row-major, read as the
    // k×n matrix Wᵀ with row stride 1 and column stride k) and m×n (out, row-major), as asserted
    // above, so every index gemm computes from these shapes and strides is in bounds; `out`
    // is exclusively borrowed and does not alias the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            wf.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

