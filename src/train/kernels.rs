//! CPU kernels with backward passes of their own, where candle 0.11's are slow.
//!
//! [`Conv2d`]: a 2-D convolution with its bias and, optionally, a ReLU (stride s, no padding,
//! no dilation: "same" padding is applied before it, as zeros). The ReLU and the bias are
//! folded in because candle's backward for them is single-threaded and allocates a tensor
//! of the activation's size at each of its several steps.
//!
//! candle 0.11's backward for `conv2d` always computes the input's gradient, with
//! `conv_transpose2d`, a direct loop on the CPU, even when the input needs none (the first
//! layer's input is the batch), and then the kernel's gradient as a convolution of the input
//! by the output gradient. Here both passes are im2col + one matrix product per image (the
//! `gemm` crate candle itself uses), split over the batch on the rayon pool:
//! forward `y = W·col(x)`, kernel gradient `dW = Σ dy·col(x)ᵀ`, and, only when the input
//! tracks a gradient, `dx = col⁻¹(Wᵀ·dy)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Storage, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

/// The geometry of one convolution.
#[derive(Debug, Clone, Copy)]
struct Geom {
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    kh: usize,
    kw: usize,
    stride: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    /// Rows of the column matrix: one per kernel weight of one output channel.
    fn k(&self) -> usize {
        self.c_in * self.kh * self.kw
    }
    fn positions(&self) -> usize {
        self.oh * self.ow
    }
}

/// `col[(c·kh + i)·kw + j][oy·ow + ox] = x[c][oy·s + i][ox·s + j]` for one image.
fn im2col(g: &Geom, x: &[f32], col: &mut [f32]) {
    let p = g.positions();
    for c in 0..g.c_in {
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &mut col[((c * g.kh + i) * g.kw + j) * p..][..p];
                for oy in 0..g.oh {
                    let src = &x[(c * g.h + oy * g.stride + i) * g.w + j..];
                    let dst = &mut row[oy * g.ow..][..g.ow];
                    if g.stride == 1 {
                        dst.copy_from_slice(&src[..g.ow]);
                    } else {
                        for (ox, d) in dst.iter_mut().enumerate() {
                            *d = src[ox * g.stride];
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: adds each column entry back onto the pixel it came from.
fn col2im(g: &Geom, col: &[f32], dx: &mut [f32]) {
    let p = g.positions();
    for c in 0..g.c_in {
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &col[((c * g.kh + i) * g.kw + j) * p..][..p];
                for oy in 0..g.oh {
                    let dst = &mut dx[(c * g.h + oy * g.stride + i) * g.w + j..];
                    let src = &row[oy * g.ow..][..g.ow];
                    if g.stride == 1 {
                        for (d, s) in dst[..g.ow].iter_mut().zip(src) {
                            *d += s;
                        }
                    } else {
                        for (ox, s) in src.iter().enumerate() {
                            dst[ox * g.stride] += s;
                        }
                    }
                }
            }
        }
    }
}

/// Row-major `dst (m×n) = [dst +] a (m×k) · b (k×n)`, where `a_t`/`b_t` say the operand is
/// stored transposed (its rows are the product's columns).
#[allow(clippy::too_many_arguments)]
fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    accumulate: bool,
    a: &[f32],
    a_t: bool,
    b: &[f32],
    b_t: bool,
    par: Parallelism,
) {
    assert!(dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n, "matmul: operand too short");
    let (a_cs, a_rs) = if a_t { (m as isize, 1) } else { (1, k as isize) };
    let (b_cs, b_rs) = if b_t { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: the lengths are checked above; the strides describe row-major (or transposed)
    // matrices inside those slices, and dst does not overlap a or b (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// A contiguous f32 view of a CPU tensor, or an error.
fn slice_of<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = storage else { candle_core::bail!("conv2d: {:?} is not f32", storage.dtype()) };
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("conv2d: operand is not contiguous"),
    }
}

/// The convolution with its bias (and ReLU, when `relu`) as one candle op on the CPU.
pub struct Conv2d {
    pub stride: usize,
    pub relu: bool,
}

impl Conv2d {
    fn geom(&self, x: &Shape, w: &Shape) -> Result<Geom> {
        let (_, c_in, h, wd) = x.dims4()?;
        let (c_out, wc, kh, kw) = w.dims4()?;
        if wc != c_in || kh > h || kw > wd || self.stride == 0 {
            candle_core::bail!("conv2d: input {x:?} and kernel {w:?} do not fit (stride {})", self.stride)
        }
        let (oh, ow) = ((h - kh) / self.stride + 1, (wd - kw) / self.stride + 1);
        Ok(Geom { c_in, h, w: wd, c_out, kh, kw, stride: self.stride, oh, ow })
    }
}

/// Runs `f` on the data of a contiguous f32 CPU tensor.
fn with_data<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let t = if t.is_contiguous() { t.clone() } else { t.contiguous()? };
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(c) => f(slice_of(c, layout)?),
        _ => candle_core::bail!("conv2d: this kernel runs on the CPU only"),
    }
}

impl CustomOp3 for Conv2d {
    fn name(&self) -> &'static str {
        "pipeprof-conv2d"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = self.geom(xl.shape(), wl.shape())?;
        let b = xl.shape().dims()[0];
        let (x, w, bias) = (slice_of(xs, xl)?, slice_of(ws, wl)?, slice_of(bs, bl)?);
        if bias.len() != g.c_out {
            candle_core::bail!("conv2d: bias {:?} for {} filters", bl.shape(), g.c_out)
        }
        let (img, out_img, p) = (g.c_in * g.h * g.w, g.c_out * g.positions(), g.positions());
        let mut out = vec![0f32; b * out_img];
        let relu = self.relu;
        out.par_chunks_mut(out_img).zip(x.par_chunks(img)).for_each_init(
            || vec![0f32; g.k() * p],
            |col, (y, x)| {
                im2col(&g, x, col);
                matmul((g.c_out, p, g.k()), y, false, w, false, col, false, Parallelism::None);
                for (row, &bc) in y.chunks_mut(p).zip(bias) {
                    for v in row {
                        let z = *v + bc;
                        *v = if relu { z.max(0.0) } else { z };
                    }
                }
            },
        );
        Ok((CpuStorage::F32(out), Shape::from((b, g.c_out, g.oh, g.ow))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = self.geom(x.shape(), w.shape())?;
        let b = x.dim(0)?;
        let want_dx = x.track_op();
        let relu = self.relu;
        let (dw, db, dx) = with_data(x, |x| {
            with_data(w, |w| {
                with_data(grad, |grad| {
                    with_data(res, |res| Ok(ConvBwd { g: &g, relu, x, w, grad, res }.run(b, want_dx)))
                })
            })
        })?;
        let dev = x.device();
        let dw = Tensor::from_vec(dw, w.shape(), dev)?;
        let db = Tensor::from_vec(db, bias.shape(), dev)?;
        let dx = dx.map(|d| Tensor::from_vec(d, x.shape(), dev)).transpose()?;
        Ok((dx, Some(dw), Some(db)))
    }
}

/// One conv2d backward pass over a batch: the geometry, whether a ReLU followed, and the data
/// (input, kernel, the gradient coming in, the forward's output).
struct ConvBwd<'a> {
    g: &'a Geom,
    relu: bool,
    x: &'a [f32],
    w: &'a [f32],
    grad: &'a [f32],
    res: &'a [f32],
}

impl ConvBwd<'_> {
    /// (dW, db, dx) for `b` images; dx only when `want_dx`. Each task: a run of images, its own
    /// kernel and bias gradients, summed at the end in task order.
    fn run(&self, b: usize, want_dx: bool) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
        let (g, img) = (self.g, self.g.c_in * self.g.h * self.g.w);
        let mut dx = want_dx.then(|| vec![0f32; b * img]);
        let per = b.div_ceil(rayon::current_num_threads().clamp(1, b));
        let dx_chunks: Vec<Option<&mut [f32]>> = match dx.as_mut() {
            Some(d) => d.chunks_mut(per * img).map(Some).collect(),
            None => (0..b.div_ceil(per)).map(|_| None).collect(),
        };
        let partial: Vec<(Vec<f32>, Vec<f32>)> = dx_chunks
            .into_par_iter()
            .enumerate()
            .map(|(t, dx)| self.images(t * per..((t + 1) * per).min(b), dx))
            .collect();
        let (mut dw, mut db) = (vec![0f32; g.c_out * g.k()], vec![0f32; g.c_out]);
        for (pw, pb) in partial {
            dw.iter_mut().zip(pw).for_each(|(a, v)| *a += v);
            db.iter_mut().zip(pb).for_each(|(a, v)| *a += v);
        }
        (dw, db, dx)
    }

    /// One task: the kernel and bias gradients of the images `range`, and their input
    /// gradients written into `dx` (the task's part, when wanted).
    fn images(&self, range: std::ops::Range<usize>, mut dx: Option<&mut [f32]>) -> (Vec<f32>, Vec<f32>) {
        let g = self.g;
        let (img, out_img, k, p) = (g.c_in * g.h * g.w, g.c_out * g.positions(), g.k(), g.positions());
        let mut dw = vec![0f32; g.c_out * k];
        let mut db = vec![0f32; g.c_out];
        let mut col = vec![0f32; k * p];
        let mut gz = vec![0f32; out_img];
        for (n, i) in range.enumerate() {
            let (xi, gi, yi) =
                (&self.x[i * img..][..img], &self.grad[i * out_img..][..out_img], &self.res[i * out_img..][..out_img]);
            // Through the ReLU (y > 0 passes), then the bias.
            for (((z, &gv), &yv), c) in gz.iter_mut().zip(gi).zip(yi).zip(0..) {
                *z = if !self.relu || yv > 0.0 { gv } else { 0.0 };
                db[c / p] += *z;
            }
            im2col(g, xi, &mut col);
            // dW (c_out × k) += dz (c_out × p) · colᵀ (p × k)
            matmul((g.c_out, k, p), &mut dw, n > 0, &gz, false, &col, true, Parallelism::None);
            if let Some(dx) = dx.as_mut() {
                // dcol (k × p) = Wᵀ (k × c_out) · dz (c_out × p), back to pixels.
                matmul((k, p, g.c_out), &mut col, false, self.w, true, &gz, false, Parallelism::None);
                col2im(g, &col, &mut dx[n * img..][..img]);
            }
        }
        (dw, db)
    }
}

/// Where [`Dense`] leaves its weight's gradient. candle sums every gradient an op returns into
/// a fresh zero tensor (`zeros_like` + `add`, one thread): for a 42 M-parameter weight that is
/// three more passes over 170 MB each step. The model moves it from here into the gradient
/// store instead (`Cnn::take_grads`).
pub type GradSlot = std::sync::Arc<std::sync::Mutex<Option<Tensor>>>;

/// A dense layer's product `y = x·Wᵀ` for `x (batch × in)` and `W (out × in)`; the weight's
/// gradient goes to `dw`, not through candle's gradient store.
pub struct Dense {
    pub dw: GradSlot,
}

impl CustomOp2 for Dense {
    fn name(&self) -> &'static str {
        "pipeprof-dense"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let ((b, k), (n, wk)) = (xl.shape().dims2()?, wl.shape().dims2()?);
        if k != wk {
            candle_core::bail!("dense: input {:?} and weight {:?} do not fit", xl.shape(), wl.shape())
        }
        let (x, w) = (slice_of(xs, xl)?, slice_of(ws, wl)?);
        let mut y = vec![0f32; b * n];
        matmul((b, n, k), &mut y, false, x, false, w, true, par());
        Ok((CpuStorage::F32(y), Shape::from((b, n))))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let ((b, k), (n, _)) = (x.dims2()?, w.dims2()?);
        let (want_dx, want_dw) = (x.track_op(), w.track_op());
        let (dw, dx) = with_data(x, |xd| {
            with_data(w, |wd| {
                with_data(grad, |gd| {
                    // dW (n × k) = dyᵀ (n × b) · x (b × k)
                    let dw = want_dw.then(|| {
                        let mut dw = vec![0f32; n * k];
                        matmul((n, k, b), &mut dw, false, gd, true, xd, false, par());
                        dw
                    });
                    // dx (b × k) = dy (b × n) · W (n × k)
                    let dx = want_dx.then(|| {
                        let mut dx = vec![0f32; b * k];
                        matmul((b, k, n), &mut dx, false, gd, false, wd, false, par());
                        dx
                    });
                    Ok((dw, dx))
                })
            })
        })?;
        let dev = x.device();
        if let Some(dw) = dw {
            let dw = Tensor::from_vec(dw, w.shape(), dev)?;
            let mut slot = self.dw.lock().map_err(|_| candle_core::Error::msg("dense: gradient slot poisoned"))?;
            // Two backward passes over one forward would add up, as candle's store does.
            *slot = Some(match slot.take() {
                Some(prev) => (prev + dw)?,
                None => dw,
            });
        }
        let dx = dx.map(|d| Tensor::from_vec(d, x.shape(), dev)).transpose()?;
        Ok((dx, None))
    }
}

/// Max pooling with a window of `k` and stride `k` (the windows do not overlap: the only case
/// candle's backward supports too). candle's backward builds a mask from upsampled copies
/// (upsample, compare, cast, average-pool, multiply, upsample, multiply: seven tensors of the
/// input's size, single-threaded) and splits the gradient among tied maxima; here each
/// window's gradient goes to its first maximum, as PyTorch does, one pass per plane on the
/// rayon pool. (Ties are windows of ReLU zeros, whose gradient the ReLU below stops anyway.)
pub struct MaxPool {
    pub k: usize,
}

impl MaxPool {
    fn dims(&self, s: &Shape) -> Result<(usize, usize, usize, usize, usize)> {
        let (b, c, h, w) = s.dims4()?;
        if self.k == 0 || self.k > h || self.k > w {
            candle_core::bail!("max pool: window {} does not fit {s:?}", self.k)
        }
        Ok((b * c, h, w, h / self.k, w / self.k))
    }

    /// The index within a plane of the first maximum of output cell (oy, ox).
    fn argmax(&self, plane: &[f32], w: usize, oy: usize, ox: usize) -> usize {
        let k = self.k;
        let mut best = (oy * k) * w + ox * k;
        for i in 0..k {
            for j in 0..k {
                let at = (oy * k + i) * w + ox * k + j;
                if plane[at] > plane[best] {
                    best = at;
                }
            }
        }
        best
    }
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "pipeprof-max-pool"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (planes, h, w, oh, ow) = self.dims(xl.shape())?;
        let x = slice_of(xs, xl)?;
        let mut out = vec![0f32; planes * oh * ow];
        out.par_chunks_mut(oh * ow).zip(x.par_chunks(h * w)).for_each(|(y, plane)| {
            for oy in 0..oh {
                for ox in 0..ow {
                    y[oy * ow + ox] = plane[self.argmax(plane, w, oy, ox)];
                }
            }
        });
        let (b, c, _, _) = xl.shape().dims4()?;
        Ok((CpuStorage::F32(out), Shape::from((b, c, oh, ow))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (planes, h, w, oh, ow) = self.dims(x.shape())?;
        let dx = with_data(x, |xd| {
            with_data(grad, |gd| {
                let mut dx = vec![0f32; planes * h * w];
                dx.par_chunks_mut(h * w).zip(xd.par_chunks(h * w)).zip(gd.par_chunks(oh * ow)).for_each(
                    |((d, plane), g)| {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                d[self.argmax(plane, w, oy, ox)] += g[oy * ow + ox];
                            }
                        }
                    },
                );
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// One product over the whole rayon pool.
fn par() -> Parallelism {
    Parallelism::Rayon(rayon::current_num_threads())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0) - 0.5).collect()
    }

    fn close(a: &Tensor, b: &Tensor) {
        let (a, b) =
            (a.flatten_all().unwrap().to_vec1::<f32>().unwrap(), b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        assert!(a.iter().any(|v| *v != 0.0));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
        }
    }

    #[test]
    fn forward_and_gradients_match_candles_conv2d_bias_and_relu() {
        let dev = Device::Cpu;
        for (stride, relu) in [(1, true), (2, true), (1, false)] {
            // 3 images (more than one per rayon task), 2 → 4 channels, a 3×2 kernel.
            let x = Var::from_tensor(&Tensor::from_vec(data(3 * 2 * 9 * 8, 1), (3, 2, 9, 8), &dev).unwrap()).unwrap();
            let w = Var::from_tensor(&Tensor::from_vec(data(4 * 2 * 3 * 2, 2), (4, 2, 3, 2), &dev).unwrap()).unwrap();
            let bias = Var::from_tensor(&Tensor::new(&[0.1f32, -0.2, 0.05, 0.0], &dev).unwrap()).unwrap();
            let ours = x.as_tensor().apply_op3(w.as_tensor(), bias.as_tensor(), Conv2d { stride, relu }).unwrap();
            let theirs = x
                .as_tensor()
                .conv2d(w.as_tensor(), 0, stride, 1, 1)
                .unwrap()
                .broadcast_add(&bias.as_tensor().reshape((1, 4, 1, 1)).unwrap())
                .unwrap();
            let theirs = if relu { theirs.relu().unwrap() } else { theirs };
            close(&ours, &theirs);
            // Σ y·u: the gradient of y is u, an arbitrary upstream gradient.
            let (oh, ow) = (ours.dim(2).unwrap(), ours.dim(3).unwrap());
            let up = Tensor::from_vec(data(3 * 4 * oh * ow, 3), (3, 4, oh, ow), &dev).unwrap();
            let g1 = (&ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g2 = (&theirs * &up).unwrap().sum_all().unwrap().backward().unwrap();
            for v in [&x, &w, &bias] {
                close(g1.get(v.as_tensor()).unwrap(), g2.get(v.as_tensor()).unwrap());
            }
        }
    }

    #[test]
    fn dense_forward_and_gradients_match_candles_linear() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::from_vec(data(5 * 7, 6), (5, 7), &dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::from_vec(data(3 * 7, 7), (3, 7), &dev).unwrap()).unwrap();
        let up = Tensor::from_vec(data(5 * 3, 8), (5, 3), &dev).unwrap();
        let slot = GradSlot::default();
        let ours = x.as_tensor().apply_op2(w.as_tensor(), Dense { dw: slot.clone() }).unwrap();
        let theirs = x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap();
        close(&ours, &theirs);
        let g1 = (&ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&theirs * &up).unwrap().sum_all().unwrap().backward().unwrap();
        close(g1.get(x.as_tensor()).unwrap(), g2.get(x.as_tensor()).unwrap());
        // The weight's gradient is in the slot, not in candle's store.
        assert!(g1.get(w.as_tensor()).is_none());
        let dw = slot.lock().unwrap().take().unwrap();
        close(&dw, g2.get(w.as_tensor()).unwrap());
        // An input that needs no gradient gets none.
        let y = x.as_tensor().detach().apply_op2(w.as_tensor(), Dense { dw: slot.clone() }).unwrap();
        let g = y.sum_all().unwrap().backward().unwrap();
        assert!(slot.lock().unwrap().is_some() && g.get(&x.as_tensor().detach()).is_none());
    }

    #[test]
    fn max_pool_forward_matches_candles_and_routes_each_gradient_to_its_maximum() {
        let dev = Device::Cpu;
        // Distinct values (no ties), a 7×9 plane: the last row and column fall outside a window.
        let (n, h, w) = (2 * 3 * 7 * 9, 7, 9);
        let vals: Vec<f32> = (0..n).map(|i| ((i * 7919) % n) as f32 / n as f32 - 0.5).collect();
        let x = Var::from_tensor(&Tensor::from_vec(vals.clone(), (2, 3, h, w), &dev).unwrap()).unwrap();
        let ours = x.as_tensor().apply_op1(MaxPool { k: 2 }).unwrap();
        let theirs = x.as_tensor().max_pool2d_with_stride(2, 2).unwrap();
        assert_eq!(ours.dims(), &[2, 3, 3, 4]);
        close(&ours, &theirs);
        let up_vals = data(2 * 3 * 3 * 4, 9);
        let up = Tensor::from_vec(up_vals.clone(), (2, 3, 3, 4), &dev).unwrap();
        let g = (&ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let got = g.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // d max / d x = 1 at the maximum, 0 elsewhere (candle 0.11 gives 1/k² there: its
        // mask is divided by the window's average instead of its count of maxima).
        let mut want = vec![0f32; n];
        for plane in 0..6 {
            for (oy, ox) in (0..3).flat_map(|oy| (0..4).map(move |ox| (oy, ox))) {
                let cells = (0..4).map(|q| plane * h * w + (oy * 2 + q / 2) * w + ox * 2 + q % 2);
                let best = cells.max_by(|&a, &b| vals[a].total_cmp(&vals[b])).unwrap();
                want[best] = up_vals[plane * 12 + oy * 4 + ox];
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn max_pool_sends_a_tied_windows_gradient_to_its_first_maximum() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::zeros((1, 1, 2, 2), candle_core::DType::F32, &dev).unwrap()).unwrap();
        let y = x.as_tensor().apply_op1(MaxPool { k: 2 }).unwrap();
        let g = (y * 4.0).unwrap().sum_all().unwrap().backward().unwrap();
        let d = g.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(d, [4.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn an_input_without_gradient_gets_none_computed() {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(data(2 * 5 * 5, 4), (2, 1, 5, 5), &dev).unwrap();
        let w = Var::from_tensor(&Tensor::from_vec(data(3 * 3 * 3, 5), (3, 1, 3, 3), &dev).unwrap()).unwrap();
        let bias = Var::zeros(3, candle_core::DType::F32, &dev).unwrap();
        let y = x.apply_op3(w.as_tensor(), bias.as_tensor(), Conv2d { stride: 1, relu: false }).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_none());
        let theirs = x.conv2d(w.as_tensor(), 0, 1, 1, 1).unwrap().sum_all().unwrap().backward().unwrap();
        close(grads.get(w.as_tensor()).unwrap(), theirs.get(w.as_tensor()).unwrap());
    }
}
