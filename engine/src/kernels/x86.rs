//! AVX2 quantized matmul kernels (x86-64 with AVX2, FMA and F16C, detected at run time).
//!
//! For each weight block the kernel loads (and for 4-bit formats unpacks) the 32 weights once,
//! then multiplies them with the same block of up to [`TILE`] activation rows: `maddubs` forms
//! u8×i8 pair sums, `madd` widens to i32, and one FMA per row applies the two block scales.
//! 4-bit weights are used unsigned (0..15) and the offset (`-8·d` or the stored minimum) is
//! applied once per block through the activation block's precomputed `d·Σa`. Where the CPU has
//! `vpdpbusd` on 256-bit registers (AVX-VNNI's VEX encoding, or AVX512-VNNI's EVEX one with
//! AVX512-VL), the interleaved kernel sums u8×i8 products into i32 with it instead: the same
//! integers, one instruction for three.
#![allow(unsafe_code)]

use super::BLOCK;
use super::interleave::{GROUP, record_bytes};
use super::quant::{Format, QActivations, Weight};
use std::arch::x86_64::*;

/// Activation rows multiplied per loaded weight block. Four keeps accumulators, the weight
/// vector and temporaries within the 16 AVX2 registers.
const TILE: usize = 4;

/// How far ahead of the block being multiplied the weight stream is prefetched. Without it the
/// loop waits on each cache line in turn, which more than halves single-thread decode; a few
/// hundred bytes cover the memory latency at the rate one core consumes blocks.
const PREFETCH_BYTES: usize = 4096;

#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint; it never faults, even for addresses past the allocation,
    // and `wrapping_add` keeps the pointer arithmetic itself defined.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES).cast()) }
}

/// Computes weight rows `rows` against every row of `qa` into `local[i * rows.len() + r_local]`.
pub(crate) fn quantized_rows(w: &Weight, rows: std::ops::Range<usize>, qa: &QActivations, local: &mut [f32]) {
    let nb = w.cols() / BLOCK;
    let m = qa.rows;
    // These bounds make every pointer offset below in range: a weight row is `nb` blocks of
    // `block_bytes`, activation row i spans q[i*nb*32 ..], d/s[i*nb ..] for nb blocks.
    assert!(qa.cols == w.cols() && qa.q.len() == m * nb * BLOCK && qa.d.len() == m * nb);
    assert!(qa.s.len() == m * nb && rows.end <= w.rows() && local.len() >= rows.len() * m);
    assert!(super::isa().has_avx2(), "AVX2 kernels need AVX2, FMA and F16C");
    // SAFETY: `isa()` returns Avx2 only after run-time detection of avx2, fma and f16c.
    unsafe { rows_avx2(w, rows, qa, local, products(super::isa())) }
}

/// The product form ([`DP_MADDUBS`], [`DP_VEX`] or [`DP_EVEX`]) of a kernel set.
fn products(isa: super::Isa) -> u8 {
    match isa {
        super::Isa::Avx2Vnni => DP_VEX,
        super::Isa::Avx512Vnni => DP_EVEX,
        _ => DP_MADDUBS,
    }
}

/// Computes weight rows `rows` against every row of `qa` (see [`quantized_rows`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (and the features [`dpbusd`] names for `dp`), and the
/// shapes must be
/// those [`quantized_rows`] asserts: `qa.cols == w.cols()`, `qa.q`/`qa.d`/`qa.s` hold
/// `qa.rows` rows of `w.cols() / BLOCK` blocks, `rows.end <= w.rows()` and
/// `local.len() >= rows.len() * qa.rows`. The tile kernels read blocks unchecked on these
/// bounds.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(w: &Weight, rows: std::ops::Range<usize>, qa: &QActivations, local: &mut [f32], dp: u8) {
    if w.interleaved() {
        // SAFETY: this function's own contract is `rows_x8`'s.
        return unsafe { rows_x8(w, rows, qa, local, dp) };
    }
    let m = qa.rows;
    let row_bytes = w.row_bytes();
    let width = rows.len();
    for (li, r) in rows.enumerate() {
        let wrow = &w.blocks()[r * row_bytes..(r + 1) * row_bytes];
        let mut i = 0;
        while i < m {
            let t = (m - i).min(TILE);
            let mut res = [0f32; TILE];
            match (w.format(), t) {
                (Format::Q8_0, 4) => tile_q8::<4>(wrow, qa, i, &mut res),
                (Format::Q8_0, 3) => tile_q8::<3>(wrow, qa, i, &mut res),
                (Format::Q8_0, 2) => tile_q8::<2>(wrow, qa, i, &mut res),
                (Format::Q8_0, _) => tile_q8::<1>(wrow, qa, i, &mut res),
                (Format::Q4_0, 4) => tile_q4::<4, false>(wrow, qa, i, &mut res),
                (Format::Q4_0, 3) => tile_q4::<3, false>(wrow, qa, i, &mut res),
                (Format::Q4_0, 2) => tile_q4::<2, false>(wrow, qa, i, &mut res),
                (Format::Q4_0, _) => tile_q4::<1, false>(wrow, qa, i, &mut res),
                (Format::Q4_1, 4) => tile_q4::<4, true>(wrow, qa, i, &mut res),
                (Format::Q4_1, 3) => tile_q4::<3, true>(wrow, qa, i, &mut res),
                (Format::Q4_1, 2) => tile_q4::<2, true>(wrow, qa, i, &mut res),
                (Format::Q4_1, _) => tile_q4::<1, true>(wrow, qa, i, &mut res),
                (Format::F32, _) => unreachable!("f32 weights take the float path"),
            }
            for (tt, &v) in res[..t].iter().enumerate() {
                local[(i + tt) * width + li] = v;
            }
            i += t;
        }
    }
}

/// The f16 at `p`, widened.
///
/// # Safety
/// `p` must point to two readable bytes (a block's f16 scale), and the CPU must have F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_to_f32(p: *const u8) -> f32 {
    // SAFETY: the caller passes a pointer to two readable bytes.
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `T` activation rows from `i0` against one q8_0 weight row.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q8<const T: usize>(wrow: &[u8], qa: &QActivations, i0: usize, out: &mut [f32; TILE]) {
    let nb = qa.cols / BLOCK;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: block b of the row is bytes [b*34, b*34+34) of `wrow` (asserted row length);
        // activation block (i0+t, b) is in bounds of q/d for t < T ≤ m - i0.
        unsafe {
            let blk = wrow.as_ptr().add(b * 34);
            prefetch(blk);
            let dw = f16_to_f32(blk);
            let wv = _mm256_loadu_si256(blk.add(2).cast());
            // maddubs wants u8 × i8: move the weight's sign onto the activation.
            let wabs = _mm256_sign_epi8(wv, wv);
            for (t, acc) in acc.iter_mut().enumerate() {
                let idx = (i0 + t) * nb + b;
                let av = _mm256_loadu_si256(qa.q.as_ptr().add(idx * BLOCK).cast());
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av, wv)), ones);
                let scale = _mm256_set1_ps(dw * *qa.d.get_unchecked(idx));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, *acc);
            }
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
}

/// `T` activation rows from `i0` against one q4_0 (`MIN = false`) or q4_1 weight row.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q4<const T: usize, const MIN: bool>(
    wrow: &[u8],
    qa: &QActivations,
    i0: usize,
    out: &mut [f32; TILE],
) {
    let nb = qa.cols / BLOCK;
    let (bb, qs_at) = if MIN { (20, 4) } else { (18, 2) };
    let ones = _mm256_set1_epi16(1);
    let low = _mm_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut offset = [0f32; T];
    for b in 0..nb {
        // SAFETY: as in `tile_q8`, with 18- or 20-byte blocks.
        unsafe {
            let blk = wrow.as_ptr().add(b * bb);
            prefetch(blk);
            let dw = f16_to_f32(blk);
            let mw = if MIN { f16_to_f32(blk.add(2)) } else { -8.0 * dw };
            let packed = _mm_loadu_si128(blk.add(qs_at).cast());
            let lo = _mm_and_si128(packed, low);
            let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
            let wv = _mm256_set_m128i(hi, lo);
            for t in 0..T {
                let idx = (i0 + t) * nb + b;
                let av = _mm256_loadu_si256(qa.q.as_ptr().add(idx * BLOCK).cast());
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
                let scale = _mm256_set1_ps(dw * *qa.d.get_unchecked(idx));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[t]);
                offset[t] += mw * *qa.s.get_unchecked(idx);
            }
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]) + offset[t];
    }
}

/// Interleaved 4-bit weights: eight rows per record, results straight in vector lanes.
///
/// # Safety
/// As for [`rows_avx2`], with `w` interleaved (8-row groups, `rows` on group bounds).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_x8(w: &Weight, rows: std::ops::Range<usize>, qa: &QActivations, local: &mut [f32], dp: u8) {
    assert!(
        rows.start.is_multiple_of(GROUP) && rows.end.is_multiple_of(GROUP),
        "row ranges follow the 8-row groups"
    );
    assert!(dp != DP_MADDUBS || w.format() != Format::Q8_0, "interleaved q8_0 is only built for VNNI");
    let m = qa.rows;
    let nb = qa.cols / BLOCK;
    let rec = record_bytes(w.format());
    let width = rows.len();
    for g in rows.start / GROUP..rows.end / GROUP {
        let group = &w.blocks()[g * nb * rec..(g + 1) * nb * rec];
        let first = g * GROUP - rows.start;
        let mut i = 0;
        while i < m {
            let t = (m - i).min(TILE);
            let mut res = [[0f32; GROUP]; TILE];
            let format = w.format();
            if dp == DP_VEX {
                // SAFETY: callers pass `DP_VEX` only when run-time detection found AVX-VNNI.
                unsafe { tile_x8_vnni_dispatch(format, t, group, qa, i, &mut res) };
            } else if dp == DP_EVEX {
                // SAFETY: callers pass `DP_EVEX` only when detection found AVX512-VNNI and -VL.
                unsafe { tile_x8_vnni512_dispatch(format, t, group, qa, i, &mut res) };
            } else {
                match (format == Format::Q4_1, t) {
                    (true, 4) => tile_x8::<4, true>(group, qa, i, &mut res),
                    (true, 3) => tile_x8::<3, true>(group, qa, i, &mut res),
                    (true, 2) => tile_x8::<2, true>(group, qa, i, &mut res),
                    (true, _) => tile_x8::<1, true>(group, qa, i, &mut res),
                    (false, 4) => tile_x8::<4, false>(group, qa, i, &mut res),
                    (false, 3) => tile_x8::<3, false>(group, qa, i, &mut res),
                    (false, 2) => tile_x8::<2, false>(group, qa, i, &mut res),
                    (false, _) => tile_x8::<1, false>(group, qa, i, &mut res),
                }
            }
            for (tt, lanes) in res[..t].iter().enumerate() {
                let at = (i + tt) * width + first;
                local[at..at + GROUP].copy_from_slice(lanes);
            }
            i += t;
        }
    }
}

/// Defines a dispatcher over record kinds and tile heights for one `vpdpbusd` encoding: the
/// two differ only in the target features that [`tile_x8_body`] is compiled with.
macro_rules! vnni_dispatch {
    ($(#[$attr:meta])* $name:ident, $features:literal, $dp:expr) => {
        $(#[$attr])*
        #[target_feature(enable = $features)]
        fn $name(
            format: Format,
            t: usize,
            group: &[u8],
            qa: &QActivations,
            i: usize,
            res: &mut [[f32; GROUP]; TILE],
        ) {
            use {KIND_Q4_0 as A, KIND_Q4_1 as B, KIND_Q8_0 as C};
            const D: u8 = $dp;
            // SAFETY (all arms): this function's own target features include the body's.
            unsafe {
                match (format, t) {
                    (Format::Q4_1, 4) => tile_x8_body::<4, B, D>(group, qa, i, res),
                    (Format::Q4_1, 3) => tile_x8_body::<3, B, D>(group, qa, i, res),
                    (Format::Q4_1, 2) => tile_x8_body::<2, B, D>(group, qa, i, res),
                    (Format::Q4_1, _) => tile_x8_body::<1, B, D>(group, qa, i, res),
                    (Format::Q8_0, 4) => tile_x8_body::<4, C, D>(group, qa, i, res),
                    (Format::Q8_0, 3) => tile_x8_body::<3, C, D>(group, qa, i, res),
                    (Format::Q8_0, 2) => tile_x8_body::<2, C, D>(group, qa, i, res),
                    (Format::Q8_0, _) => tile_x8_body::<1, C, D>(group, qa, i, res),
                    (_, 4) => tile_x8_body::<4, A, D>(group, qa, i, res),
                    (_, 3) => tile_x8_body::<3, A, D>(group, qa, i, res),
                    (_, 2) => tile_x8_body::<2, A, D>(group, qa, i, res),
                    (_, _) => tile_x8_body::<1, A, D>(group, qa, i, res),
                }
            }
        }
    };
}

vnni_dispatch!(
    /// [`tile_x8_body`] with AVX-VNNI's (VEX) `vpdpbusd`.
    tile_x8_vnni_dispatch,
    "avx2,fma,f16c,avxvnni",
    DP_VEX
);
vnni_dispatch!(
    /// [`tile_x8_body`] with AVX512-VNNI's (EVEX) `vpdpbusd` on 256-bit registers.
    tile_x8_vnni512_dispatch,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    DP_EVEX
);

/// How [`tile_x8_body`] forms u8 × i8 products: `maddubs` pairs summed as i16, or `vpdpbusd`
/// into i32 in AVX-VNNI's or AVX512-VNNI's encoding (the same operation, so the same bits).
const DP_MADDUBS: u8 = 0;
const DP_VEX: u8 = 1;
const DP_EVEX: u8 = 2;

/// `vpdpbusd` in the encoding `DP` names.
///
/// # Safety
/// Only inlined into callers that enable avxvnni (`DP_VEX`) or avx512vnni and avx512vl
/// (`DP_EVEX`).
#[inline(always)]
unsafe fn dpbusd<const DP: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: the caller's target features are this function's contract.
    unsafe { if DP == DP_EVEX { _mm256_dpbusd_epi32(acc, u, s) } else { _mm256_dpbusd_avx_epi32(acc, u, s) } }
}

/// Record kinds of [`tile_x8_body`].
const KIND_Q4_0: u8 = 0;
const KIND_Q4_1: u8 = 1;
const KIND_Q8_0: u8 = 2;

/// The AVX2 (no VNNI) instance of [`tile_x8_body`].
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_x8<const T: usize, const MIN: bool>(
    group: &[u8],
    qa: &QActivations,
    i0: usize,
    res: &mut [[f32; GROUP]; TILE],
) {
    let kind = if MIN { KIND_Q4_1 } else { KIND_Q4_0 };
    // SAFETY: this function's target features are the body's with `DP_MADDUBS`.
    unsafe {
        if kind == KIND_Q4_1 {
            tile_x8_body::<T, KIND_Q4_1, DP_MADDUBS>(group, qa, i0, res)
        } else {
            tile_x8_body::<T, KIND_Q4_0, DP_MADDUBS>(group, qa, i0, res)
        }
    }
}

/// `T` activation rows from `i0` against one 8-row group of record kind `KIND`.
/// Per block, the four nibble chunks give the eight quads of all eight rows. Without VNNI the
/// products are summed as i16 across the block (at most 8 pair sums of 15·127·2 = 3810: no
/// overflow) and widened once; with VNNI `vpdpbusd` accumulates i32 directly. q8_0 records
/// (VNNI only) hold eight unsigned chunks, value + 128. Then each row is scaled by d·da and
/// the offset m·(da·Σa) is added (m = −8·d, the stored minimum, or −128·d).
///
/// # Safety
/// Only inlined into callers that enable avx2, fma, f16c, and the features [`dpbusd`] names
/// unless `DP` is `DP_MADDUBS` (which `KIND_Q8_0` cannot use).
#[inline(always)]
unsafe fn tile_x8_body<const T: usize, const KIND: u8, const DP: u8>(
    group: &[u8],
    qa: &QActivations,
    i0: usize,
    res: &mut [[f32; GROUP]; TILE],
) {
    let nb = qa.cols / BLOCK;
    let format = match KIND {
        KIND_Q4_1 => Format::Q4_1,
        KIND_Q8_0 => Format::Q8_0,
        _ => Format::Q4_0,
    };
    let rec = record_bytes(format);
    let qs_at = if KIND == KIND_Q8_0 { 16 } else { rec - 128 };
    // SAFETY: the CPU features are the caller's contract; record b spans bytes
    // [b*rec, (b+1)*rec) of `group` (nb records); activation block (i0+t, b) is in bounds for
    // t < T ≤ m - i0 (asserted by `quantized_rows`); res[t] holds 8 f32s.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let r = group.as_ptr().add(b * rec);
            prefetch(r);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(r.cast()));
            let mv = match KIND {
                KIND_Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(r.add(16).cast())),
                KIND_Q8_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-128.0)),
                _ => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
            };
            let mut sums = [_mm256_setzero_si256(); T];
            if KIND == KIND_Q8_0 {
                for c in 0..8 {
                    let w = _mm256_loadu_si256(r.add(qs_at + 32 * c).cast());
                    for (t, s) in sums.iter_mut().enumerate() {
                        let a = qa.q.as_ptr().add(((i0 + t) * nb + b) * BLOCK + 4 * c);
                        *s = dpbusd::<DP>(*s, w, _mm256_set1_epi32(a.cast::<i32>().read_unaligned()));
                    }
                }
            }
            for c in 0..(if KIND == KIND_Q8_0 { 0 } else { 4 }) {
                let chunk = _mm256_loadu_si256(r.add(qs_at + 32 * c).cast());
                let w_lo = _mm256_and_si256(chunk, low);
                let w_hi = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low);
                for (t, s) in sums.iter_mut().enumerate() {
                    let a = qa.q.as_ptr().add(((i0 + t) * nb + b) * BLOCK);
                    let a_lo = _mm256_set1_epi32(a.add(4 * c).cast::<i32>().read_unaligned());
                    let a_hi = _mm256_set1_epi32(a.add(4 * (c + 4)).cast::<i32>().read_unaligned());
                    if DP != DP_MADDUBS {
                        *s = dpbusd::<DP>(*s, w_lo, a_lo);
                        *s = dpbusd::<DP>(*s, w_hi, a_hi);
                    } else {
                        *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(w_lo, a_lo));
                        *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(w_hi, a_hi));
                    }
                }
            }
            for (t, acc) in acc.iter_mut().enumerate() {
                let idx = (i0 + t) * nb + b;
                let wide = if DP != DP_MADDUBS { sums[t] } else { _mm256_madd_epi16(sums[t], ones) };
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(*qa.d.get_unchecked(idx)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), scale, *acc);
                *acc = _mm256_fmadd_ps(mv, _mm256_set1_ps(*qa.s.get_unchecked(idx)), *acc);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(res[t].as_mut_ptr(), acc[t]);
        }
    }
}

/// One row of activations to 8-bit blocks, as `quant::quantize_row_portable` computes them,
/// bit for bit: the block's largest magnitude (max is exact in any order), `d = amax / 127`,
/// `q = round(x · (1/d))` under the default round-to-nearest-even (`cvtps2dq`), packed with
/// saturation (|q| ≤ 127, so nothing saturates), and `s = d · Σq` over exact i32 sums.
pub(crate) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    assert!(x.len() == q.len() && x.len() == d.len() * BLOCK && d.len() == s.len());
    assert!(super::isa().has_avx2(), "AVX2 kernels need AVX2, FMA and F16C");
    // SAFETY: AVX2 was detected at run time (`isa()`); block b spans [32b, 32b+32) of x and q.
    unsafe { quantize_row_avx2(x, q, d, s) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_row_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let sign = _mm256_set1_ps(-0.0);
    // Bytes come out of the two packs as [a0 b0 c0 d0 | a1 b1 c1 d1] in 4-byte groups (a0 =
    // values 0..4 of the first vector); this puts them back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, (d, s)) in d.iter_mut().zip(s.iter_mut()).enumerate() {
        // SAFETY: the asserted lengths put [32b, 32b+32) inside x and q.
        unsafe {
            let p = x.as_ptr().add(b * BLOCK);
            let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
            let mut mx = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, *vi));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
            let scale = amax / 127.0;
            let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            let ints = v.map(|vi| _mm256_cvtps_epi32(_mm256_mul_ps(vi, inv)));
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(ints[0], ints[1]),
                _mm256_packs_epi32(ints[2], ints[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * BLOCK).cast(), bytes);
            let sum8 =
                _mm256_add_epi32(_mm256_add_epi32(ints[0], ints[1]), _mm256_add_epi32(ints[2], ints[3]));
            let sum4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
            let sum2 = _mm_add_epi32(sum4, _mm_unpackhi_epi64(sum4, sum4));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum2, _mm_shuffle_epi32(sum2, 1)));
            *d = scale;
            *s = scale * sum as f32;
        }
    }
}

/// f32 weight rows `rows` (row-major, `k` wide) against `m` activation rows of `x`, into
/// `local[i * rows.len() + r_local]`: the decode path of the f32 tier, which is bound by
/// streaming 4 bytes per weight, so the weight row being read is prefetched ahead.
pub(crate) fn f32_rows(
    w: &[f32],
    k: usize,
    rows: std::ops::Range<usize>,
    x: &[f32],
    m: usize,
    local: &mut [f32],
) {
    assert!(rows.end * k <= w.len() && x.len() == m * k && local.len() >= rows.len() * m);
    assert!(super::isa().has_avx2(), "AVX2 kernels need AVX2, FMA and F16C");
    // SAFETY: AVX2 and FMA were detected at run time (`isa()`); bounds are asserted above.
    unsafe { f32_rows_avx2(w, k, rows, x, m, local) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_rows_avx2(w: &[f32], k: usize, rows: std::ops::Range<usize>, x: &[f32], m: usize, local: &mut [f32]) {
    let width = rows.len();
    let full = k - k % 32;
    for (li, r) in rows.enumerate() {
        let wr = &w[r * k..(r + 1) * k];
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < full {
                // SAFETY: c + 32 ≤ full ≤ k = wr.len() = xr.len(); the prefetch never faults.
                unsafe {
                    if i == 0 {
                        prefetch(wr.as_ptr().add(c).cast());
                    }
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let wv = _mm256_loadu_ps(wr.as_ptr().add(c + 8 * j));
                        let xv = _mm256_loadu_ps(xr.as_ptr().add(c + 8 * j));
                        *acc = _mm256_fmadd_ps(wv, xv, *acc);
                    }
                }
                c += 32;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let tail: f32 = wr[full..].iter().zip(&xr[full..]).map(|(a, b)| a * b).sum();
            local[i * width + li] = hsum(sum) + tail;
        }
    }
}

#[cfg(test)]
mod tests;
