//! Fused candle ops for the candle backend's step. On a GPU a step of this small model is bound
//! by kernel launches, not arithmetic, so a chain of element-wise kernels that candle would run
//! one by one is worth one op of our own:
//! - [`rms_norm`]: `x · w / sqrt(mean(x²) + eps)` per row in one op (eight nodes of the step's
//!   graph as candle tensor ops: square, mean, add, sqrt, divide, multiply). On CUDA it launches candle's own compiled
//!   `rmsnorm_f32` kernel (one block per row, f32 accumulation); on candle's CPU device it is a
//!   loop over the rows, which the candle-cpu tests hold to the composed form;
//! - [`rope`]: every row's q and k heads turned at the row's own position in one op (eleven
//!   nodes as candle tensor ops: reshapes, narrows, four multiplies, an add, a subtract and a
//!   concatenation). On CUDA it launches candle's compiled `rope_i_f32` (the interleaved form,
//!   with one cos/sin row per batch entry: here a batch entry is a row, each at its position).
//!
//! Anything the fused op does not take (a dtype other than f32, a strided input) goes through
//! the composed ops, which give the same numbers.
use candle_core::{CpuStorage, CustomOp2, CustomOp3, D, DType, Layout, Shape, Tensor};
use std::ops::Range;

/// `x · w / sqrt(mean(x²) + eps)` over the last axis of `x`; `w` has that axis's length.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let fusable = x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && x.is_contiguous()
        && w.is_contiguous()
        && w.dims1()? == x.dim(D::Minus1)?;
    // `apply_op2` (not `_no_bwd`) records the op in the graph where one is tracked, so the
    // op-count test walks through it.
    if fusable { x.apply_op2(w, RmsNorm { eps }) } else { rms_norm_composed(x, w, eps) }
}

/// The same norm as candle tensor ops: the reference the fused op is tested against, and the path
/// for inputs it does not take.
pub(crate) fn rms_norm_composed(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + f64::from(eps))?.sqrt()?)?.broadcast_mul(w)
}

/// The fused RMSNorm: `x` (rows, d) by the weight `w` (d), both f32 and contiguous.
struct RmsNorm {
    eps: f32,
}

/// The element range of one of `op`'s operands in its storage, which must be contiguous.
fn contiguous(op: &str, l: &Layout) -> candle_core::Result<Range<usize>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(a..b),
        None => candle_core::bail!("{op}: every input must be contiguous"),
    }
}

/// Where `x` and `w` lie in their storage, and the row width.
struct Operands {
    d: usize,
    x: Range<usize>,
    w: Range<usize>,
}

impl Operands {
    fn of(l1: &Layout, l2: &Layout) -> candle_core::Result<Operands> {
        let (x, w) = (contiguous("rms_norm", l1)?, contiguous("rms_norm", l2)?);
        let d = l1.dims().last().copied().unwrap_or(0);
        if d == 0 || w.len() != d || !x.len().is_multiple_of(d) {
            candle_core::bail!("rms_norm: a weight of {} for rows of {d}", w.len())
        }
        Ok(Operands { d, x, w })
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "pacer-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let Operands { d, x, w } = Operands::of(l1, l2)?;
        let x = &s1.as_slice::<f32>()?[x];
        let w = &s2.as_slice::<f32>()?[w];
        let mut out = vec![0f32; x.len()];
        for (row, dst) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean + self.eps).sqrt();
            for ((o, &v), &g) in dst.iter_mut().zip(row).zip(w) {
                *o = v * inv * g;
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{WrapErr, kernels};
        let Operands { d, x, w } = Operands::of(l1, l2)?;
        let (dev, len) = (s1.device(), x.len());
        let x = s1.as_cuda_slice::<f32>()?.slice(x);
        let w = s2.as_cuda_slice::<f32>()?.slice(w);
        let rows = len / d;
        // One block per row: a warp for rows under 1024 wide (this model's 576), else 1024
        // threads reducing through shared memory, as the kernel expects.
        let block: u32 = if d < 1024 { 32 } else { 1024 };
        let config =
            LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        let func = dev.get_or_load_func("rmsnorm_f32", &kernels::REDUCE)?;
        // SAFETY: every element is written by the kernel below before anything reads it.
        let dst = unsafe { dev.alloc::<f32>(len)? };
        let (cols, block_size) = (d as i32, block as i32);
        let mut launch = func.builder();
        launch.arg(&x);
        launch.arg(&dst);
        launch.arg(&w);
        launch.arg(&cols);
        launch.arg(&block_size);
        launch.arg(&self.eps);
        // SAFETY: the arguments match `rmsnorm_f32(src, dst, alpha, n_cols, block_size, eps)` in
        // candle's reduce kernels, `src` and `dst` hold rows × d f32 and `alpha` d.
        unsafe { launch.launch(config) }.w()?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(dst, dev.clone()), l1.shape().clone()))
    }
}

/// Rotates each head's pairs `(x[2i], x[2i+1])` of each row by that row's angle `i` (llama's
/// RoPE on the GGUF's pre-permuted q/k, as [`crate::kernels::rope_in_place`]): `x` is
/// `(rows, heads·hd)`, `cos` and `sin` are `(rows, hd/2)`, gathered at each row's position.
pub(crate) fn rope(
    x: &Tensor,
    heads: usize,
    hd: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> candle_core::Result<Tensor> {
    let all_f32 = [x, cos, sin].iter().all(|t| t.dtype() == DType::F32);
    let (rows, width) = x.dims2()?;
    if all_f32
        && width == heads * hd
        && hd.is_multiple_of(2)
        && cos.dims2()? == (rows, hd / 2)
        && sin.dims2()? == (rows, hd / 2)
    {
        let x = x.contiguous()?;
        x.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { hd })
    } else {
        rope_composed(x, heads, hd, cos, sin)
    }
}

/// The same rotation as candle tensor ops: the reference the fused op is tested against, and
/// the path for inputs it does not take.
pub(crate) fn rope_composed(
    x: &Tensor,
    heads: usize,
    hd: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> candle_core::Result<Tensor> {
    let rows = x.dim(0)?;
    let half = hd / 2;
    let x = x.reshape((rows, heads, half, 2))?;
    let (a, b) = (x.narrow(3, 0, 1)?, x.narrow(3, 1, 1)?);
    let c = cos.reshape((rows, 1, half, 1))?;
    let s = sin.reshape((rows, 1, half, 1))?;
    let ra = (a.broadcast_mul(&c)? - b.broadcast_mul(&s)?)?;
    let rb = (a.broadcast_mul(&s)? + b.broadcast_mul(&c)?)?;
    Tensor::cat(&[ra, rb], 3)?.reshape((rows, heads * hd))
}

/// The fused RoPE: `x` (rows, heads·hd), `cos` and `sin` (rows, hd/2), all f32 and contiguous.
struct Rope {
    hd: usize,
}

impl Rope {
    /// The ranges of `x`, `cos` and `sin`, checked against each other.
    fn operands(&self, l1: &Layout, l2: &Layout, l3: &Layout) -> candle_core::Result<[Range<usize>; 3]> {
        let (x, c, s) = (contiguous("rope", l1)?, contiguous("rope", l2)?, contiguous("rope", l3)?);
        let rows = l1.dims().first().copied().unwrap_or(0);
        let half = self.hd / 2;
        if self.hd == 0
            || !x.len().is_multiple_of(self.hd)
            || c.len() != rows * half
            || s.len() != rows * half
        {
            candle_core::bail!(
                "rope: {} values of x, {} of cos, {} of sin for {rows} rows of head {}",
                x.len(),
                c.len(),
                s.len(),
                self.hd
            )
        }
        Ok([x, c, s])
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "pacer-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let [x, c, s] = self.operands(l1, l2, l3)?;
        let x = &s1.as_slice::<f32>()?[x];
        let (cos, sin) = (&s2.as_slice::<f32>()?[c], &s3.as_slice::<f32>()?[s]);
        let rows = l1.dims()[0];
        let (width, half) = (x.len() / rows.max(1), self.hd / 2);
        let mut out = vec![0f32; x.len()];
        for (r, (row, dst)) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)).enumerate() {
            let (cos, sin) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
            for (head, dst) in row.chunks_exact(self.hd).zip(dst.chunks_exact_mut(self.hd)) {
                for (i, (pair, o)) in head.chunks_exact(2).zip(dst.chunks_exact_mut(2)).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    o[0] = a * cos[i] - b * sin[i];
                    o[1] = a * sin[i] + b * cos[i];
                }
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    #[allow(unsafe_code)]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{WrapErr, kernels};
        let [x, c, s] = self.operands(l1, l2, l3)?;
        let (dev, len) = (s1.device(), x.len());
        let x = s1.as_cuda_slice::<f32>()?.slice(x);
        let cos = s2.as_cuda_slice::<f32>()?.slice(c);
        let sin = s3.as_cuda_slice::<f32>()?.slice(s);
        let rows = l1.dims()[0];
        // `rope_i` over (b, h, t, d) = (rows, heads, 1, hd), with one cos/sin row per batch
        // entry (`stride_b` = one row's values): each row turns at its own position.
        let (bh, td, stride_b) = ((len / self.hd) as u32, self.hd as u32, (len / rows.max(1)) as u32);
        let func = dev.get_or_load_func("rope_i_f32", &kernels::REDUCE)?;
        // SAFETY: every element is written by the kernel below before anything reads it.
        let dst = unsafe { dev.alloc::<f32>(len)? };
        let mut launch = func.builder();
        launch.arg(&x);
        launch.arg(&cos);
        launch.arg(&sin);
        launch.arg(&dst);
        launch.arg(&bh);
        launch.arg(&td);
        launch.arg(&stride_b);
        // SAFETY: the arguments match `rope_i_f32(src, cos, sin, dst, bh, td, stride_b)` in
        // candle's reduce kernels, which writes each of the len / 2 pairs once.
        unsafe { launch.launch(LaunchConfig::for_num_elems((len / 2) as u32)) }.w()?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(dst, dev.clone()), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn worst(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()).expect("difference")
    }

    /// The fused norm gives the composed ops' numbers, on rows of the model's width and on one
    /// row; it is one op where the composed form is six.
    #[test]
    fn the_fused_norm_matches_the_composed_ops() {
        let dev = Device::Cpu;
        for rows in [1usize, 7] {
            let x = Tensor::randn(0f32, 3.0, (rows, 576), &dev).expect("x");
            let w = Tensor::randn(1f32, 0.2, 576, &dev).expect("w");
            let fused = rms_norm(&x, &w, 1e-5).expect("fused");
            let composed = rms_norm_composed(&x, &w, 1e-5).expect("composed");
            assert_eq!(fused.dims(), composed.dims());
            let scale =
                composed.abs().and_then(|a| a.flatten_all()?.max(0)?.to_scalar::<f32>()).expect("max");
            assert!(
                worst(&fused, &composed) <= 1e-6 * scale.max(1.0),
                "rows {rows}: {}",
                worst(&fused, &composed)
            );
        }
        // In a tracked graph (as the op-count test records one) the fused norm is one node
        // past its inputs, the composed form seven more.
        let x = candle_core::Var::randn(0f32, 1.0, (3, 576), &dev).expect("var");
        let w = Tensor::ones(576, DType::F32, &dev).expect("w");
        let nodes = |t: Tensor| t.sorted_nodes().len();
        let fused = nodes(rms_norm(x.as_tensor(), &w, 1e-5).expect("fused"));
        let composed = nodes(rms_norm_composed(x.as_tensor(), &w, 1e-5).expect("composed"));
        assert_eq!(composed, fused + 7, "fused {fused} nodes, composed {composed}");
    }

    /// What the fused op does not take goes the composed way, with the same numbers: a strided
    /// input, and f64.
    #[test]
    fn inputs_the_fused_op_does_not_take_are_composed() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (576, 4), &dev).expect("x").t().expect("t");
        assert!(!x.is_contiguous());
        let w = Tensor::ones(576, DType::F32, &dev).expect("w");
        let strided = rms_norm(&x, &w, 1e-5).expect("strided");
        let contiguous = rms_norm(&x.contiguous().expect("copy"), &w, 1e-5).expect("contiguous");
        assert!(worst(&strided, &contiguous) <= 1e-5);
        let x64 = x.to_dtype(DType::F64).expect("f64");
        let w64 = w.to_dtype(DType::F64).expect("f64");
        assert_eq!(rms_norm(&x64, &w64, 1e-5).expect("f64").dtype(), DType::F64);
    }

    /// The fused RoPE turns each row at its own position as the composed ops do, on a strided
    /// input (the q|k columns of a fused projection) too, and is one node where they are more.
    #[test]
    fn the_fused_rope_matches_the_composed_ops() {
        let dev = Device::Cpu;
        let (rows, heads, hd) = (5, 12, 64);
        let qkv = Tensor::randn(0f32, 1.0, (rows, heads * hd + 3 * hd), &dev).expect("qkv");
        let x = qkv.narrow(1, 0, heads * hd).expect("q|k");
        assert!(!x.is_contiguous());
        let angles = Tensor::randn(0f32, 2.0, (rows, hd / 2), &dev).expect("angles");
        let (cos, sin) = (angles.cos().expect("cos"), angles.sin().expect("sin"));
        let fused = rope(&x, heads, hd, &cos, &sin).expect("fused");
        let composed = rope_composed(&x, heads, hd, &cos, &sin).expect("composed");
        assert_eq!(fused.dims(), [rows, heads * hd]);
        assert!(worst(&fused, &composed) <= 1e-6, "{}", worst(&fused, &composed));
        // A row at angle zero is left as it is.
        let still = rope(
            &x,
            heads,
            hd,
            &Tensor::ones((rows, hd / 2), DType::F32, &dev).expect("1"),
            &Tensor::zeros((rows, hd / 2), DType::F32, &dev).expect("0"),
        )
        .expect("still");
        assert!(worst(&still, &x.contiguous().expect("x")) == 0.0);
        let v = candle_core::Var::randn(0f32, 1.0, (rows, heads * hd), &dev).expect("var");
        let nodes = |t: Tensor| t.sorted_nodes().len();
        let fused = nodes(rope(v.as_tensor(), heads, hd, &cos, &sin).expect("fused"));
        let composed = nodes(rope_composed(v.as_tensor(), heads, hd, &cos, &sin).expect("composed"));
        assert!(composed >= fused + 8, "fused {fused} nodes, composed {composed}");
        // Tables of the wrong shape go the composed way, which refuses them.
        assert!(rope(&x, heads, hd, &cos.narrow(0, 0, 2).expect("2 rows"), &sin).is_err());
    }

    /// A weight of the wrong width is an error, not a read past the end.
    #[test]
    fn a_weight_of_the_wrong_width_is_refused() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 8), DType::F32, &dev).expect("x");
        let w = Tensor::ones(4, DType::F32, &dev).expect("w");
        assert!(rms_norm(&x, &w, 1e-5).is_err());
        assert!(x.apply_op2(&w, RmsNorm { eps: 1e-5 }).is_err());
    }
}
