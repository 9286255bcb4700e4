//! AMX tile kernels for quantized matmuls with many activation rows (a prefill chunk, a large
//! decode batch), on CPUs with AMX-INT8 (Intel Xeon from Sapphire Rapids on), detected at run
//! time and asked of the kernel once per process.
//!
//! One `tdpbsud` multiplies 16 activation rows × one 32-value block (i8, read in place from the
//! quantized activations) by the same block of 16 weight rows (u8: two 8-row interleaved
//! records side by side; a record's chunk is already the tile's row of 4-byte column groups),
//! giving the 256 block products as exact i32, the same integers `vpdpbusd` sums. The block
//! scales are then applied with AVX-512 in exactly the operations and order of the AVX2 kernel
//! (`x86.rs`): per block, `acc += p·(d·da)` then `acc += m·s`. So an output is bit-identical
//! whichever kernel computed it, and a prompt gives the same logits however it is chunked or
//! batched. What the tiles save is the AVX2 kernel's integer work: one instruction does 8,192
//! multiply-adds, which 256 `vpdpbusd` did, and a block's nibbles are unpacked once for all the
//! activation rows of the matmul rather than once per four.
//!
//! Rust has no stable AMX intrinsics, so the tile instructions are inline assembly; the tile
//! registers are not known to the compiler, which never uses them itself.
#![allow(unsafe_code)]

use super::interleave::{GROUP, record_bytes};
use super::quant::{Format, QActivations, Weight};
use super::{BLOCK, Isa};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows and activation rows per tile.
pub(crate) const ROWS: usize = 16;

/// Activation rows from which a matmul takes the tiles. Below it the AVX2 kernel's four-row
/// tiles waste nothing while a 16-row tile would compute mostly padding. Measured with
/// `pacer-engine bench` (docs/benchmarks.md, "AMX tiles").
pub(crate) const MIN_ROWS: usize = 16;

/// Bytes of one block's weight tile: 8 rows (4-value groups) × 16 weight rows × 4 bytes.
const B_TILE: usize = 8 * 64;

/// Whether the AMX kernels run here: AMX-TILE and AMX-INT8, AVX-512F for the scaling, the
/// AVX-VNNI kernel set (whose interleaved records the tiles read), and the kernel's permission
/// to use the tile state. `PACER_KERNELS=vnni` (or `vnni512`, `avx2`, `scalar`) turns them off, to compare
/// and to test the other kernels on an AMX machine.
pub fn available() -> bool {
    static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMX.get_or_init(|| {
        let forced = std::env::var("PACER_KERNELS").unwrap_or_default();
        if matches!(forced.as_str(), "vnni" | "vnni512" | "avx2" | "scalar") {
            return false;
        }
        super::isa() == Isa::Avx2Vnni
            && std::arch::is_x86_feature_detected!("avx512f")
            && cpu_has_amx_int8()
            && request_tile_permission()
    })
}

/// Whether a matmul of `m` activation rows by `w` takes the tiles.
pub(crate) fn applies(w: &Weight, m: usize) -> bool {
    m >= MIN_ROWS
        && w.interleaved()
        && w.rows().is_multiple_of(ROWS)
        && matches!(w.format(), Format::Q4_0 | Format::Q4_1 | Format::Q8_0)
        && available()
}

/// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
fn cpu_has_amx_int8() -> bool {
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only when the maximum leaf
    // reported by leaf 0 includes it.
    #[allow(unused_unsafe)]
    let edx = unsafe {
        if __get_cpuid_max(0).0 < 7 {
            return false;
        }
        __cpuid_count(7, 0).edx
    };
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// which a process must do once before any thread touches the tiles. Older kernels, and
/// hypervisors that do not pass the state through, refuse, and the tiles stay off.
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl takes two integers and touches no memory of ours; the syscall
    // instruction clobbers rcx and r11, declared here.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// Grows `qa`'s buffers with zero rows to a multiple of [`ROWS`] (its `rows` stays the real
/// count), so the last tile's loads stay in bounds; padded rows produce zeros that are never
/// written out.
pub(crate) fn pad(qa: &mut QActivations) {
    let rows = qa.rows.next_multiple_of(ROWS);
    let nb = qa.cols / BLOCK;
    qa.q.resize(rows * qa.cols, 0);
    qa.d.resize(rows * nb, 0.0);
    qa.s.resize(rows * nb, 0.0);
}

/// The tile configuration (palette 1): tmm0 and tmm4 hold activations (16 rows × 32 bytes),
/// tmm1 and tmm5 weights (8 rows × 64 bytes), tmm2 and tmm3 products (16 rows × 16 i32). Two
/// sets, so one block's product is computed while the previous one is scaled.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for (tile, rows, bytes) in
            [(0, 16, 32u16), (4, 16, 32), (1, 8, 64), (5, 8, 64), (2, 16, 64), (3, 16, 64)]
        {
            c[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&bytes.to_le_bytes());
            c[48 + tile] = rows;
        }
        TileConfig(c)
    }
}

/// `out = x · Wᵀ` for the activation rows of `qa` (padded by [`pad`]); `out` is row-major
/// `qa.rows × w.rows()`. Split across the thread pool by 16-row pairs of weight rows, each task
/// writing its own columns of `out` in place.
pub(crate) fn matmul(w: &Weight, qa: &QActivations, out: &mut [f32]) {
    use rayon::prelude::*;
    let (m, n) = (qa.rows, w.rows());
    let nb = w.cols() / BLOCK;
    let padded = m.next_multiple_of(ROWS);
    // These bounds make every offset in `rows_amx` in range: activation tile rows [i0, i0+16)
    // of block b are bytes [(i0+t)*cols + 32b, +32) of q for i0 + 16 ≤ padded; d/s hold padded
    // rows; output (i, r) is out[i*n + r] for i < m, r < n.
    assert!(available(), "AMX kernels need AMX-INT8, AVX-512F and the kernel's permission");
    assert!(w.interleaved() && matches!(w.format(), Format::Q4_0 | Format::Q4_1 | Format::Q8_0));
    assert!(n.is_multiple_of(ROWS) && out.len() == m * n);
    assert!(qa.cols == w.cols() && qa.q.len() >= padded * qa.cols && qa.d.len() >= padded * nb);
    assert!(qa.s.len() >= padded * nb);
    let pairs = n / ROWS;
    // A few tasks per thread balance uneven cores (as `matmul::by_weight_rows`).
    let tasks = (rayon::current_num_threads() * 4).min(pairs).max(1);
    let per_task = pairs.div_ceil(tasks);
    let out = Out(out.as_mut_ptr());
    (0..tasks).into_par_iter().for_each(|t| {
        let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(pairs));
        if p0 < p1 {
            // SAFETY: `available()` found AMX-TILE, AMX-INT8 (with the kernel's permission),
            // AVX-512F and the AVX2 set; shapes are asserted above, and task t alone writes
            // columns [16·p0, 16·p1) of `out`.
            unsafe { rows_amx(w, p0 * ROWS..p1 * ROWS, qa, out.get(), n) }
        }
    });
}

/// `out`'s pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: the tasks of one `matmul` write disjoint elements through it while `matmul` holds the
// exclusive borrow of the buffer.
unsafe impl Send for Out {}
// SAFETY: as for Send.
unsafe impl Sync for Out {}
impl Out {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Weight rows `rows` against every row of `qa`, into `out[i * n + r]`.
///
/// # Safety
/// As [`matmul`] asserts; `rows` is on 16-row bounds and no other thread touches its columns.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn rows_amx(w: &Weight, rows: std::ops::Range<usize>, qa: &QActivations, out: *mut f32, n: usize) {
    let nb = w.cols() / BLOCK;
    let format = w.format();
    let rec = record_bytes(format);
    let m = qa.rows;
    let config = TileConfig::new();
    // A block's weight tiles for one 16-row pair of records, and their scales and offsets.
    let mut tiles = vec![0u8; nb * B_TILE];
    let mut dvs = vec![0f32; nb * ROWS];
    let mut mvs = vec![0f32; nb * ROWS];
    #[repr(C, align(64))]
    struct Products([i32; ROWS * ROWS]);
    let mut products = Products([0; ROWS * ROWS]);
    // SAFETY: the configuration is a valid palette-1 layout; every tile access below stays
    // within the buffers `matmul` asserts; `tilerelease` ends the tile use of this thread.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, preserves_flags, readonly));
        for pair in rows.start / ROWS..rows.end / ROWS {
            for half in 0..2 {
                let group = &w.blocks()[(2 * pair + half) * nb * rec..(2 * pair + half + 1) * nb * rec];
                unpack_records(format, group, nb, half, &mut tiles, &mut dvs, &mut mvs);
            }
            for i0 in (0..m).step_by(ROWS) {
                let acc = tile_rows(qa, i0, nb, &tiles, &dvs, &mvs, products.0.as_mut_ptr());
                for (t, acc) in acc.iter().enumerate().take(m - i0) {
                    _mm512_storeu_ps(out.add((i0 + t) * n + pair * ROWS), *acc);
                }
            }
        }
        asm!("tilerelease", options(nostack, preserves_flags, nomem));
    }
}

/// Writes one 8-row group's records (its `half` of a 16-row pair) into the pair's weight
/// tiles, scales `d` and offsets `m` (−8·d for q4_0, the stored minimum for q4_1, −128·d for
/// q8_0, whose records hold value + 128), computed as the AVX2 kernel computes them.
///
/// # Safety
/// AVX2 and F16C; `group` holds `nb` records of `format`; `tiles`, `dvs`, `mvs` hold `nb`
/// blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_records(
    format: Format,
    group: &[u8],
    nb: usize,
    half: usize,
    tiles: &mut [u8],
    dvs: &mut [f32],
    mvs: &mut [f32],
) {
    let rec = record_bytes(format);
    assert!(group.len() == nb * rec && tiles.len() >= nb * B_TILE && dvs.len() >= nb * ROWS);
    assert!(mvs.len() >= nb * ROWS && half < 2);
    let low = _mm256_set1_epi8(0x0f);
    // SAFETY: record b is bytes [b*rec, (b+1)*rec) of `group`; tile b is bytes
    // [b*B_TILE, (b+1)*B_TILE) of `tiles`, whose row c is 64 bytes of which this half writes 32;
    // scales b are [b*16, b*16+16) of dvs/mvs, of which this half writes 8 (all asserted).
    unsafe {
        for b in 0..nb {
            let r = group.as_ptr().add(b * rec);
            let tile = tiles.as_mut_ptr().add(b * B_TILE + 32 * half);
            if format == Format::Q8_0 {
                for c in 0..8 {
                    let chunk = _mm256_loadu_si256(r.add(16 + 32 * c).cast());
                    _mm256_storeu_si256(tile.add(64 * c).cast(), chunk);
                }
            } else {
                let qs = r.add(rec - 128);
                for c in 0..4 {
                    let chunk = _mm256_loadu_si256(qs.add(32 * c).cast());
                    let lo = _mm256_and_si256(chunk, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), low);
                    _mm256_storeu_si256(tile.add(64 * c).cast(), lo);
                    _mm256_storeu_si256(tile.add(64 * (c + 4)).cast(), hi);
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(r.cast()));
            let mv = match format {
                Format::Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(r.add(16).cast())),
                Format::Q8_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-128.0)),
                _ => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
            };
            _mm256_storeu_ps(dvs.as_mut_ptr().add(b * ROWS + GROUP * half), dv);
            _mm256_storeu_ps(mvs.as_mut_ptr().add(b * ROWS + GROUP * half), mv);
        }
    }
}

/// Loads block `b`'s activation and weight tiles into tile set `SET` and starts its product.
///
/// # Safety
/// The tiles are configured; `a` points at activation row i0's block b with 16 rows of `stride`
/// bytes readable, `w` at a 512-byte weight tile.
#[inline(always)]
unsafe fn start_product<const SET: usize>(a: *const i8, stride: usize, w: *const u8) {
    // SAFETY: the caller's contract.
    unsafe {
        if SET == 0 {
            asm!(
                "tileloadd tmm0, [{a} + {s}]",
                "tileloadd tmm1, [{w} + {ws}]",
                "tilezero tmm2",
                "tdpbsud tmm2, tmm0, tmm1",
                a = in(reg) a, s = in(reg) stride, w = in(reg) w, ws = in(reg) 64usize,
                options(nostack, preserves_flags, readonly),
            );
        } else {
            asm!(
                "tileloadd tmm4, [{a} + {s}]",
                "tileloadd tmm5, [{w} + {ws}]",
                "tilezero tmm3",
                "tdpbsud tmm3, tmm4, tmm5",
                a = in(reg) a, s = in(reg) stride, w = in(reg) w, ws = in(reg) 64usize,
                options(nostack, preserves_flags, readonly),
            );
        }
    }
}

/// Stores tile set `SET`'s product into `out` (16 rows of 16 i32).
///
/// # Safety
/// The tiles are configured and `out` is 1 KiB writable.
#[inline(always)]
unsafe fn store_product<const SET: usize>(out: *mut i32) {
    // SAFETY: the caller's contract.
    unsafe {
        if SET == 0 {
            asm!("tilestored [{o} + {s}], tmm2", o = in(reg) out, s = in(reg) 64usize, options(nostack, preserves_flags));
        } else {
            asm!("tilestored [{o} + {s}], tmm3", o = in(reg) out, s = in(reg) 64usize, options(nostack, preserves_flags));
        }
    }
}

/// Activation rows `i0..i0 + 16` against one 16-row pair over all blocks: the 16 accumulators
/// (a weight row per lane). Block b + 1's product runs on the other tile set while block b's
/// is scaled.
///
/// # Safety
/// As [`rows_amx`], with the tiles configured, `tiles`/`dvs`/`mvs` filled for the pair and
/// `products` 1 KiB writable.
#[inline(always)]
unsafe fn tile_rows(
    qa: &QActivations,
    i0: usize,
    nb: usize,
    tiles: &[u8],
    dvs: &[f32],
    mvs: &[f32],
    products: *mut i32,
) -> [__m512; ROWS] {
    let cols = qa.cols;
    // SAFETY: block b's activation tile starts at q[i0*cols + 32b] with 16 rows of `cols` bytes
    // (padded rows included), its weight tile at tiles[b*512]; d/s index (i0+t)*nb + b < padded*nb.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let a = qa.q.as_ptr().add(i0 * cols);
        start_product::<0>(a, cols, tiles.as_ptr());
        for b in 0..nb {
            if b + 1 < nb {
                let (an, wn) = (a.add(BLOCK * (b + 1)), tiles.as_ptr().add(B_TILE * (b + 1)));
                if b % 2 == 0 {
                    start_product::<1>(an, cols, wn);
                } else {
                    start_product::<0>(an, cols, wn);
                }
            }
            if b % 2 == 0 {
                store_product::<0>(products);
            } else {
                store_product::<1>(products);
            }
            let dv = _mm512_loadu_ps(dvs.as_ptr().add(b * ROWS));
            let mv = _mm512_loadu_ps(mvs.as_ptr().add(b * ROWS));
            for (t, acc) in acc.iter_mut().enumerate() {
                let idx = (i0 + t) * nb + b;
                let p = _mm512_cvtepi32_ps(_mm512_loadu_si512(products.add(ROWS * t).cast()));
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(*qa.d.get_unchecked(idx)));
                *acc = _mm512_fmadd_ps(p, scale, *acc);
                *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*qa.s.get_unchecked(idx)), *acc);
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::quantize_activations;
    use super::super::testing::random_blocks;
    use super::*;

    #[test]
    fn tiles_match_the_avx2_kernel_bit_for_bit() {
        if !available() {
            eprintln!("no AMX-INT8 (or no permission for it) here: the AVX2 kernels are the only path");
            return;
        }
        let (rows, cols) = (48, 160);
        for format in [Format::Q8_0, Format::Q4_0, Format::Q4_1] {
            let w = random_blocks(format, rows, cols, 7).prepared();
            assert!(w.interleaved());
            for m in [1, 5, 8, 15, 16, 17, 33] {
                let x: Vec<f32> = (0..m * cols).map(|i| ((i * 7919 % 251) as f32 - 125.0) / 37.0).collect();
                let qa = quantize_activations(&x, m, cols);
                let mut want = vec![0f32; rows * m];
                super::super::x86::quantized_rows(&w, 0..rows, &qa, &mut want);
                let mut padded = quantize_activations(&x, m, cols);
                pad(&mut padded);
                let mut got = vec![0f32; rows * m];
                matmul(&w, &padded, &mut got);
                for (at, (g, e)) in got.iter().zip(&want).enumerate() {
                    let (i, r) = (at / rows, at % rows);
                    assert_eq!(g.to_bits(), e.to_bits(), "{format:?} m={m} row {r} act {i}: {g} vs {e}");
                }
            }
        }
    }
}
