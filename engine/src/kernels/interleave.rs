//! The 8-row interleaved layout for block weights, built once at load for the AVX2 kernels.
//!
//! GGML stores each row's blocks one after another, so a SIMD kernel must reduce every
//! (row, activation row) dot product horizontally and pays a float scale-and-accumulate per
//! 32 values of each. Here eight consecutive rows share one record per block: 32-bit lane r
//! of a vector holds four consecutive values of row r, so one broadcast of four activation
//! bytes and one `maddubs` advance eight rows at once, and the eight results come out in the
//! lanes of one vector with no horizontal sums. (llama.cpp's CPU "repack" of Q4_0 rests on
//! the same idea; this layout and its kernel are Pacer's own.)
//!
//! Record of group g (rows 8g..8g+8), block b:
//! `d: [f16; 8]`, then for q4_1 `m: [f16; 8]`, then 128 bytes of nibbles in 4 chunks of 32:
//! byte `4r + t` of chunk c holds value `4c + t` of row r (low nibble) and value `4(c+4) + t`
//! (high nibble), so masking a chunk gives the vector of quad c and shifting it that of quad c+4.
//! For q8_0 (used only with AVX-VNNI, whose `vpdpbusd` multiplies u8 by i8 without the i16
//! saturation of `maddubs`): `d: [f16; 8]`, then 8 chunks of 32 bytes, byte `4r + t` of chunk c
//! holding value `4c + t` of row r plus 128 (so it is unsigned; the −128·d offset is applied
//! through the activation block's sum like q4_0's −8·d).

use super::BLOCK;
use super::quant::Format;
use half::f16;

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// Bytes of one (group, block) record.
pub const fn record_bytes(format: Format) -> usize {
    match format {
        Format::Q4_1 => 32 + 128,
        Format::Q8_0 => 16 + 256,
        _ => 16 + 128,
    }
}

/// The 32 unsigned 4-bit values of a GGML q4_0/q4_1 block, with its scale and offset
/// (value = d·q + m; q4_0's offset is −8·d).
fn unpack_block(format: Format, blk: &[u8]) -> ([u8; 32], f16, f16) {
    let d = f16::from_le_bytes([blk[0], blk[1]]);
    let (m, qs) = match format {
        Format::Q4_1 => (f16::from_le_bytes([blk[2], blk[3]]), &blk[4..20]),
        _ => (f16::from_f32(-8.0 * d.to_f32()), &blk[2..18]),
    };
    let mut v = [0u8; 32];
    for j in 0..16 {
        v[j] = qs[j] & 0x0f;
        v[j + 16] = qs[j] >> 4;
    }
    (v, d, m)
}

/// Repacks GGML-layout `bytes` (`rows` × `cols`, rows a multiple of [`GROUP`]) into records.
pub fn interleave(format: Format, rows: usize, cols: usize, bytes: &[u8]) -> Vec<u8> {
    assert!(format != Format::F32 && rows.is_multiple_of(GROUP));
    let nb = cols / BLOCK;
    let bb = format.block_bytes();
    let rec = record_bytes(format);
    let mut out = vec![0u8; rows / GROUP * nb * rec];
    for g in 0..rows / GROUP {
        for b in 0..nb {
            let record = &mut out[(g * nb + b) * rec..(g * nb + b + 1) * rec];
            for r in 0..GROUP {
                let row = g * GROUP + r;
                let at = (row * nb + b) * bb;
                if format == Format::Q8_0 {
                    record[2 * r..2 * r + 2].copy_from_slice(&bytes[at..at + 2]);
                    for (j, &q) in bytes[at + 2..at + 34].iter().enumerate() {
                        record[16 + 32 * (j / 4) + 4 * r + j % 4] = (q as i8 as i16 + 128) as u8;
                    }
                    continue;
                }
                let qs_at = rec - 128;
                let (v, d, m) = unpack_block(format, &bytes[at..at + bb]);
                record[2 * r..2 * r + 2].copy_from_slice(&d.to_le_bytes());
                if format == Format::Q4_1 {
                    record[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&m.to_le_bytes());
                }
                for c in 0..4 {
                    for t in 0..4 {
                        record[qs_at + 32 * c + 4 * r + t] = v[4 * c + t] | (v[4 * (c + 4) + t] << 4);
                    }
                }
            }
        }
    }
    out
}

/// Dequantizes row `row` of an interleaved matrix into `out` (`cols` values).
pub fn dequantize_row(format: Format, cols: usize, bytes: &[u8], row: usize, out: &mut [f32]) {
    let nb = cols / BLOCK;
    let rec = record_bytes(format);
    let (g, r) = (row / GROUP, row % GROUP);
    for b in 0..nb {
        let record = &bytes[(g * nb + b) * rec..(g * nb + b + 1) * rec];
        let d = f16::from_le_bytes([record[2 * r], record[2 * r + 1]]).to_f32();
        if format == Format::Q8_0 {
            for j in 0..BLOCK {
                out[b * BLOCK + j] = d * (f32::from(record[16 + 32 * (j / 4) + 4 * r + j % 4]) - 128.0);
            }
            continue;
        }
        let m = match format {
            Format::Q4_1 => f16::from_le_bytes([record[16 + 2 * r], record[17 + 2 * r]]).to_f32(),
            _ => -8.0 * d,
        };
        let qs = &record[rec - 128..];
        for c in 0..4 {
            for t in 0..4 {
                let byte = qs[32 * c + 4 * r + t];
                out[b * BLOCK + 4 * c + t] = d * f32::from(byte & 0x0f) + m;
                out[b * BLOCK + 4 * (c + 4) + t] = d * f32::from(byte >> 4) + m;
            }
        }
    }
}
