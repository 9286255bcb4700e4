//! Element-wise and reduction f32 operations of the transformer block, written so the compiler
//! vectorizes them (fixed-width accumulator lanes, `mul_add`); each is compiled for the
//! baseline target and for AVX2 + FMA, chosen at run time (`multiversion!`).

/// Accumulator lanes: two AVX2 vectors, enough independent chains to hide FMA latency.
const LANES: usize = 16;

/// Pairwise sum of the accumulator lanes, written as halving vector adds (a sequential sum
/// of 16 lanes costs as much as a 64-wide dot product itself). `dot` and `dot4` share it,
/// which keeps them bit-identical.
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
    /// Four dot products against one shared vector `b`; each result is bit-identical to
    /// [`dot`]`(a[i], b)` (same lanes, same order), with `b` loaded once for all four.
    pub fn dot4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
        let n = b.len();
        let [a0, a1, a2, a3] = a;
        let (a0, a1, a2, a3) = (&a0[..n], &a1[..n], &a2[..n], &a3[..n]);
        let (mut c0, mut c1, mut c2, mut c3) = ([0f32; LANES], [0f32; LANES], [0f32; LANES], [0f32; LANES]);
        let full = n - n % LANES;
        // Fixed-length chunks let the compiler drop bounds checks and keep the lanes in vectors.
        let chunks = a0
            .chunks_exact(LANES)
            .zip(a1.chunks_exact(LANES))
            .zip(a2.chunks_exact(LANES))
            .zip(a3.chunks_exact(LANES))
            .zip(b.chunks_exact(LANES));
        for ((((x0, x1), x2), x3), y) in chunks {
            for j in 0..LANES {
                c0[j] = x0[j].mul_add(y[j], c0[j]);
                c1[j] = x1[j].mul_add(y[j], c1[j]);
                c2[j] = x2[j].mul_add(y[j], c2[j]);
                c3[j] = x3[j].mul_add(y[j], c3[j]);
            }
        }
        let mut out = [reduce(&c0), reduce(&c1), reduce(&c2), reduce(&c3)];
        for (o, x) in out.iter_mut().zip([a0, a1, a2, a3]) {
            for (x, y) in x[full..].iter().zip(&b[full..]) {
                *o = x.mul_add(*y, *o);
            }
        }
        out
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
    /// Four [`axpy`]s sharing `x`: `y[i] += a[i] · x`, each bit-identical to its own `axpy`.
    pub fn axpy4(a: [f32; 4], x: &[f32], y: [&mut [f32]; 4]) {
        let [y0, y1, y2, y3] = y;
        let n = x.len();
        let (y0, y1, y2, y3) = (&mut y0[..n], &mut y1[..n], &mut y2[..n], &mut y3[..n]);
        for i in 0..n {
            let v = x[i];
            y0[i] = a[0].mul_add(v, y0[i]);
            y1[i] = a[1].mul_add(v, y1[i]);
            y2[i] = a[2].mul_add(v, y2[i]);
            y3[i] = a[3].mul_add(v, y3[i]);
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
    /// SwiGLU: `out[i] = silu(gate[i]) · up[i]`.
    pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

multiversion! {
    /// Softmax in place; returns nothing, leaves probabilities summing to one.
    pub fn softmax_in_place(x: &mut [f32]) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += f64::from(*v);
        }
        let inv = (1.0 / sum) as f32;
        for v in x.iter_mut() {
            *v *= inv;
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
    fn dot4_is_bit_identical_to_four_dots() {
        let rows: Vec<Vec<f32>> =
            (0..4).map(|r| (0..70).map(|i| ((i * 13 + r * 7) % 23) as f32 * 0.37 - 4.1).collect()).collect();
        let b: Vec<f32> = (0..70).map(|i| (i % 9) as f32 * -0.71 + 2.3).collect();
        let got = dot4([&rows[0], &rows[1], &rows[2], &rows[3]], &b);
        for (g, r) in got.iter().zip(&rows) {
            assert_eq!(g.to_bits(), dot(r, &b).to_bits());
        }
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
    fn softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, 1000.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.99);
    }
}
