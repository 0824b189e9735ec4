//! x86 dot products of the 32-element weight types, same names and contracts as the scalar
//! references in `legacy` (which see), in modules `avx2`, `avxvnni` and `avx512` (one generic
//! body per tile, over the set's dot-product primitive [`Isa`]).
//!
//! Per 32-element block the integer dot product is one `maddubs` (u8 × i8 → pairs of i16) and
//! one `madd` with ones (→ 8 lanes of i32), or one VNNI `vpdpbusd`, converted to `f32`, multiplied by `d_x` and
//! accumulated with one FMA by `d_y` (broadcast straight from memory, which keeps a shuffle off
//! the busy FP pipes). Symmetric types (Q4_0, Q5_0, Q8_0) unpack to signed bytes `q - offset`
//! and move the weight's sign onto the activation (`|q| · sign(q)·y`, as `maddubs` wants an
//! unsigned operand); offset types (Q4_1, Q5_1) keep unsigned quants and add `m_x · s_y` per
//! block.
//!
//! One kernel per type, `tile_*::<T>`: each weight block is unpacked once and used for `T`
//! (1 to 4) activation rows held in registers; `vec_dots_*` is the GEMM tile and `vec_dot_*`
//! (the GEMV of one token) is the same function with `T = 1`. Per token, blocks alternate
//! between two accumulators so consecutive FMAs do not wait on each other. Because a token's
//! arithmetic never depends on `T` or on its slot in the tile, the results are bit-identical
//! however the tokens are batched.
//!
//! Every function is `unsafe` only because it needs its module's instruction set: lengths are
//! checked.

use std::arch::x86_64::*;

use super::quantize::{Q8_0Row, Q8_1Row, QK8};
use super::x86::{
    bit_mask, dots, f16_at, f16x2_at, hsum_ps, load256, nibbles, prefetch, stamp_isas, Isa,
};

/// A symmetric 32-element type: `x = d · (q - offset)`, f16 `d` at byte 0.
trait SymBlock {
    const BYTES: usize;
    /// The 32 signed quants `q - offset` of the block at `b`.
    unsafe fn quants(b: *const u8) -> __m256i;
}

/// An offset 32-element type: `x = d · q + m`, f16 `d` at byte 0 and f16 `m` at byte 2.
trait OffBlock {
    const BYTES: usize;
    /// The 32 unsigned quants of the block at `b`.
    unsafe fn quants(b: *const u8) -> __m256i;
}

struct Q4_0;
struct Q5_0;
struct Q8_0;
struct Q4_1;
struct Q5_1;

impl SymBlock for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8))
    }
}

impl SymBlock for Q5_0 {
    const BYTES: usize = 22;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        // nibble | 0xF0 is (nibble - 16) as i8 when the 5th bit is clear; the nibble itself
        // equals (nibble + 16) - 16 when it is set.
        let high_clear = _mm256_andnot_si256(bit_mask(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(nibbles(b.add(6)), high_clear)
    }
}

impl SymBlock for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        load256(b.add(2))
    }
}

impl OffBlock for Q4_1 {
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        nibbles(b.add(4))
    }
}

impl OffBlock for Q5_1 {
    const BYTES: usize = 24;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        let high = _mm256_and_si256(bit_mask(b.add(4)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(b.add(8)), high)
    }
}

/// Number of blocks, after checking that `x` and the activation rows agree.
fn blocks(x: &[u8], bytes: usize, qs_len: usize, n_scales: usize) -> usize {
    let nb = x.len() / bytes;
    assert!(
        x.len() == nb * bytes && qs_len == nb * QK8 && n_scales == nb,
        "shape mismatch"
    );
    nb
}

/// GEMM tile (and, with `T = 1`, the GEMV): one symmetric weight row · `T` Q8_0 rows.
///
/// Every token's result is computed by exactly the same sequence of floating-point operations
/// whatever `T` is and whichever slot of the tile the token occupies: blocks alternate between
/// two accumulators per token (even blocks, odd blocks; an odd last block goes to the even
/// one), each block adds `(p · d_x) · d_y` with one FMA, and the result is
/// `hsum(even + odd)`. A token's accumulators only ever see its own activations and the weight
/// block, so batching cannot change a single bit (the contract of [`super::matmul`]).
#[inline(always)]
unsafe fn tile_sym<P: Isa, K: SymBlock, const T: usize>(x: &[u8], ys: &[Q8_0Row], out: &mut [f32]) {
    let (ys, out) = (&ys[..T], &mut out[..T]);
    let mut nb = 0;
    for y in ys {
        nb = blocks(x, K::BYTES, y.qs.len(), y.d.len());
    }
    let xp = x.as_ptr();
    let yq: [*const i8; T] = std::array::from_fn(|t| ys[t].qs.as_ptr());
    let yd: [*const f32; T] = std::array::from_fn(|t| ys[t].d.as_ptr());
    // acc[u][t]: token t, blocks b with b % 2 == u (two chains, so consecutive FMAs of one
    // token do not wait on each other).
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let mut b = 0;
    while b < nb {
        prefetch(xp.add(b * K::BYTES));
        for (u, acc) in acc.iter_mut().enumerate().take(nb - b) {
            // Unpack the weight block once: |q| and its f16 scale serve all T rows.
            let w = xp.add((b + u) * K::BYTES);
            let qx = K::quants(w);
            // |q| and sign(q)·y: each i16 pair sum is at most 2 · 128 · 127 < 2^15
            // (activations never hold -128), so `maddubs` never saturates.
            let ax = _mm256_sign_epi8(qx, qx);
            let dx = _mm256_set1_ps(f16_at(w));
            for t in 0..T {
                let sy = _mm256_sign_epi8(load256(yq[t].add((b + u) * QK8)), qx);
                let p = dots::<P, 1>([ax], [sy]);
                // (p · d_x) · d_y: d_y is broadcast straight from memory (a load, no ALU work).
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(p), dx);
                acc[t] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(&*yd[t].add(b + u)), acc[t]);
            }
        }
        b += 2;
    }
    for t in 0..T {
        out[t] = hsum_ps(_mm256_add_ps(acc[0][t], acc[1][t]));
    }
}

/// GEMM tile (and, with `T = 1`, the GEMV): one offset weight row · `T` Q8_1 rows.
///
/// Same structure as [`tile_sym`], hence the same guarantee: per token, even and odd blocks
/// accumulate `(p · d_x) · d_y` into two vector accumulators and `m · s_y` (one scalar FMA)
/// into two scalar ones; the result is `hsum(even + odd) + (m_even + m_odd)`.
#[inline(always)]
unsafe fn tile_off<P: Isa, K: OffBlock, const T: usize>(x: &[u8], ys: &[Q8_1Row], out: &mut [f32]) {
    let (ys, out) = (&ys[..T], &mut out[..T]);
    let mut nb = 0;
    for y in ys {
        nb = blocks(x, K::BYTES, y.qs.len(), y.ds.len());
    }
    let xp = x.as_ptr();
    let yq: [*const i8; T] = std::array::from_fn(|t| ys[t].qs.as_ptr());
    let yds: [*const f32; T] = std::array::from_fn(|t| ys[t].ds.as_ptr() as *const f32);
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let mut acc_m = [[0f32; T]; 2];
    let mut b = 0;
    while b < nb {
        prefetch(xp.add(b * K::BYTES));
        let pairs = acc.iter_mut().zip(acc_m.iter_mut());
        for (u, (acc, acc_m)) in pairs.enumerate().take(nb - b) {
            // Unpack the weight block once: quants, d and m serve all T rows.
            let w = xp.add((b + u) * K::BYTES);
            let qx = K::quants(w);
            let dm = f16x2_at(w);
            let dx = _mm256_broadcastss_ps(dm);
            let m = _mm_cvtss_f32(_mm_movehdup_ps(dm));
            for t in 0..T {
                let p = dots::<P, 1>([qx], [load256(yq[t].add((b + u) * QK8))]);
                // (p · d_x) · d_y with d_y broadcast from memory; then m · s (a scalar FMA).
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(p), dx);
                let ds = yds[t].add(2 * (b + u));
                acc[t] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(&*ds), acc[t]);
                acc_m[t] = m.mul_add(*ds.add(1), acc_m[t]);
            }
        }
        b += 2;
    }
    for t in 0..T {
        out[t] = hsum_ps(_mm256_add_ps(acc[0][t], acc[1][t])) + (acc_m[0][t] + acc_m[1][t]);
    }
}

/// Runs the tile for `ys.len()` (1 to 4) rows.
macro_rules! dispatch_tile {
    ($tile:ident, $p:ty, $k:ty, $x:expr, $ys:expr, $out:expr) => {{
        assert!($out.len() >= $ys.len());
        match $ys.len() {
            0 => {}
            1 => $tile::<$p, $k, 1>($x, $ys, $out),
            2 => $tile::<$p, $k, 2>($x, $ys, $out),
            3 => $tile::<$p, $k, 3>($x, $ys, $out),
            4 => $tile::<$p, $k, 4>($x, $ys, $out),
            n => panic!("a tile takes at most 4 rows, got {n}"),
        }
    }};
}

/// The GEMV (`vec_dot_*`, one activation row) and GEMM tile (`vec_dots_*`, 1 to 4 rows) of one
/// type, twins of the scalar references of the same names.
macro_rules! pair {
    ($p:ty, $features:literal, $tile:ident, $k:ty, $row:ty, $dot:ident, $dots:ident) => {
        #[doc = concat!("Twin of [`super::super::legacy::", stringify!($dot), "`].")]
        ///
        /// # Safety
        /// The CPU must support the module's instruction set.
        #[target_feature(enable = $features)]
        pub unsafe fn $dot(x: &[u8], y: &$row) -> f32 {
            let mut out = [0f32];
            $tile::<$p, $k, 1>(x, std::slice::from_ref(y), &mut out);
            out[0]
        }

        #[doc = concat!("Twin of [`super::super::legacy::", stringify!($dots), "`].")]
        ///
        /// # Safety
        /// The CPU must support the module's instruction set.
        #[target_feature(enable = $features)]
        pub unsafe fn $dots(x: &[u8], ys: &[$row], out: &mut [f32]) {
            dispatch_tile!($tile, $p, $k, x, ys, out)
        }
    };
}

/// The public kernels for one instruction set.
macro_rules! entries {
    ($isa:ident, $p:ty, $features:literal) => {
        /// The 32-element kernels compiled for one instruction set.
        pub mod $isa {
            use super::*;

            pair!(
                $p,
                $features,
                tile_sym,
                Q4_0,
                Q8_0Row,
                vec_dot_q4_0_q8_0,
                vec_dots_q4_0_q8_0
            );
            pair!(
                $p,
                $features,
                tile_sym,
                Q5_0,
                Q8_0Row,
                vec_dot_q5_0_q8_0,
                vec_dots_q5_0_q8_0
            );
            pair!(
                $p,
                $features,
                tile_sym,
                Q8_0,
                Q8_0Row,
                vec_dot_q8_0_q8_0,
                vec_dots_q8_0_q8_0
            );
            pair!(
                $p,
                $features,
                tile_off,
                Q4_1,
                Q8_1Row,
                vec_dot_q4_1_q8_1,
                vec_dots_q4_1_q8_1
            );
            pair!(
                $p,
                $features,
                tile_off,
                Q5_1,
                Q8_1Row,
                vec_dot_q5_1_q8_1,
                vec_dots_q5_1_q8_1
            );
        }
    };
}

stamp_isas!(entries);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kernels::legacy as scalar;
    use crate::kernels::quantize::{ActFormat, Q8Batch};
    use crate::kernels::testutil::{random_weights, Rng};
    use crate::kernels::SimdLevel;

    type Dot0 = (
        unsafe fn(&[u8], &Q8_0Row) -> f32,
        fn(&[u8], &Q8_0Row) -> f32,
    );
    type Dots0 = unsafe fn(&[u8], &[Q8_0Row], &mut [f32]);
    type Dot1 = (
        unsafe fn(&[u8], &Q8_1Row) -> f32,
        fn(&[u8], &Q8_1Row) -> f32,
    );
    type Dots1 = unsafe fn(&[u8], &[Q8_1Row], &mut [f32]);

    fn close(a: f32, b: f32, what: &str) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()) + 1e-4,
            "{what}: simd {a} vs scalar {b}"
        );
    }

    /// Random weights and 4 activation rows for every block count from 1 to 9 (odd counts
    /// exercise the GEMV tail).
    fn cases(dtype: GgmlType, act: ActFormat) -> Vec<(Vec<u8>, Q8Batch)> {
        let mut rng = Rng::new(7 + dtype.id() as u64);
        (1..10)
            .map(|nb| {
                let cols = 32 * nb;
                let w = random_weights(&mut rng, dtype, 1, cols);
                let mut batch = Q8Batch::default();
                batch.quantize(None, act, &rng.f32s(4 * cols, 2.0), 4, cols);
                (w, batch)
            })
            .collect()
    }

    /// Each set's `(gemv, reference)` and tile for the Q8_0-activation types, by module.
    macro_rules! kernels0 {
        ($isa:ident) => {{
            let k: [(GgmlType, Dot0, Dots0); 3] = [
                (
                    GgmlType::Q4_0,
                    ($isa::vec_dot_q4_0_q8_0, scalar::vec_dot_q4_0_q8_0),
                    $isa::vec_dots_q4_0_q8_0,
                ),
                (
                    GgmlType::Q5_0,
                    ($isa::vec_dot_q5_0_q8_0, scalar::vec_dot_q5_0_q8_0),
                    $isa::vec_dots_q5_0_q8_0,
                ),
                (
                    GgmlType::Q8_0,
                    ($isa::vec_dot_q8_0_q8_0, scalar::vec_dot_q8_0_q8_0),
                    $isa::vec_dots_q8_0_q8_0,
                ),
            ];
            k
        }};
    }

    /// As `kernels0` for the Q8_1-activation types.
    macro_rules! kernels1 {
        ($isa:ident) => {{
            let k: [(GgmlType, Dot1, Dots1); 2] = [
                (
                    GgmlType::Q4_1,
                    ($isa::vec_dot_q4_1_q8_1, scalar::vec_dot_q4_1_q8_1),
                    $isa::vec_dots_q4_1_q8_1,
                ),
                (
                    GgmlType::Q5_1,
                    ($isa::vec_dot_q5_1_q8_1, scalar::vec_dot_q5_1_q8_1),
                    $isa::vec_dots_q5_1_q8_1,
                ),
            ];
            k
        }};
    }

    /// The body of both tests: for every x86 set this CPU has, each tile and GEMV is close to
    /// the scalar reference, bit-identical whatever the tile size and slot, and bit-identical
    /// to the AVX2 set's (integer sums are exact with `maddubs` and `vpdpbusd` alike).
    macro_rules! check_sets {
        ($kernels:ident, $act:expr, $row:ident) => {{
            let sets = [
                (SimdLevel::Avx2, $kernels!(avx2)),
                (SimdLevel::AvxVnni, $kernels!(avxvnni)),
                (SimdLevel::Avx512, $kernels!(avx512)),
            ];
            let base = sets[0].1;
            for (level, kernels) in sets.into_iter().filter(|(l, _)| l.available()) {
                for (i, (dtype, (simd, reference), simd_tile)) in kernels.into_iter().enumerate() {
                    for (w, batch) in cases(dtype, $act) {
                        let rows: Vec<_> = (0..4).map(|t| batch.$row(t)).collect();
                        for n in 1..=4 {
                            let mut out = [0f32; 4];
                            // SAFETY: the CPU has `level` (filtered above).
                            unsafe { simd_tile(&w, &rows[..n], &mut out) };
                            for t in 0..n {
                                let want = reference(&w, &rows[t]);
                                close(out[t], want, &format!("{level:?} {dtype} tile {n}"));
                                // SAFETY: as above; AVX2 is part of every x86 set.
                                let (gemv, avx2) =
                                    unsafe { (simd(&w, &rows[t]), (base[i].1 .0)(&w, &rows[t])) };
                                close(gemv, want, &format!("{level:?} {dtype} gemv"));
                                // Bit-identical whatever the tile size and the slot in it.
                                assert_eq!(
                                    out[t].to_bits(),
                                    gemv.to_bits(),
                                    "{level:?} {dtype} tile {n} slot {t}"
                                );
                                assert_eq!(gemv.to_bits(), avx2.to_bits(), "{level:?} {dtype}");
                            }
                        }
                    }
                }
            }
        }};
    }

    #[test]
    fn simd_matches_scalar_q8_0_acts() {
        check_sets!(kernels0, ActFormat::Q8_0, q8_0);
    }

    #[test]
    fn simd_matches_scalar_q8_1_acts() {
        check_sets!(kernels1, ActFormat::Q8_1, q8_1);
    }
}
