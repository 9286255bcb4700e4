//! Fused candle ops for the candle backend's step. On a GPU a step of this small model is bound
//! by kernel launches, not arithmetic, so a chain of element-wise kernels that candle would run
//! one by one is worth one op of our own:
//! - [`rms_norm`]: `x · w / sqrt(mean(x²) + eps)` per row in one op (eight nodes of the step's
//!   graph as candle tensor ops: square, mean, add, sqrt, divide, multiply). On CUDA it launches candle's own compiled
//!   `rmsnorm_f32` kernel (one block per row, f32 accumulation); on candle's CPU device it is a
//!   loop over the rows, which the candle-cpu tests hold to the composed form.
//!
//! Anything the fused op does not take (a dtype other than f32, a strided input) goes through
//! the composed ops, which give the same numbers.
use candle_core::{CpuStorage, CustomOp2, D, DType, Layout, Shape, Tensor};
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

/// Where `x` and `w` lie in their storage, and the row width.
struct Operands {
    d: usize,
    x: Range<usize>,
    w: Range<usize>,
}

impl Operands {
    fn of(l1: &Layout, l2: &Layout) -> candle_core::Result<Operands> {
        let (Some((x0, x1)), Some((w0, w1))) = (l1.contiguous_offsets(), l2.contiguous_offsets()) else {
            candle_core::bail!("rms_norm: both inputs must be contiguous")
        };
        let d = l1.dims().last().copied().unwrap_or(0);
        if d == 0 || w1 - w0 != d || (x1 - x0) % d != 0 {
            candle_core::bail!("rms_norm: a weight of {} for rows of {d}", w1 - w0)
        }
        Ok(Operands { d, x: x0..x1, w: w0..w1 })
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
