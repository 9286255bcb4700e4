//! Element-wise and reduction f32 operations of the transformer block, written so the compiler
//! vectorizes them (fixed-width accumulator lanes, `mul_add`); each is compiled for the
//! baseline target and for AVX2 + FMA, chosen at run time (`multiversion!`).

/// Accumulator lanes: two AVX2 vectors, enough independent chains to hide FMA latency.
const LANES: usize = 16;

/// Pairwise sum of the accumulator lanes, written as halving vector adds (a sequential sum
/// of 16 lanes costs as much as a 64-wide dot product itself). `dot` and the softmax's sum
/// use it.
#[inline(always)]
fn reduce(acc: &[f32; LANES]) -> f32 {
    // Plain loops, not `array::from_fn`, whose helper would be compiled outside the AVX2 copy.
    let mut s8 = [0f32; 8];
    for j in 0..8 {
        s8[j] = acc[j] + acc[j + 8];
    }
    let mut s4 = [0f32; 4];
    for j in 0..4 {
        s4[j] = s8[j] + s8[j + 4];
    }
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

multiversion! {
    /// Dot product of two equal-length slices.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for j in 0..LANES {
                acc[j] = x[j].mul_add(y[j], acc[j]);
            }
        }
        let mut s = reduce(&acc);
        for (x, y) in ra.iter().zip(rb) {
            s = x.mul_add(*y, s);
        }
        s
    }
}

multiversion! {
    /// `y += a · x`.
    pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y = a.mul_add(*x, *y);
        }
    }
}

multiversion! {
    /// `x += y`.
    pub fn add_in_place(x: &mut [f32], y: &[f32]) {
        for (x, y) in x.iter_mut().zip(y) {
            *x += y;
        }
    }
}

multiversion! {
    /// RMSNorm of each `weight.len()`-wide row of `x` into `out`: `x / sqrt(mean(x²) + eps) · w`.
    /// The mean is accumulated in f64, as GGML does, so long rows lose no precision.
    pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let scale = (1.0 / (ss / d as f64 + f64::from(eps)).sqrt()) as f32;
            for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
                *o = v * scale * w;
            }
        }
    }
}

multiversion! {
    /// Rotary embedding of one head in place, rotating adjacent pairs `(x[2i], x[2i+1])` by the
    /// angles whose cosines and sines are given (GGML's "norm" RoPE used by llama GGUFs, whose q/k
    /// weights the converter permuted for exactly this pairing).
    pub fn rope_in_place(x: &mut [f32], cos: &[f32], sin: &[f32]) {
        for ((pair, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }
}

multiversion! {
    /// SwiGLU: `out[i] = silu(gate[i]) · up[i]`, with `silu(g) = g·σ(g)`. σ comes from
    /// `e = e^−|g|` ([`exp_nonpositive`], at most 1, so nothing overflows) as `1 / (1 + e)` for
    /// `g ≥ 0` and `e / (1 + e)` below: operations that vectorize, where a library `expf` is a
    /// call per element (8 % of a prefill's time, on one thread, when it was one).
    pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            let e = exp_nonpositive(-g.abs());
            let num = if g >= 0.0 { 1.0 } else { e };
            *o = g * (num / (1.0 + e)) * u;
        }
    }
}

/// `e^x` for the arguments of a softmax (`x ≤ 0`), within about 2 ulp, in operations that
/// vectorize (a library `expf` is a call per element, and a long prompt's attention makes one
/// per query and key). `x = n·ln 2 + r` with `n` rounded to nearest by adding 1.5·2²³, `e^r` by
/// its Taylor series to degree 6 on `|r| ≤ ln 2 / 2` (truncation below 2·10⁻⁷), `2^n` built in
/// the exponent bits. Arguments below −87 give `e^−87` (about 10⁻³⁸), not a subnormal.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = if x < -87.0 { -87.0 } else { x };
    let t = x.mul_add(std::f32::consts::LOG2_E, SHIFT);
    let n = t - SHIFT;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p: f32 = 1.0 / 720.0;
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // The low bits of `t` hold n (−126 ≤ n ≤ 0) in two's complement.
    let n_bits = t.to_bits().wrapping_sub(SHIFT.to_bits());
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

multiversion! {
    /// Softmax in place: probabilities summing to one. Maximum and sum run over [`LANES`]
    /// partial lanes (the order depends only on the length, so one row gives the same result
    /// wherever it is computed).
    pub fn softmax_in_place(x: &mut [f32]) {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..LANES {
                lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
            }
        }
        let mut max = f32::NEG_INFINITY;
        for &v in lanes.iter().chain(rest) {
            max = if v > max { v } else { max };
        }
        let mut acc = [0f32; LANES];
        let mut chunks = x.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for j in 0..LANES {
                let e = exp_nonpositive(c[j] - max);
                c[j] = e;
                acc[j] += e;
            }
        }
        let mut sum = reduce(&acc);
        for v in chunks.into_remainder() {
            *v = exp_nonpositive(*v - max);
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

/// Keys per attention tile: one KV-cache block, whose keys the cache stores transposed.
pub const TILE: usize = 16;

multiversion! {
    /// Scores of four query rows against one block of keys stored transposed (`kt[d·TILE + j]`
    /// is dimension `d` of key `j`): `out[i][j] = Σ_d q_i[d]·k_j[d]`, summed over `d` in order
    /// with fused multiply-adds. Broadcasting `q_i[d]` against `TILE` keys at once needs no
    /// horizontal sum, the cost of a 64-wide dot product. Each score's arithmetic depends on
    /// its own row and key only, so which rows share a call never changes a result.
    pub fn score_tile(q: [&[f32]; 4], kt: &[f32], out: &mut [[f32; TILE]; 4]) {
        let hd = q[0].len();
        let [q0, q1, q2, q3] = q;
        let (q1, q2, q3) = (&q1[..hd], &q2[..hd], &q3[..hd]);
        let mut acc = [[0f32; TILE]; 4];
        for (d, k) in kt[..hd * TILE].chunks_exact(TILE).enumerate() {
            let x = [q0[d], q1[d], q2[d], q3[d]];
            for i in 0..4 {
                for j in 0..TILE {
                    acc[i][j] = x[i].mul_add(k[j], acc[i][j]);
                }
            }
        }
        *out = acc;
    }
}

multiversion! {
    /// `out_i += Σ_j w_i[j] · v_j` for four rows over the keys of one block (`v` is
    /// `n × head_dim` for `n = w_i.len()`), summed over `j` in order with fused multiply-adds:
    /// each output element goes through exactly the operations of its row alone. The outputs
    /// stay in registers across the block, `TILE` dimensions at a time.
    pub fn pv_tile(w: [&[f32]; 4], v: &[f32], out: [&mut [f32]; 4]) {
        let [o0, o1, o2, o3] = out;
        let hd = o0.len();
        let n = w[0].len();
        let (o1, o2, o3) = (&mut o1[..hd], &mut o2[..hd], &mut o3[..hd]);
        let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
        let v = &v[..n * hd];
        let mut d0 = 0;
        while d0 + TILE <= hd {
            let mut acc = [[0f32; TILE]; 4];
            acc[0].copy_from_slice(&o0[d0..d0 + TILE]);
            acc[1].copy_from_slice(&o1[d0..d0 + TILE]);
            acc[2].copy_from_slice(&o2[d0..d0 + TILE]);
            acc[3].copy_from_slice(&o3[d0..d0 + TILE]);
            for j in 0..n {
                let x = &v[j * hd + d0..j * hd + d0 + TILE];
                for i in 0..4 {
                    let a = w[i][j];
                    for l in 0..TILE {
                        acc[i][l] = a.mul_add(x[l], acc[i][l]);
                    }
                }
            }
            o0[d0..d0 + TILE].copy_from_slice(&acc[0]);
            o1[d0..d0 + TILE].copy_from_slice(&acc[1]);
            o2[d0..d0 + TILE].copy_from_slice(&acc[2]);
            o3[d0..d0 + TILE].copy_from_slice(&acc[3]);
            d0 += TILE;
        }
        for d in d0..hd {
            for j in 0..n {
                let x = v[j * hd + d];
                o0[d] = w[0][j].mul_add(x, o0[d]);
                o1[d] = w[1][j].mul_add(x, o1[d]);
                o2[d] = w[2][j].mul_add(x, o2[d]);
                o3[d] = w[3][j].mul_add(x, o3[d]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_handles_remainders() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.5).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-3);
    }

    #[test]
    fn rms_norm_gives_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs() {
        let mut x = [1.0f32, 0.0, 0.0, 1.0];
        let half = std::f32::consts::FRAC_PI_2;
        rope_in_place(&mut x, &[half.cos(), 1.0], &[half.sin(), 0.0]);
        assert!((x[0]).abs() < 1e-6 && (x[1] - 1.0).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 1.0]);
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_f64() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 * f64::from(i) / 200_000.0;
            let got = f64::from(exp_nonpositive(x as f32));
            let want = (f64::from(x as f32)).exp();
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 4.0 * f64::from(f32::EPSILON), "worst relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1000.0) > 0.0 && exp_nonpositive(-1000.0) < 1e-37);
    }

    #[test]
    fn silu_mul_is_within_a_few_ulp_of_f64_over_the_whole_range() {
        // Both signs, around zero, and past where e^g under- or overflows an f32.
        let gate: Vec<f32> =
            (-4000..=4000).map(|i| i as f32 * 0.03).chain([-200.0, -90.0, 90.0, 200.0]).collect();
        let up: Vec<f32> =
            gate.iter().enumerate().map(|(i, _)| if i % 2 == 0 { 1.0 } else { -0.75 }).collect();
        let mut out = vec![0f32; gate.len()];
        silu_mul(&gate, &up, &mut out);
        for ((&g, &u), &o) in gate.iter().zip(&up).zip(&out) {
            let (g64, u64_) = (f64::from(g), f64::from(u));
            let want = g64 / (1.0 + (-g64).exp()) * u64_;
            let err = (f64::from(o) - want).abs();
            assert!(err <= 4e-7 * want.abs() + 1e-30, "silu({g}) · {u}: {o} vs {want}");
            assert!(o.is_finite());
        }
        // Exact where it must be: silu(0) = 0, and a large positive gate passes through.
        silu_mul(&[0.0, 100.0], &[1.0, 1.0], &mut out[..2]);
        assert_eq!(&out[..2], &[0.0, 100.0]);
    }

    #[test]
    fn score_and_pv_tiles_match_their_rows_alone() {
        let hd = 70;
        let q: Vec<Vec<f32>> =
            (0..4).map(|r| (0..hd).map(|i| ((i * 13 + r * 7) % 23) as f32 * 0.37 - 4.1).collect()).collect();
        let keys: Vec<Vec<f32>> = (0..TILE)
            .map(|j| (0..hd).map(|i| ((i * 5 + j * 3) % 17) as f32 * 0.21 - 1.3).collect())
            .collect();
        let mut kt = vec![0f32; hd * TILE];
        for (j, k) in keys.iter().enumerate() {
            for d in 0..hd {
                kt[d * TILE + j] = k[d];
            }
        }
        let mut tile = [[0f32; TILE]; 4];
        score_tile([&q[0], &q[1], &q[2], &q[3]], &kt, &mut tile);
        // The same row in every slot, alongside different rows: always the same bits, and a
        // score summed over d in order.
        let mut alone = [[0f32; TILE]; 4];
        score_tile([&q[2], &q[2], &q[2], &q[2]], &kt, &mut alone);
        for j in 0..TILE {
            let want = q[2].iter().zip(&keys[j]).fold(0f32, |s, (a, b)| a.mul_add(*b, s));
            assert_eq!(tile[2][j].to_bits(), want.to_bits());
            assert_eq!(alone[0][j].to_bits(), want.to_bits());
        }

        let n = 11;
        let v: Vec<f32> = (0..n * hd).map(|i| ((i * 7) % 19) as f32 * 0.13 - 1.1).collect();
        let w: Vec<Vec<f32>> = (0..4).map(|r| (0..n).map(|j| ((j + r) % 5) as f32 * 0.2).collect()).collect();
        let mut outs = vec![vec![0.5f32; hd]; 4];
        let [a, b, c, d] = outs.get_disjoint_mut([0, 1, 2, 3]).unwrap();
        pv_tile([&w[0], &w[1], &w[2], &w[3]], &v, [a, b, c, d]);
        for (r, out) in outs.iter().enumerate() {
            let mut want = vec![0.5f32; hd];
            for j in 0..n {
                axpy(w[r][j], &v[j * hd..(j + 1) * hd], &mut want);
            }
            assert_eq!(out, &want, "row {r}");
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, 1000.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.99);
    }
}
