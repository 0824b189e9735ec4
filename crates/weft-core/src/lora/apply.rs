//! Adding the adapters' low-rank deltas to a projection's output, row by row.

use half::f16;

use super::{zo, AdapterSet, LoraPair};
use crate::kernels::{axpy_f16, dot_f32_f16};
use crate::models::BatchToken;
use crate::threadpool::ThreadPool;

/// Rank rows per work item: a row's delta is the sum, in order, of the partial deltas of its
/// adapters' rank parts, whatever thread computes them, so a row's result depends neither on
/// the batch nor on the thread count.
const PART: usize = 16;

/// Adds to each row `y[r]` (`n_out` values) of projection `key` the deltas of the adapters of
/// its token (`tokens[r].lora` indexes `sets`), from the projection's input `x[r]` (`n_in`
/// values). Rows without adapters are untouched. The work items (row, adapter, rank part of
/// `PART` rows) are spread over the pool's threads; a single item (one decode row with one
/// rank-16 adapter) runs on the calling thread, where a pool round trip would cost more than
/// it saves.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    pool: &ThreadPool,
    key: u32,
    tokens: &[BatchToken],
    sets: &[AdapterSet],
    x: &[f32],
    n_in: usize,
    y: &mut [f32],
    n_out: usize,
) {
    // (row, adapter index in its set, first rank row of the part)
    let mut items: Vec<(usize, usize, usize)> = Vec::new();
    for (r, t) in tokens.iter().enumerate() {
        let Some(set) = t.lora.and_then(|i| sets.get(i as usize)) else {
            continue;
        };
        for (j, (adapter, s)) in set.stack.iter().enumerate() {
            if let (Some(p), false) = (adapter.pair(key), *s == 0.0) {
                items.extend((0..p.rank).step_by(PART).map(|k0| (r, j, k0)));
            }
        }
    }
    if items.is_empty() {
        return;
    }
    PARTIALS.with(|cell| {
        let mut partials = cell.borrow_mut();
        if partials.len() < items.len() * n_out {
            partials.resize(items.len() * n_out, 0.0);
        }
        let partials = &mut partials[..items.len() * n_out];
        let item = |i: usize, out: &mut [f32]| {
            let (r, j, k0) = items[i];
            if let Some(set) = tokens[r].lora.and_then(|s| sets.get(s as usize)) {
                let (adapter, s) = &set.stack[j];
                if let Some(p) = adapter.pair(key) {
                    out.fill(0.0);
                    let x = &x[r * n_in..(r + 1) * n_in];
                    part_delta(key, p, *s * p.scale, set, k0, x, out);
                }
            }
        };
        let nt = pool.n_threads().min(items.len());
        if nt <= 1 {
            for (i, out) in partials.chunks_exact_mut(n_out).enumerate() {
                item(i, out);
            }
        } else {
            let shared = Shared(partials.as_mut_ptr());
            pool.run(&|ti, n| {
                let shared = &shared;
                for i in (ti..items.len()).step_by(n) {
                    // SAFETY: item `i` is taken by one thread and owns partials[i·n_out..],
                    // inside the buffer sized for every item above.
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(shared.0.add(i * n_out), n_out) };
                    item(i, out);
                }
            });
        }
        // Sum each row's parts in item order (rows, then adapters, then rank parts).
        for (i, part) in partials.chunks_exact(n_out).enumerate() {
            let r = items[i].0;
            for (yo, &d) in y[r * n_out..(r + 1) * n_out].iter_mut().zip(part) {
                *yo += d;
            }
        }
    });
}

thread_local! {
    /// The partial deltas of one `apply` call, reused across calls.
    static PARTIALS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Shared(*mut f32);
// SAFETY: threads write disjoint items (see `apply`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// `out = scale · Σ_{k in part} B'_k (A'_k · x)` for the rank rows `k0..k0 + PART` of one
/// adapter, with the set's perturbation when it has one.
fn part_delta(
    key: u32,
    p: &LoraPair,
    scale: f32,
    set: &AdapterSet,
    k0: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let ks = k0..(k0 + PART).min(p.rank);
    let mut t = [0.0f32; PART];
    // t = A·x: one dot product per rank row.
    for (tk, k) in t.iter_mut().zip(ks.clone()) {
        *tk = dot_f32_f16(x, &p.a[k * p.n_in..(k + 1) * p.n_in]);
    }
    let t = &mut t[..ks.len()];
    let zo = set.zo.filter(|z| z.sigma != 0.0);
    if let Some(z) = zo {
        perturb_a(key, p, z.seed, z.sigma, x, k0, t);
    }
    // out += scale · t_k · B[:, k]: one axpy per rank row (B is stored transposed).
    for (&tk, k) in t.iter().zip(ks) {
        axpy_f16(out, scale * tk, &p.bt[k * p.n_out..(k + 1) * p.n_out]);
    }
    if let Some(z) = zo {
        perturb_b(key, p, z.seed, z.sigma * scale, k0, t, out);
    }
}

/// `t += sigma · ε_A · x` for rank rows `k0..` (ε_A in the `rank × in` layout).
fn perturb_a(key: u32, p: &LoraPair, seed: u64, sigma: f32, x: &[f32], k0: usize, t: &mut [f32]) {
    for (dk, tk) in t.iter_mut().enumerate() {
        let k = k0 + dk;
        let mut acc = 0.0f32;
        for (i, &xi) in x.iter().enumerate() {
            acc += zo::epsilon(seed, key, 0, k * p.n_in + i) * xi;
        }
        *tk += sigma * acc;
    }
}

/// `y += sigma_scale · ε_B · t` for rank rows `k0..` (ε_B in the `out × rank` layout).
#[allow(clippy::too_many_arguments)]
fn perturb_b(
    key: u32,
    p: &LoraPair,
    seed: u64,
    sigma_scale: f32,
    k0: usize,
    t: &[f32],
    y: &mut [f32],
) {
    for (o, yo) in y.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (dk, &tk) in t.iter().enumerate() {
            acc += zo::epsilon(seed, key, 1, o * p.rank + k0 + dk) * tk;
        }
        *yo += sigma_scale * acc;
    }
}

/// `A` (`rank × in`) and `B` (`out × rank`), both row-major f32, as a pair stored in f16 with
/// `B` transposed. A value f16 cannot hold (NaN, infinite, or beyond ±65504, which would become
/// infinite) is an error naming the matrix: such a delta would change the outputs silently (the
/// attention's softmax hides a NaN as a zero weight).
pub(crate) fn pair_from(
    rank: usize,
    n_in: usize,
    n_out: usize,
    a: &[f32],
    b: &[f32],
    scale: f32,
) -> Result<LoraPair, String> {
    let fits = |v: f32| v.is_finite() && v.abs() <= f16::MAX.to_f32();
    // A scale past f16's range (an alpha of NaN, inf or 1e30 in the file) is no trained
    // adapter's: it would turn every adapted product into noise, so it is refused.
    if !fits(scale) {
        return Err(format!(
            "its scale (alpha / rank) is {scale}: alpha must be a finite number, with alpha / \
             rank within ±65504"
        ));
    }
    for (what, values) in [("lora_A", a), ("lora_B", b)] {
        if let Some(v) = values.iter().find(|&&v| !fits(v)) {
            return Err(format!(
                "{what} holds {v}, which the adapter's f16 storage cannot hold (values must be \
                 finite and within ±65504)"
            ));
        }
    }
    let mut bt = vec![f16::ZERO; rank * n_out];
    for o in 0..n_out {
        for k in 0..rank {
            bt[k * n_out + o] = f16::from_f32(b[o * rank + k]);
        }
    }
    Ok(LoraPair {
        rank,
        n_in,
        n_out,
        a: a.iter().map(|&v| f16::from_f32(v)).collect(),
        bt,
        scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{LoraAdapter, ZoSeed};
    use std::sync::Arc;

    #[test]
    fn a_tiny_perturbation_changes_the_row_a_little() {
        let (rank, n_in, n_out) = (4, 16, 8);
        let a: Vec<f32> = (0..rank * n_in)
            .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..n_out * rank)
            .map(|i| ((i * 5) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let pair = pair_from(rank, n_in, n_out, &a, &b, 2.0).expect("finite");
        let key = crate::lora::key(0, crate::lora::Proj::Q);
        let adapter = Arc::new(LoraAdapter::new(
            "t",
            "llama",
            [(key, pair)].into_iter().collect(),
        ));
        let x: Vec<f32> = (0..n_in).map(|i| (i as f32).sin()).collect();
        let run = |zo| {
            let set = AdapterSet {
                stack: vec![(adapter.clone(), 1.0)],
                zo,
            };
            let mut y = vec![0.0; n_out];
            let token = BatchToken {
                token: 0,
                pos: 0,
                seq: crate::kv::SeqId(0),
                slot: 0,
                logits: false,
                hidden: false,
                mask: None,
                lora: Some(0),
                embed: None,
            };
            apply(
                &ThreadPool::new(2),
                key,
                &[token],
                &[set],
                &x,
                n_in,
                &mut y,
                n_out,
            );
            y
        };
        let plain = run(None);
        let tiny = run(Some(ZoSeed {
            seed: 1,
            sigma: 1e-6,
        }));
        let d = plain
            .iter()
            .zip(&tiny)
            .map(|(p, t)| (p - t).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-3, "{plain:?} {tiny:?}");
        // The antithetic pair: y(σ) - y0 = σ·(B εA x + εB A x) + σ² εB εA x, so the two
        // deviations cancel up to the σ² term.
        let (up, down) = (
            run(Some(ZoSeed {
                seed: 9,
                sigma: 0.001,
            })),
            run(Some(ZoSeed {
                seed: 9,
                sigma: -0.001,
            })),
        );
        for ((u, dn), p) in up.iter().zip(&down).zip(&plain) {
            let (du, dd) = (u - p, dn - p);
            assert!(du.abs() > 1e-5, "the perturbation moves every output");
            assert!((du + dd).abs() < 0.05 * du.abs() + 1e-5, "{du} vs {dd}");
        }
    }
}
