//! `out = x · Wᵀ` for a batch of activation rows, split across the thread pool by weight rows,
//! or, for a prompt chunk's many rows, by activation rows.
//!
//! Under [`BY_ACTIVATION_ROWS_MIN`] rows each task owns a contiguous range of weight rows and
//! computes them against every activation row, so each weight byte is read from memory once per
//! call however large the batch is. That is what makes batched decode nearly free on a
//! memory-bound CPU. From there on each task owns a block of activation rows and writes whole
//! rows of the output in place.

use super::quant::{Format, QActivations, Weight, quantize_activations, quantize_activations_on};
use super::{Isa, dot, isa, scalar};
use rayon::prelude::*;

/// Rows of `x` at or above which an f32 product goes to a GEMM (register-blocked and
/// compute-bound) instead of the row-streaming dot kernel (memory-bound, best for decode).
/// `pacer-engine bench --tier f32` shows streaming still ahead at 8 and 16 rows.
const F32_GEMM_MIN_ROWS: usize = 32;

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
        let kernel = isa();
        by_weight_rows(m, n, 1, out, |rows, local| {
            #[cfg(target_arch = "x86_64")]
            if kernel.has_avx2() {
                return super::x86::f32_rows(wf, k, rows, x, m, local);
            }
            let width = rows.len();
            for (li, r) in rows.enumerate() {
                let wr = &wf[r * k..(r + 1) * k];
                for i in 0..m {
                    local[i * width + li] = dot(&x[i * k..(i + 1) * k], wr);
                }
            }
        });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::amx::applies(w, m) {
        let mut qa = quantize_activations(x, m, k);
        super::amx::pad(&mut qa);
        super::amx::matmul(w, &qa, out);
        return;
    }
    let kernel = isa();
    if m >= BY_ACTIVATION_ROWS_MIN {
        return by_activation_rows(x, m, k, n, out, |qa, local| quantized_rows(kernel, w, 0..n, qa, local));
    }
    let qa = quantize_activations(x, m, k);
    let align = if w.interleaved() { 8 } else { 1 };
    by_weight_rows(m, n, align, out, |rows, local| quantized_rows(kernel, w, rows, &qa, local));
}

/// Activation rows at and above which a quantized matmul splits by activation rows rather than
/// by weight rows. A task then reads every weight, which a prompt chunk's many rows repay in
/// compute, and owns whole rows of `out`, so it writes them in place: the weight-row split
/// gives each task a zeroed buffer and copies it into `out` on one thread afterwards, which
/// was 6 % of a prefill. Batched decode stays below, where reading the weights once is what
/// counts.
const BY_ACTIVATION_ROWS_MIN: usize = 64;

/// Runs `f(qa, local)` over disjoint blocks of the `m` activation rows of `x` (`k` wide) in
/// parallel: each task quantizes its block and `f` writes the block's `n` outputs per row,
/// which are a contiguous run of `out`. Rows are computed alone whichever block they land in,
/// so the split changes no bit.
fn by_activation_rows<F>(x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32], f: F)
where
    F: Fn(&QActivations, &mut [f32]) + Sync,
{
    // Four blocks per thread, in whole tiles of the kernels' four activation rows, so a short
    // last block costs little.
    let per_task = m.div_ceil(rayon::current_num_threads() * 4).next_multiple_of(4);
    out.par_chunks_mut(per_task * n).zip(x.par_chunks(per_task * k)).for_each(|(local, x)| {
        let qa = quantize_activations_on(x, x.len() / k, k, false);
        f(&qa, local);
    });
}

/// Runs `f(rows, local)` over disjoint ranges of weight rows (starting at multiples of
/// `align`) in parallel; `local` holds the range's results as `m` runs of `rows.len()`
/// (`local[i * rows.len() + r]`), so each run is one contiguous copy into `out`.
fn by_weight_rows<F>(m: usize, n: usize, align: usize, out: &mut [f32], f: F)
where
    F: Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
{
    let threads = rayon::current_num_threads();
    // A few tasks per thread balance uneven cores without paying rayon's per-task cost on
    // the many tiny matmuls of a decode step.
    let tasks = (threads * 4).min(n.div_ceil(16)).max(1);
    let per_task = n.div_ceil(tasks).next_multiple_of(align);
    if m == 1 {
        // One row: a task's results are a contiguous run of `out`, so it writes them there
        // (no buffer per task, no copy): the step of a lone stream runs ~120 of these.
        out.par_chunks_mut(per_task).enumerate().for_each(|(t, local)| {
            let start = t * per_task;
            f(start..start + local.len(), local);
        });
        return;
    }
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
        let width = local.len() / m;
        if width == 0 {
            continue;
        }
        for (i, run) in local.chunks_exact(width).enumerate() {
            out[i * n + start..i * n + start + width].copy_from_slice(run);
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
        k if k.has_avx2() => super::x86::quantized_rows(w, rows, qa, local),
        _ => scalar::quantized_rows(w, rows, qa, local),
    }
}

/// f32 GEMM with the `gemm` crate (the kernel candle uses on CPU), on the same rayon pool.
fn gemm_f32(x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    let threads = rayon::current_num_threads();
    gemm_bt(m, w.rows(), w.cols(), x, w.floats(), out, threads > 1);
}

/// `out (m×n) = a (m×k) · bᵀ`, with `b` row-major `n×k`. Runs on the calling thread unless
/// `parallel`, in which case it splits across the current rayon pool.
#[allow(unsafe_code)]
pub fn gemm_bt(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], out: &mut [f32], parallel: bool) {
    assert!(a.len() == m * k && b.len() == n * k && out.len() == m * n, "gemm shapes");
    if m == 0 || n == 0 {
        return;
    }
    let par = match rayon::current_num_threads() {
        t if parallel && t > 1 => gemm::Parallelism::Rayon(t),
        _ => gemm::Parallelism::None,
    };
    // SAFETY: `a` is exactly m×k row-major (column stride 1, row stride k), `out` exactly m×n
    // row-major (1, n), and `b` exactly n×k row-major, read as the k×n matrix bᵀ (column
    // stride k, row stride 1), all asserted above, so every index gemm derives from these
    // shapes and strides is in bounds. `out` is exclusively borrowed: it cannot alias a or b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: impl Fn(usize, usize) -> f32) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b(kk, j)).sum();
            }
        }
        out
    }

    /// The one-row path writes each task's weight rows straight into `out`; it must give what
    /// the buffered path of a batch gives that row, bit for bit, for every format, with the
    /// rows laid out plainly and interleaved, and for row counts that leave a short last task.
    #[test]
    fn one_row_matches_its_row_of_a_batch_bit_for_bit() {
        use crate::kernels::testing::random_blocks;
        let k = 128;
        let x: Vec<f32> = (0..3 * k).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            for n in [8, 40, 136, 1000] {
                for w in
                    [random_blocks(format, n, k, n as u64), random_blocks(format, n, k, n as u64).prepared()]
                {
                    let mut one = vec![f32::NAN; n];
                    matmul(&x[..k], 1, &w, &mut one);
                    let mut three = vec![f32::NAN; 3 * n];
                    matmul(&x, 3, &w, &mut three);
                    let same = one.iter().zip(&three[..n]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} n={n} interleaved={}", w.interleaved());
                }
            }
        }
        let floats: Vec<f32> = (0..40 * k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0).collect();
        let w = Weight::from_f32(40, k, floats);
        let (mut one, mut three) = (vec![f32::NAN; 40], vec![f32::NAN; 120]);
        matmul(&x[..k], 1, &w, &mut one);
        matmul(&x, 3, &w, &mut three);
        assert!(one.iter().zip(&three[..40]).all(|(a, b)| a.to_bits() == b.to_bits()), "f32");
    }

    /// A prompt chunk's many rows split by activation rows (each task quantizes its block and
    /// writes whole rows of `out`); every row must come out as it does alone, bit for bit, for
    /// every format, plain and interleaved, with a short last block.
    #[test]
    fn many_rows_match_each_row_alone_bit_for_bit() {
        use crate::kernels::testing::random_blocks;
        let (k, m) = (128, BY_ACTIVATION_ROWS_MIN + 37);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            for n in [8, 136] {
                for w in
                    [random_blocks(format, n, k, n as u64), random_blocks(format, n, k, n as u64).prepared()]
                {
                    let mut many = vec![f32::NAN; m * n];
                    matmul(&x, m, &w, &mut many);
                    for i in [0, 1, 31, m / 2, m - 2, m - 1] {
                        let mut one = vec![f32::NAN; n];
                        matmul(&x[i * k..(i + 1) * k], 1, &w, &mut one);
                        let same = one
                            .iter()
                            .zip(&many[i * n..(i + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{format:?} n={n} row {i} interleaved={}", w.interleaved());
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_bt_matches_the_naive_product() {
        let (m, n, k) = (21, 13, 64);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
        let mut out = vec![0f32; m * n];
        gemm_bt(m, n, k, &a, &b, &mut out, false);
        let want = naive(m, n, k, &a, |kk, j| b[j * k + kk]);
        assert!(out.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-3), "gemm_bt");
    }
}
