//! CPU compute kernels for the batched forward: weight matrices in the formats the tiers use
//! (`f32`, `q8_0`, `q4_0`, `q4_1`), activation quantization, and the row-tiled matmul that reads
//! each weight block once per step and applies it to every activation row of the batch.
//!
//! Why not candle's `QMatMul`: it computes every output as one dot product per activation row,
//! so a batch of B rows streams the weights B times, which is what caps batched decode. Here the
//! weight block is loaded (and for 4-bit formats unpacked) once and multiplied with a tile of
//! activation rows held in cache. Large f32 products go to candle's `gemm`-backed matmul.

/// Defines a function twice over: the portable body as written, compiled for the baseline
/// target, and the same body compiled with AVX2 + FMA + F16C, picked at run time by [`isa`].
/// The binaries run on any x86-64 CPU (docs/engine.md: the portable fallback) while the loops written
/// to vectorize get 256-bit FMAs where the CPU has them. Both copies do the same operations in
/// the same order (`mul_add` is fused in both; without FMA it is a correctly rounded library
/// call), and `PACER_KERNELS=scalar` makes the portable copy run on any CPU, for tests.
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        #[inline]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn portable($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    portable($($arg),*)
                }
                if $crate::kernels::isa().has_avx2() {
                    // SAFETY: `isa()` found AVX2, FMA and F16C on this CPU.
                    #[allow(unsafe_code)]
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod amx;
mod f32_ops;
mod interleave;
mod matmul;
mod quant;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use f32_ops::{
    TILE, add_in_place, axpy, dot, pv_tile, rms_norm, rope_in_place, score_tile, silu_mul, softmax_in_place,
};
pub use matmul::{gemm_bt, matmul};
pub use quant::{Format, QActivations, Weight, quantize_activations};

/// Number of values per quantization block for every block format used here.
pub const BLOCK: usize = 32;

/// Which instruction set the quantized kernels use on this CPU, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust loops.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 plus AVX-VNNI: `vpdpbusd` replaces the `maddubs`/add pairs of the 4-bit kernel.
    Avx2Vnni,
    /// AVX2 plus AVX512-VNNI's `vpdpbusd` on the same 256-bit registers (its EVEX encoding),
    /// for CPUs with AVX-512 VNNI but not the VEX-encoded AVX-VNNI: AMD Zen 4, Intel Ice Lake
    /// and Cascade Lake servers. Same kernels, same results as [`Isa::Avx2Vnni`].
    Avx512Vnni,
}

impl Isa {
    /// Whether the AVX2 kernels (and the layouts built for them) apply.
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx2Vnni | Isa::Avx512Vnni)
    }

    /// Whether `vpdpbusd` (u8 × i8 summed into i32 lanes) runs on 256-bit registers, in
    /// either encoding.
    pub fn has_vnni(self) -> bool {
        matches!(self, Isa::Avx2Vnni | Isa::Avx512Vnni)
    }
}

/// The best kernel set this CPU supports. `PACER_KERNELS=scalar` forces the portable path and
/// `PACER_KERNELS=avx2` AVX2 without VNNI (to compare, and to test every path on one machine);
/// `PACER_KERNELS=vnni` keeps VNNI but turns off the AMX tiles ([`amx_tiles`]);
/// `PACER_KERNELS=vnni512` takes AVX512-VNNI's encoding where the CPU has both.
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let forced = std::env::var("PACER_KERNELS").unwrap_or_default();
        if forced == "scalar" {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if forced == "avx2" {
                return Isa::Avx2;
            }
            let evex = std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl");
            if std::arch::is_x86_feature_detected!("avxvnni") && !(evex && forced == "vnni512") {
                return Isa::Avx2Vnni;
            }
            if evex {
                return Isa::Avx512Vnni;
            }
            return Isa::Avx2;
        }
        Isa::Scalar
    })
}

/// Whether quantized matmuls of many activation rows (prefill, large decode batches) run on
/// AMX tiles: on CPUs with AMX-INT8 and AVX-512F whose kernel grants the tile state, beside the
/// AVX-VNNI kernels, whose results they match bit for bit.
pub fn amx_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    return amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Weights for the kernels' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{BLOCK, Format, Weight};

    /// `rows × cols` block weights of `format` with random values and modest, finite scales.
    pub(crate) fn random_blocks(format: Format, rows: usize, cols: usize, seed: u64) -> Weight {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let bb = format.block_bytes();
        let mut bytes = vec![0u8; rows * cols / BLOCK * bb];
        for blk in bytes.chunks_exact_mut(bb) {
            for b in blk.iter_mut() {
                *b = next() as u8;
            }
            // Keep scales finite and modest: overwrite the f16 fields.
            let d = half::f16::from_f32((next() % 1000) as f32 / 50_000.0);
            blk[..2].copy_from_slice(&d.to_le_bytes());
            if format == Format::Q4_1 {
                let m = half::f16::from_f32(-((next() % 1000) as f32) / 20_000.0);
                blk[2..4].copy_from_slice(&m.to_le_bytes());
            }
        }
        Weight::from_blocks(format, rows, cols, bytes)
    }
}
