//! Layers shared by the model files: RMSNorm, rotary embeddings, gated activations and
//! attention over the paged KV cache. Numerics follow ggml's CPU backend where it matters for
//! matching llama.cpp (f64 sum of squares in RMSNorm, RoPE angles by repeated multiplication).

use super::BatchToken;
use crate::kv::KvCache;
use crate::threadpool::ThreadPool;

/// `Σ x²` in double precision, as ggml sums the squares of RMSNorm: each square in `f32`, the
/// sum in `f64` — in four interleaved partial sums (one AVX2 register of doubles) rather than
/// ggml's one chain, which made the norms a serial 4% of Gemma's prefill. The order differs
/// from ggml's only in `f64` rounding, far below the `f32` the result is used in.
fn sum_squares(x: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v * v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v * v)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `out = x / sqrt(mean(x²) + eps) * w`, row by row (`x` and `out` hold rows of `w.len()`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum = sum_squares(xr);
        let scale = 1.0 / ((sum / d as f64) as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let sum = sum_squares(xr);
        let scale = 1.0 / ((sum / d as f64) as f32 + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Rotary position embedding over the first `dims` values of each head.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Rotated dimensions per head.
    pub dims: usize,
    /// `base^(-2/dims)`: the ratio between successive pair frequencies.
    theta_scale: f32,
    /// Position scale (1 / linear scaling factor).
    freq_scale: f32,
    /// NeoX layout (pairs `i`, `i + dims/2`) instead of adjacent pairs `2i`, `2i + 1`.
    neox: bool,
    /// Optional per-pair frequency divisors (Llama 3's `rope_freqs.weight`).
    freq_factors: Option<Vec<f32>>,
}

impl Rope {
    pub fn new(
        dims: usize,
        base: f32,
        freq_scale: f32,
        neox: bool,
        freq_factors: Option<Vec<f32>>,
    ) -> Rope {
        Rope {
            dims,
            theta_scale: base.powf(-2.0 / dims as f32),
            freq_scale,
            neox,
            freq_factors,
        }
    }

    /// Fills `cs` with (cos, sin) of each pair's angle at `pos`. ggml advances the angle by
    /// repeated multiplication in f32, and so do we, to land on the same values.
    pub fn angles(&self, pos: u32, cs: &mut [(f32, f32)]) {
        let mut theta = pos as f32;
        for (i, c) in cs.iter_mut().take(self.dims / 2).enumerate() {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let t = self.freq_scale * theta / ff;
            *c = (t.cos(), t.sin());
            theta *= self.theta_scale;
        }
    }

    /// Rotates every head of `x` (`n_heads × head_dim`) by the angles from [`Rope::angles`].
    pub fn rotate(&self, x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
        let (dims, half) = (self.dims, self.dims / 2);
        // Each pair `(x0, x1)` becomes `(x0·cos − x1·sin, x0·sin + x1·cos)`. The layout is
        // chosen once per call and each loop walks its pairs as slices, without an index
        // check or a layout branch per pair, so the compiler vectorizes it.
        let cs = &cs[..half.min(cs.len())];
        for head in x.chunks_exact_mut(head_dim) {
            if self.neox {
                let (a, b) = head[..dims].split_at_mut(half);
                for ((x0, x1), &(cos, sin)) in a.iter_mut().zip(b).zip(cs) {
                    (*x0, *x1) = (*x0 * cos - *x1 * sin, *x0 * sin + *x1 * cos);
                }
            } else {
                for (p, &(cos, sin)) in head[..dims].chunks_exact_mut(2).zip(cs) {
                    let (x0, x1) = (p[0], p[1]);
                    p[0] = x0 * cos - x1 * sin;
                    p[1] = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

/// `gate = silu(gate) * up` (SwiGLU), with our vector `exp` as ggml does with its own (the C
/// library's `expf`, one value at a time, took 3.5% of SmolLM2's decode step).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    crate::kernels::math::silu_mul_inplace(gate, up)
}

/// `gate = gelu_tanh(gate) * up` (GeGLU), as ggml computes it: GELU read from a table
/// indexed by the f16 rounding of the input (saturating outside ±10), faithful to llama.cpp's
/// numerics; see [`crate::kernels::math::gelu_tanh_mul_inplace`].
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    crate::kernels::math::gelu_tanh_mul_inplace(gate, up)
}

/// Applies a gated activation `op(gate, up)` over the pool's threads when the batch is large
/// enough to pay for it (prefill), in place on one thread otherwise (decode).
pub fn gated(pool: &ThreadPool, gate: &mut [f32], up: &[f32], op: fn(&mut [f32], &[f32])) {
    const MIN_PER_THREAD: usize = 16 * 1024;
    let n = gate.len();
    let nt = pool.n_threads().min(n / MIN_PER_THREAD).max(1);
    if nt == 1 {
        return op(gate, up);
    }
    let per = n.div_ceil(nt);
    let shared = SharedOut(gate.as_mut_ptr());
    pool.run(&|ti, _| {
        let shared = &shared;
        let (start, end) = ((ti * per).min(n), ((ti + 1) * per).min(n));
        // SAFETY: thread `ti` alone touches gate[start..end], inside `gate`.
        let g = unsafe { std::slice::from_raw_parts_mut(shared.0.add(start), end - start) };
        op(g, &up[start..end]);
    });
}

/// `a += b`.
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Rotates each token's queries and keys by its RoPE angles (`angles`: `dims/2` pairs per
/// token), scales the queries by `q_scale` and stores the keys and values in the cache.
/// `q`, `k`, `v` hold one row per token (`n_head·head_dim`, `n_kv_head·head_dim` values).
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache(
    kv: &mut KvCache,
    layer: usize,
    tokens: &[BatchToken],
    rope: &Rope,
    angles: &[(f32, f32)],
    head_dim: usize,
    q_scale: f32,
    (q, k, v): (&mut [f32], &mut [f32], &[f32]),
) -> crate::Result<()> {
    let (qd, kvd, half) = (
        q.len() / tokens.len(),
        k.len() / tokens.len(),
        rope.dims / 2,
    );
    for (i, t) in tokens.iter().enumerate() {
        let cs = &angles[i * half..(i + 1) * half];
        let qi = &mut q[i * qd..(i + 1) * qd];
        rope.rotate(qi, head_dim, cs);
        if q_scale != 1.0 {
            qi.iter_mut().for_each(|x| *x *= q_scale);
        }
        let ki = &mut k[i * kvd..(i + 1) * kvd];
        rope.rotate(ki, head_dim, cs);
        kv.write(layer, t.seq, t.slot, ki, &v[i * kvd..(i + 1) * kvd])?;
    }
    Ok(())
}

/// A raw pointer the attention workers write disjoint rows through.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: every user hands each thread a disjoint part of the buffer (attention, BERT attention: one
// `head_dim` slice per (query, head) pair; `gated`: one contiguous range per thread), so no two
// threads write the same element.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalizes() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        for neox in [false, true] {
            let rope = Rope::new(4, 10000.0, 1.0, neox, None);
            let mut cs = [(0.0, 0.0); 2];
            rope.angles(0, &mut cs);
            let mut x = [1.0f32, 2.0, 3.0, 4.0];
            rope.rotate(&mut x, 4, &cs);
            assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
            rope.angles(7, &mut cs);
            rope.rotate(&mut x, 4, &cs);
            let norm: f32 = x.iter().map(|v| v * v).sum();
            assert!((norm - 30.0).abs() < 1e-4);
        }
    }
}
