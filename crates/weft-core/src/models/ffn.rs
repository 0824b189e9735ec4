//! The gated feed-forward of a transformer block (SwiGLU, GeGLU):
//! `y = W_down · act(W_gate · x, W_up · x)`.
//!
//! Where the weight types' blocks allow it, the down projection's product is summed in two
//! halves of its inner dimension, `W_down[:, ..ff/2] · a[..ff/2] + W_down[:, ff/2..] ·
//! a[ff/2..]`, always in that order, whatever the batch and the thread count (so a token's
//! bits depend on neither). What that buys is a decode step's feed-forward in one run of the
//! pool instead of two: on two threads, thread `t` computes half `t` of the gate and up rows,
//! activates them and multiplies them by half `t` of the down projection's columns; the two
//! partial sums are added once at the end. Neither thread waits for the other's gate and up
//! values, and the activation is no longer a serial step between two runs. Where the two
//! threads sit on different core complexes each hand-over costs microseconds (it moves the
//! vectors' cache lines across): SmolLM2's decode there ran 3–5% faster, and 0.5% with the
//! threads on one complex; Gemma 3's within noise. Batched decode (16 sequences) ran 2–4%
//! slower for SmolLM2 and its prefill ~1.5% slower, for reasons not found (see the README).

use std::sync::{LazyLock, Mutex, PoisonError};

use super::weights::{Linear, Loader, Pass, Stack};
use super::{buf, layers};
use crate::error::{Error, Result};
use crate::kernels::{self, MatmulScratch};
use crate::threadpool::ThreadPool;

/// A gated activation in place: `gate = act(gate) ⊙ up`.
pub type GatedFn = fn(&mut [f32], &[f32]);

/// A pool of one thread: a thread's own part of a run, computed without waking anyone.
static SERIAL: LazyLock<ThreadPool> = LazyLock::new(|| ThreadPool::new(1));

/// One block's feed-forward weights.
pub struct GatedFfn {
    kind: Kind,
    /// Inner features.
    n_ff: usize,
}

enum Kind {
    /// Gate and up stacked, the down projection whole.
    Whole { gate_up: Stack, down: Linear },
    /// Gate and up stacked with each one's rows in two halves (outputs: gate's first half,
    /// its second, up's first, its second), the down projection in two halves of its
    /// columns, and the adapter keys of gate, up and down (applied here, not by the stack).
    Halves {
        gate_up: Stack,
        down: [Linear; 2],
        keys: [Option<u32>; 3],
    },
}

/// A half's buffers, one per thread of a split decode step (behind a lock each thread takes
/// for its own half only, so never contended), on cache lines of their own so that the two
/// threads' locks do not share one. The batched path borrows them as temporaries.
#[derive(Default)]
#[repr(align(128))]
struct Half {
    gate: Vec<f32>,
    up: Vec<f32>,
    out: Vec<f32>,
    matmul: MatmulScratch,
}

/// Buffers of [`GatedFfn::forward`], reused across passes.
#[derive(Default)]
pub struct FfnScratch {
    halves: [Mutex<Half>; 2],
}

impl FfnScratch {
    fn half(&self, i: usize) -> std::sync::MutexGuard<'_, Half> {
        self.halves[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for FfnScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FfnScratch")
    }
}

impl GatedFfn {
    /// Block `prefix`'s (`blk.{i}.`) `ffn_gate`, `ffn_up` and `ffn_down` for `n_embd` features
    /// and `n_ff` inner ones.
    pub fn load(l: &Loader, prefix: &str, n_embd: usize, n_ff: usize) -> Result<GatedFfn> {
        let [gate, up, down] =
            ["ffn_gate", "ffn_up", "ffn_down"].map(|n| format!("{prefix}{n}.weight"));
        let gate_up = l.stack(&[(&gate, n_ff), (&up, n_ff)], n_embd)?;
        let halves = match l.linear_halves(&down, n_embd, n_ff)? {
            Some(halves) => gate_up.clone().into_halves().map(|g| (g, halves)),
            None => None,
        };
        let kind = match halves {
            Some((gate_up, down_halves)) => Kind::Halves {
                gate_up,
                down: down_halves,
                keys: [&gate, &up, &down].map(|n| l.linear_key(n)),
            },
            None => Kind::Whole {
                gate_up,
                down: l.linear(&down, n_embd, n_ff)?,
            },
        };
        Ok(GatedFfn { kind, n_ff })
    }

    /// `h ← W_down · act(W_gate · h, W_up · h)` for the pass's tokens (`h`: tokens × `n_embd`,
    /// the input on entry, the output on return), with each row's adapter deltas; `gate` and
    /// `up` are work buffers of tokens × `n_ff`.
    pub fn forward(
        &self,
        p: &Pass,
        act: GatedFn,
        h: &mut [f32],
        (gate, up): (&mut [f32], &mut [f32]),
        matmul: &mut MatmulScratch,
        scratch: &FfnScratch,
    ) -> Result<()> {
        let (gate_up, down, keys) = match &self.kind {
            Kind::Whole { gate_up, down } => {
                gate_up.forward(p, h, &mut [&mut *gate, &mut *up], matmul)?;
                layers::gated(p.pool, gate, up, act);
                return down.forward(p, gate, h, matmul);
            }
            Kind::Halves {
                gate_up,
                down,
                keys,
            } => (gate_up, down, keys),
        };
        let n = p.tokens.len();
        if n == 1 && p.pool.n_threads() == 2 && p.loras.is_empty() {
            return self.forward_split(p, gate_up, down, act, h, scratch);
        }
        // Each buffer holds its first half's rows (tokens × ff/2), then its second's.
        let (ff, half) = (self.n_ff, n * self.n_ff / 2);
        let d = h.len() / n.max(1);
        {
            let (g0, g1) = gate.split_at_mut(half);
            let (u0, u1) = up.split_at_mut(half);
            let mut outs = [Some(g0), Some(g1), Some(u0), Some(u1)];
            gate_up.forward_some(p.pool, p.file, n, h, &mut outs, matmul)?;
        }
        if !p.loras.is_empty() {
            for (key, y) in [(keys[0], &mut *gate), (keys[1], &mut *up)] {
                let mut tmp = scratch.half(0);
                let tmp = buf(&mut tmp.gate, n * ff);
                tmp.fill(0.0);
                p.add_adapter_deltas(key, h, d, tmp, ff);
                add_rows_to_halves(tmp, y, n, ff);
            }
        }
        layers::gated(p.pool, gate, up, act);
        // The first half's product plus the second's (`gate` holds the halves' rows in turn).
        let (lo, hi) = (down[0].matrix(p.file)?, down[1].matrix(p.file)?);
        kernels::matmul_halves(p.pool, (&lo, &hi), gate, n, h, matmul);
        if !p.loras.is_empty() {
            // The activations as whole rows, for the down projection's adapters.
            let mut rows = scratch.half(0);
            let rows = buf(&mut rows.gate, n * ff);
            halves_to_rows(gate, rows, n, ff);
            p.add_adapter_deltas(keys[2], rows, ff, h, d);
        }
        Ok(())
    }

    /// [`GatedFfn::forward`] of one token on two threads in one run, each on its half.
    fn forward_split(
        &self,
        p: &Pass,
        gate_up: &Stack,
        down: &[Linear; 2],
        act: GatedFn,
        h: &mut [f32],
        scratch: &FfnScratch,
    ) -> Result<()> {
        let (ff2, d) = (self.n_ff / 2, h.len());
        let x = &*h;
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        p.pool.run(&|t, _| {
            let mut half = scratch.half(t);
            let Half {
                gate,
                up,
                out,
                matmul,
            } = &mut *half;
            let (gate, up, out) = (buf(gate, ff2), buf(up, ff2), buf(out, d));
            let mut run = || -> Result<()> {
                // Outputs: gate's first half, its second, up's first, its second.
                let mut outs: [Option<&mut [f32]>; 4] = Default::default();
                (outs[t], outs[2 + t]) = (Some(&mut *gate), Some(&mut *up));
                gate_up.forward_some(&SERIAL, p.file, 1, x, &mut outs, matmul)?;
                act(gate, up);
                kernels::matmul(&SERIAL, &down[t].matrix(p.file)?, gate, 1, out, matmul);
                Ok(())
            };
            if let Err(e) = run() {
                failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
            return Err(e);
        }
        let (first, second) = (scratch.half(0), scratch.half(1));
        for ((y, &a), &b) in h.iter_mut().zip(&first.out[..d]).zip(&second.out[..d]) {
            *y = a + b;
        }
        Ok(())
    }
}

/// The (first, second) halves of token `t`'s row in a buffer of `n` rows of `width` values
/// laid out as halves (tokens × `width / 2` first halves, then as many second halves).
fn half_rows(n: usize, width: usize, t: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let w2 = width / 2;
    (t * w2..(t + 1) * w2, (n + t) * w2..(n + t + 1) * w2)
}

/// `halves += rows`: `rows` holds `n` whole rows of `width` values, `halves` the same shape
/// laid out as halves ([`half_rows`]).
fn add_rows_to_halves(rows: &[f32], halves: &mut [f32], n: usize, width: usize) {
    for (t, row) in rows.chunks_exact(width).enumerate().take(n) {
        let (a, b) = half_rows(n, width, t);
        let (r0, r1) = row.split_at(width / 2);
        layers::add_assign(&mut halves[a], r0);
        layers::add_assign(&mut halves[b], r1);
    }
}

/// `rows = halves` as whole rows (the inverse layout of [`add_rows_to_halves`]).
fn halves_to_rows(halves: &[f32], rows: &mut [f32], n: usize, width: usize) {
    for (t, row) in rows.chunks_exact_mut(width).enumerate().take(n) {
        let (a, b) = half_rows(n, width, t);
        let (r0, r1) = row.split_at_mut(width / 2);
        r0.copy_from_slice(&halves[a]);
        r1.copy_from_slice(&halves[b]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_halves_are_one_another_reordered() {
        // 3 rows of 4: [r0 | r1 | r2], each row [a b | c d].
        let rows: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut halves = vec![0f32; 12];
        add_rows_to_halves(&rows, &mut halves, 3, 4);
        assert_eq!(halves, [0., 1., 4., 5., 8., 9., 2., 3., 6., 7., 10., 11.]);
        let mut back = vec![f32::NAN; 12];
        halves_to_rows(&halves, &mut back, 3, 4);
        assert_eq!(back, rows);
    }
}
