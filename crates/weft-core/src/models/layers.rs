//! Layers shared by the model files: RMSNorm, rotary embeddings, gated activations and
//! attention over the paged KV cache. Numerics follow ggml's CPU backend where it matters for
//! matching llama.cpp (f64 sum of squares in RMSNorm, RoPE angles by repeated multiplication).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use half::f16;

use super::{BatchToken, SlotMask};
use crate::kernels;
use crate::kv::{KvCache, PAGE_SIZE};
use crate::threadpool::ThreadPool;

/// Largest head dimension attention supports (its accumulator lives on the stack).
pub const MAX_HEAD_DIM: usize = 512;

/// `out = x / sqrt(mean(x²) + eps) * w`, row by row (`x` and `out` hold rows of `w.len()`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        // ggml sums the squares in double precision.
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
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
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
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
        let half = self.dims / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in cs.iter().take(half).enumerate() {
                let (a, b) = if self.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// `gate = silu(gate) * up` (SwiGLU).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU (tanh approximation) of every f16 value, as f16 bits: ggml's `ggml_table_gelu_f16`.
fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                let g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh());
                f16::from_f32(g).to_bits()
            })
            .collect()
    })
}

/// `gate = gelu_tanh(gate) * up` (GeGLU), as ggml computes it: GELU is read from a table
/// indexed by the f16 rounding of the input (saturating outside ±10). The table makes it
/// both fast and faithful to llama.cpp's numerics.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32() * u
        };
    }
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

/// Attention of every token's queries over its sequence's keys in `layer`.
///
/// `q` holds `queries.len() × n_head × head_dim` values (already scaled as the model wants;
/// scores are multiplied by `scale`). A key at position `p` is visible to a query at position
/// `t` when `p <= t` and, on a sliding-window layer, `t - p < window` — llama.cpp's rule. A
/// query with a mask (`masks[mask]`) sees the slots its mask allows instead of `p <= t`, with
/// the mask's additive bias (if any) added to its scores.
/// Heads share KV heads in groups (GQA). Softmax is computed online (flash-attention style),
/// so no score buffer is needed whatever the context length.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    kv: &KvCache,
    layer: usize,
    queries: &[BatchToken],
    masks: &[SlotMask],
    q: &[f32],
    n_head: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) -> crate::Result<()> {
    let n_kv_head = kv.layout().n_kv_heads;
    if n_kv_head == 0
        || head_dim == 0
        || !n_head.is_multiple_of(n_kv_head)
        || head_dim > MAX_HEAD_DIM
        || q.len() < queries.len() * n_head * head_dim
        || out.len() < queries.len() * n_head * head_dim
    {
        return Err(crate::Error::BadBatch {
            reason: format!("attention over {n_head} heads of {head_dim} with {n_kv_head} KV heads does not fit its buffers"),
        });
    }
    let group = n_head / n_kv_head;
    // Work items: (query, KV head, sub-group of the heads sharing that KV head). The heads of
    // a sub-group read each key and value once between them; sub-groups are made smaller
    // when there are too few items to keep every thread busy (one-token decode).
    let nt = pool.n_threads();
    let want = (2 * nt).div_ceil((queries.len() * n_kv_head).max(1));
    let sub = group.div_ceil(want).clamp(1, kernels::MAX_ATTN_GROUP);
    let n_sub = group.div_ceil(sub);
    let items = queries.len() * n_kv_head * n_sub;
    let masks: Vec<Option<&SlotMask>> = queries
        .iter()
        .map(|qr| match qr.mask {
            None => Ok(None),
            Some(i) => masks
                .get(i as usize)
                .map(Some)
                .ok_or(crate::Error::BadBatch {
                    reason: format!("attention mask {i} of {} does not exist", masks.len()),
                }),
        })
        .collect::<crate::Result<_>>()?;
    // Resolve every query's view up front so workers cannot fail.
    let views = queries
        .iter()
        .map(|qr| kv.view(layer, qr.seq))
        .collect::<crate::Result<Vec<_>>>()?;
    let shared = SharedOut(out.as_mut_ptr());
    // Items are handed out by an atomic counter, last first: in a causal prefill the later
    // queries see the most keys, so the longest items start first and the short ones fill
    // in behind them (a static split gave one thread 3/4 of a 4,096-token prompt's work).
    let next = AtomicUsize::new(0);
    pool.run(&|_, _| {
        let shared = &shared;
        let mut acc = vec![0f32; sub * head_dim];
        // Per page: the visible slots and their scores, then softmax weights (slot-major,
        // `gh` heads per slot).
        let mut rows = [0u32; PAGE_SIZE];
        let mut scores = [0f32; PAGE_SIZE * kernels::MAX_ATTN_GROUP];
        loop {
            let taken = next.fetch_add(1, Ordering::Relaxed);
            if taken >= items {
                break;
            }
            let item = items - 1 - taken;
            let (qi, rest) = (item / (n_kv_head * n_sub), item % (n_kv_head * n_sub));
            let (kvh, sg) = (rest / n_sub, rest % n_sub);
            let h0 = kvh * group + sg * sub;
            let gh = sub.min(group - sg * sub);
            let (qr, view) = (queries[qi], &views[qi]);
            let first_row = qi * n_head + h0;
            let qv = &q[first_row * head_dim..(first_row + gh) * head_dim];
            let acc = &mut acc[..gh * head_dim];
            acc.fill(0.0);
            let mut max = [f32::NEG_INFINITY; kernels::MAX_ATTN_GROUP];
            let mut sum = [0f32; kernels::MAX_ATTN_GROUP];
            let n_slots = view.positions.len();
            // Whether a key at position `p` is inside the layer's window around this query.
            let in_window = |p: u32| {
                view.window
                    .is_none_or(|w| (i64::from(qr.pos) - i64::from(p)).unsigned_abs() < w as u64)
            };
            for page in 0..n_slots.div_ceil(PAGE_SIZE) {
                let Some((keys, values)) = view.page(page, kvh) else {
                    continue; // released sliding-window page: nothing visible there
                };
                let first = page * PAGE_SIZE;
                let in_page = PAGE_SIZE.min(n_slots - first);
                // No mask, and every key causal and inside the window (the common case): the
                // page's scores in one kernel call, without a check per key.
                let whole_page = masks[qi].is_none()
                    && view.positions[first..first + in_page]
                        .iter()
                        .all(|&p| p <= qr.pos && in_window(p));
                let (mut n, mut checked) = (0, in_page);
                if whole_page {
                    let sc = &mut scores[..in_page * gh];
                    kernels::dots_f32_f16_keys(qv, &keys[..in_page * head_dim], gh, sc);
                    sc.iter_mut().for_each(|x| *x *= scale);
                    for (s, r) in rows[..in_page].iter_mut().enumerate() {
                        *r = s as u32;
                    }
                    (n, checked) = (in_page, 0);
                }
                for s in 0..checked {
                    let p = view.positions[first + s];
                    // Causal (or the token's own mask), and within the layer's window.
                    let allowed = match masks[qi] {
                        None => p <= qr.pos,
                        Some(m) => m.allows(first + s),
                    };
                    let visible = allowed && in_window(p);
                    if visible {
                        let k = &keys[s * head_dim..(s + 1) * head_dim];
                        let sc = &mut scores[n * gh..(n + 1) * gh];
                        kernels::dots_f32_f16(qv, k, sc);
                        sc.iter_mut().for_each(|x| *x *= scale);
                        // A float mask's additive bias, the same for every head.
                        if let Some(b) = masks[qi].and_then(SlotMask::bias) {
                            let b = b.get(first + s).copied().unwrap_or(0.0);
                            sc.iter_mut().for_each(|x| *x += b);
                        }
                        rows[n] = s as u32;
                        n += 1;
                    }
                }
                if n == 0 {
                    continue;
                }
                // Online softmax, one page at a time: when a head's running max grows,
                // rescale what it accumulated; then turn scores into weights.
                for j in 0..gh {
                    let page_max = (0..n).map(|i| scores[i * gh + j]).fold(f32::MIN, f32::max);
                    if page_max > max[j] {
                        let c = (max[j] - page_max).exp();
                        sum[j] *= c;
                        acc[j * head_dim..(j + 1) * head_dim]
                            .iter_mut()
                            .for_each(|a| *a *= c);
                        max[j] = page_max;
                    }
                    for i in 0..n {
                        let w = (scores[i * gh + j] - max[j]).exp();
                        scores[i * gh + j] = w;
                        sum[j] += w;
                    }
                }
                kernels::attend_f16(acc, head_dim, &scores[..n * gh], values, &rows[..n]);
            }
            for j in 0..gh {
                let inv = if sum[j] > 0.0 { 1.0 / sum[j] } else { 0.0 };
                // SAFETY: see `SharedOut`; rows first_row..first_row + gh of `out` (each
                // `head_dim` long, all below queries × n_head) belong to this item alone.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        shared.0.add((first_row + j) * head_dim),
                        head_dim,
                    )
                };
                for (d, &a) in dst.iter_mut().zip(&acc[j * head_dim..(j + 1) * head_dim]) {
                    *d = a * inv;
                }
            }
        }
    });
    Ok(())
}

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
