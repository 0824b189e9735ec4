//! AVX2 + FMA + F16C twins of the attention kernels in `attention` (same contracts).
//!
//! A value row is read through [`Row`], which widens 8 of its values to `f32`: f16 with
//! `vcvtph2ps`; Q8_0 by sign-extending 8 bytes to `i32`, converting and multiplying by the
//! block's scale (the scale is folded in on load, so both types share one loop and a Q8_0 row
//! costs a few more instructions but half the bytes). A key page, stored by column (f16, or
//! Q8_0 block by block), is read 16 slots at a time. Every function is `unsafe` only because it
//! needs AVX2, FMA and F16C: the safe wrappers check the shapes.

use std::arch::x86_64::*;

use super::attention::exp_consts::*;
use super::attention::{
    scalar, KvType, MAX_GROUP, PAGE_ROWS, PAGE_SLOTS, Q8_BLOCK, Q8_KEY_QS, Q8_KEY_SECTION,
};
use super::x86::{hsum_ps, prefetch_line, SpreadHints};

/// How a row type is widened.
trait Row {
    /// Values `i..i + 8` of the row at `p` (`i` a multiple of 8).
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
}

struct F16Row;
struct Q8Row;

impl Row for F16Row {
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
    }
}

impl Row for Q8Row {
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        let b = p.add(i / 32 * Q8_BLOCK);
        let d = _mm256_cvtph_ps(_mm_set1_epi16((b as *const i16).read_unaligned()));
        let q = _mm_loadl_epi64(b.add(2 + i % 32) as *const __m128i);
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
    }
}

/// Picks the row type and the const group size `G` (1 to 8) for a generic body.
macro_rules! dispatch {
    ($kv:expr, $g:expr, $f:ident ( $($arg:expr),* )) => {
        match ($kv, $g) {
            (KvType::F16, 1) => $f::<F16Row, 1>($($arg),*),
            (KvType::F16, 2) => $f::<F16Row, 2>($($arg),*),
            (KvType::F16, 3) => $f::<F16Row, 3>($($arg),*),
            (KvType::F16, 4) => $f::<F16Row, 4>($($arg),*),
            (KvType::F16, 5) => $f::<F16Row, 5>($($arg),*),
            (KvType::F16, 6) => $f::<F16Row, 6>($($arg),*),
            (KvType::F16, 7) => $f::<F16Row, 7>($($arg),*),
            (KvType::F16, 8) => $f::<F16Row, 8>($($arg),*),
            (KvType::Q8_0, 1) => $f::<Q8Row, 1>($($arg),*),
            (KvType::Q8_0, 2) => $f::<Q8Row, 2>($($arg),*),
            (KvType::Q8_0, 3) => $f::<Q8Row, 3>($($arg),*),
            (KvType::Q8_0, 4) => $f::<Q8Row, 4>($($arg),*),
            (KvType::Q8_0, 5) => $f::<Q8Row, 5>($($arg),*),
            (KvType::Q8_0, 6) => $f::<Q8Row, 6>($($arg),*),
            (KvType::Q8_0, 7) => $f::<Q8Row, 7>($($arg),*),
            (KvType::Q8_0, 8) => $f::<Q8Row, 8>($($arg),*),
            (_, g) => panic!("attention kernels take 1 to 8 heads, got {g}"),
        }
    };
}

/// Scores a column key page (f16 or Q8_0) 16 slots at a time, for up to `$max` query rows a
/// pass: `$tile::<H>(rows, page, first slot, d, out, stride, lanes, ahead)` with `H` one of
/// `$h` or `$max`. The page's first pass hints the next page in as it reads its own.
macro_rules! by_passes {
    ($tile:ident, [$($h:literal),*], $max:literal,
     $qs:expr, $page:expr, $n:expr, $g:expr, $out:expr, $stride:expr, $ahead:expr) => {{
        let (n, g, stride) = ($n, $g, $stride);
        let d = $qs.len() / g;
        let (qp, kp, op) = ($qs.as_ptr(), $page.as_ptr(), $out.as_mut_ptr());
        for half in 0..n.div_ceil(16) {
            let (first, lanes) = (16 * half, (n - 16 * half).min(16));
            let mut j = 0;
            while j < g {
                let h = (g - j).min($max);
                let ahead = if half == 0 && j == 0 {
                    $ahead
                } else {
                    std::ptr::null()
                };
                let (q, o) = (qp.add(j * d), op.add(j * stride + first));
                match h {
                    $($h => $tile::<$h>(q, kp, first, d, o, stride, lanes, ahead),)*
                    _ => $tile::<$max>(q, kp, first, d, o, stride, lanes, ahead),
                }
                j += h;
            }
        }
    }};
}

/// AVX2 twin of [`super::attention::dots`] for an f16 key page (stored by column).
///
/// The page is scored 16 slots at a time (two registers a head), for up to 4 heads at once:
/// each line of the page (16 of its slots' value `t`) is widened once for those heads, each
/// (head, slot) lane one multiply-add chain over `t` in order — the scalar kernel's chain.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes must be as the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_f16(
    qs: &[f32],
    page: &[u8],
    n: usize,
    g: usize,
    out: &mut [f32],
    stride: usize,
    ahead: *const u8,
) {
    by_passes!(cols_tile, [1, 2, 3], 4, qs, page, n, g, out, stride, ahead);
}

/// Scores of `H` query rows (`qp`, `H × d`) against the 16 slots from `first` of an f16 column
/// key page (`kp`: the slots' value `t` at `kp + t·64 + 2·first`, 32 bytes), the first `lanes`
/// of them written to `op[j·stride + s]`. Eight chains a head pair keep the FMA unit busy.
// `j` indexes the query rows and the accumulators at once.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn cols_tile<const H: usize>(
    qp: *const f32,
    kp: *const u8,
    first: usize,
    d: usize,
    op: *mut f32,
    stride: usize,
    lanes: usize,
    ahead: *const u8,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; H];
    for t in 0..d {
        prefetch_line(ahead, t * 64);
        let line = kp.add(t * 64 + 2 * first);
        let k0 = _mm256_cvtph_ps(_mm_loadu_si128(line as *const __m128i));
        let k1 = _mm256_cvtph_ps(_mm_loadu_si128(line.add(16) as *const __m128i));
        for j in 0..H {
            let q = _mm256_broadcast_ss(&*qp.add(j * d + t));
            acc[j][0] = _mm256_fmadd_ps(q, k0, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(q, k1, acc[j][1]);
        }
    }
    for j in 0..H {
        let o = op.add(j * stride);
        if lanes == 16 {
            _mm256_storeu_ps(o, acc[j][0]);
            _mm256_storeu_ps(o.add(8), acc[j][1]);
        } else {
            let mut tmp = [0f32; 16];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc[j][0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc[j][1]);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), o, lanes);
        }
    }
}

/// AVX2 twin of [`super::attention::dots`] for a Q8_0 key page (stored by column, block by
/// block: see [`Q8_KEY_SECTION`]).
///
/// The page is scored 16 slots at a time (two registers a head), for up to 3 heads at once
/// (their block chains and scores fill 12 of the 16 registers): each half line of a block (16
/// of its slots' bytes of value `t`) is widened once for those heads; each (head, slot) lane is
/// the scalar kernel's chain over the block's values, then its multiply-add by the scale.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes must be as the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_q8(
    qs: &[f32],
    page: &[u8],
    n: usize,
    g: usize,
    out: &mut [f32],
    stride: usize,
    ahead: *const u8,
) {
    by_passes!(q8_cols_tile, [1, 2], 3, qs, page, n, g, out, stride, ahead);
}

/// Scores of `H` query rows (`qp`, `H × d`) against the 16 slots from `first` of a Q8_0 column
/// key page (`kp`), the first `lanes` of them written to `op[j·stride + s]`.
// `j` indexes the query rows and the accumulators at once.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn q8_cols_tile<const H: usize>(
    qp: *const f32,
    kp: *const u8,
    first: usize,
    d: usize,
    op: *mut f32,
    stride: usize,
    lanes: usize,
    ahead: *const u8,
) {
    let mut score = [[_mm256_setzero_ps(); 2]; H];
    for b in 0..d / 32 {
        let sec = kp.add(b * Q8_KEY_SECTION);
        prefetch_line(ahead, b * Q8_KEY_SECTION);
        let mut blk = [[_mm256_setzero_ps(); 2]; H];
        for t in 0..32 {
            if t % 2 == 0 {
                prefetch_line(ahead, b * Q8_KEY_SECTION + Q8_KEY_QS + 32 * t);
            }
            let line = sec.add(Q8_KEY_QS + 32 * t + first);
            let (b0, b1) = (
                _mm_loadl_epi64(line as *const __m128i),
                _mm_loadl_epi64(line.add(8) as *const __m128i),
            );
            let k0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b0));
            let k1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b1));
            for j in 0..H {
                let q = _mm256_broadcast_ss(&*qp.add(j * d + 32 * b + t));
                blk[j][0] = _mm256_fmadd_ps(q, k0, blk[j][0]);
                blk[j][1] = _mm256_fmadd_ps(q, k1, blk[j][1]);
            }
        }
        // Scales are 2 bytes a slot.
        let scales = sec.add(2 * first);
        let s0 = _mm256_cvtph_ps(_mm_loadu_si128(scales as *const __m128i));
        let s1 = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(16) as *const __m128i));
        for j in 0..H {
            score[j][0] = _mm256_fmadd_ps(blk[j][0], s0, score[j][0]);
            score[j][1] = _mm256_fmadd_ps(blk[j][1], s1, score[j][1]);
        }
    }
    for j in 0..H {
        let o = op.add(j * stride);
        if lanes == 16 {
            _mm256_storeu_ps(o, score[j][0]);
            _mm256_storeu_ps(o.add(8), score[j][1]);
        } else {
            let mut tmp = [0f32; 16];
            _mm256_storeu_ps(tmp.as_mut_ptr(), score[j][0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), score[j][1]);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), o, lanes);
        }
    }
}

/// AVX2 twin of [`super::attention::attend`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes must be as the safe wrapper checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend(
    kv: KvType,
    acc: &mut [f32],
    d: usize,
    w: &[f32],
    ws: usize,
    values: &[u8],
    rows: &[u32],
    ahead: *const u8,
) {
    if !d.is_multiple_of(8) {
        // Only odd test shapes get here: the models' head sizes are multiples of 32.
        return scalar::attend(kv, acc, d, w, ws, values, rows);
    }
    let g = acc.len() / d;
    let (ap, vp, rb) = (acc.as_mut_ptr(), values.as_ptr(), kv.row_bytes(d));
    let ahead = (ahead, PAGE_SLOTS * rb);
    dispatch!(kv, g, attend_g(ap, d, w.as_ptr(), ws, vp, rb, rows, ahead));
}

/// For each 8-wide slice of the head dimension (two at a time), the `G` heads' accumulators
/// stay in registers while every listed value row is widened once and added to all of them
/// with its per-head weight (`wp[j·ws + i]`). The page `ahead` (its first byte, or null, and
/// its length) is hinted in spread evenly over the row steps of every walk.
// `j` indexes the weights and both accumulator arrays at once.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_g<R: Row, const G: usize>(
    ap: *mut f32,
    d: usize,
    wp: *const f32,
    ws: usize,
    vp: *const u8,
    rb: usize,
    rows: &[u32],
    ahead: (*const u8, usize),
) {
    let pairs = if G <= 6 { d / 16 } else { 0 };
    let walks = pairs + (d - 16 * pairs) / 8;
    let hints = SpreadHints::new(ahead.0, ahead.1, walks * rows.len());
    // `c`: the walk's first value; `k`: its first hint step.
    let (mut c, mut k) = (0, 0);
    // Two slices need 2·G accumulators, two values and a weight in 16 registers: up to G = 6;
    // above that one slice at a time (an element's operations are the same either way).
    while G <= 6 && c + 16 <= d {
        let mut a = [[_mm256_setzero_ps(); G]; 2];
        for (h, a) in a.iter_mut().enumerate() {
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(ap.add(j * d + c + 8 * h));
            }
        }
        for (i, &r) in rows.iter().enumerate() {
            hints.at(k + i);
            let row = vp.add(r as usize * rb);
            let (v0, v1) = (R::load8(row, c), R::load8(row, c + 8));
            for j in 0..G {
                let wj = _mm256_broadcast_ss(&*wp.add(j * ws + i));
                a[0][j] = _mm256_fmadd_ps(wj, v0, a[0][j]);
                a[1][j] = _mm256_fmadd_ps(wj, v1, a[1][j]);
            }
        }
        for (h, a) in a.iter().enumerate() {
            for (j, a) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(j * d + c + 8 * h), *a);
            }
        }
        (c, k) = (c + 16, k + rows.len());
    }
    while c + 8 <= d {
        let mut a = [_mm256_setzero_ps(); G];
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(ap.add(j * d + c));
        }
        for (i, &r) in rows.iter().enumerate() {
            hints.at(k + i);
            let v = R::load8(vp.add(r as usize * rb), c);
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&*wp.add(j * ws + i)), v, *a);
            }
        }
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(ap.add(j * d + c), *a);
        }
        (c, k) = (c + 8, k + rows.len());
    }
}

/// `exp` of 8 lanes, as [`scalar::exp`] computes it lane by lane.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // Lanes below the floor (and -inf, NaN) give 0.
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP_FLOOR));
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_FLOOR)),
        _mm256_set1_ps(EXP_CEIL),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_setzero_ps();
    for c in POLY {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)))
}

/// AVX2 twin of [`super::attention::softmax_page`]: the scale and max 8 scores at a time, the
/// weights through the vector `exp` (the tail too, padded), and the sum in the 16 lanes of
/// slot `s % 16` (two vectors: slots `16b..16b + 8` and `16b + 8..16b + 16`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `slots`, if given, must be as long as `scores`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax_page(
    scores: &mut [f32],
    slots: Option<&[u32]>,
    scale: f32,
    max: &mut f32,
    sum: &mut f32,
) -> f32 {
    let (n, p) = (scores.len(), scores.as_mut_ptr());
    let vscale = _mm256_set1_ps(scale);
    let mut vm = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), vscale);
        _mm256_storeu_ps(p.add(i), x);
        vm = _mm256_max_ps(vm, x);
        i += 8;
    }
    for s in &mut scores[i..] {
        *s *= scale;
        vm = _mm256_max_ps(vm, _mm256_set1_ps(*s));
    }
    // The largest lane (a max is exact in any order).
    let m = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps::<1>(vm));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let page_max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let mut c = 1.0;
    if page_max > *max {
        c = (*max - page_max).exp();
        *sum *= c;
        *max = page_max;
    }
    let vmax = _mm256_set1_ps(*max);
    // Slot `s`'s weight goes to lane `s % 16`: with `slots` absent, score `i` is slot `i`.
    let mut lanes = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 8 <= n {
        let w = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vmax));
        _mm256_storeu_ps(p.add(i), w);
        lanes[i / 8 % 2] = _mm256_add_ps(lanes[i / 8 % 2], w);
        i += 8;
    }
    if i < n {
        // The tail through the same vector `exp`, so a weight's bits never depend on its
        // lane; the padding's weights are 0, which adds nothing.
        let mut tail = [f32::NEG_INFINITY; 8];
        tail[..n - i].copy_from_slice(&scores[i..]);
        let w = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), vmax));
        _mm256_storeu_ps(tail.as_mut_ptr(), w);
        scores[i..].copy_from_slice(&tail[..n - i]);
        lanes[i / 8 % 2] = _mm256_add_ps(lanes[i / 8 % 2], w);
    }
    let page_sum = match slots {
        None => hsum_ps(_mm256_add_ps(lanes[0], lanes[1])),
        slots => scalar::slot_sum(scores, slots),
    };
    *sum += page_sum;
    c
}

/// AVX2 twin of [`super::attention::page_step`] for one page: the scores go through memory (a
/// page's 32 slots for every head do not fit 16 registers), then the heads' softmax steps run
/// side by side (a step of [`softmax_page`] per head, one after the other, left each head's
/// reductions and `exp`s waiting on each other), then the weighted sum. The operations of
/// [`dots_f16`]/[`dots_q8`], [`softmax_page`] and [`attend`] lane by lane: the same bits.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `d` must be a multiple of 8 and the shapes as the
/// safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn page_step(
    kv: KvType,
    qs: &[f32],
    keys: &[u8],
    values: &[u8],
    n: usize,
    scale: f32,
    max: &mut [f32],
    sum: &mut [f32],
    acc: &mut [f32],
    ahead: (*const u8, *const u8),
) {
    let g = max.len();
    let d = qs.len() / g;
    let mut w = [0f32; PAGE_SLOTS * MAX_GROUP];
    match kv {
        KvType::F16 => dots_f16(qs, keys, n, g, &mut w, PAGE_SLOTS, ahead.0),
        KvType::Q8_0 => dots_q8(qs, keys, n, g, &mut w, PAGE_SLOTS, ahead.0),
    }
    let (wp, ap, vp, rb) = (
        w.as_mut_ptr(),
        acc.as_mut_ptr(),
        values.as_ptr(),
        kv.row_bytes(d),
    );
    let (mp, sp) = (max.as_mut_ptr(), sum.as_mut_ptr());
    let sums = (ap, d, vp, rb, (ahead.1, PAGE_SLOTS * rb));
    dispatch!(kv, g, step_g(wp, n, scale, mp, sp, sums));
}

/// [`page_step`] after the scores (`wp`, a row of [`PAGE_SLOTS`] a head) for `G` heads: each
/// head's softmax step over the first `n` as [`softmax_page`] takes it, the heads' vectors
/// one after the other in each step, then [`attend_g`] with `sums` (the accumulators, `d`, the
/// value page, its row size and the page to hint).
// `j` indexes the heads' rows, maxima and lane sums at once.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn step_g<R: Row, const G: usize>(
    wp: *mut f32,
    n: usize,
    scale: f32,
    mp: *mut f32,
    sp: *mut f32,
    sums: (*mut f32, usize, *const u8, usize, (*const u8, usize)),
) {
    let (ap, d, vp, rb, ahead) = sums;
    let (vscale, whole) = (_mm256_set1_ps(scale), n / 8 * 8);
    let row = |j: usize| wp.add(j * PAGE_SLOTS);
    let mut vm = [_mm256_set1_ps(f32::NEG_INFINITY); G];
    for i in (0..whole).step_by(8) {
        for j in 0..G {
            let x = _mm256_mul_ps(_mm256_loadu_ps(row(j).add(i)), vscale);
            _mm256_storeu_ps(row(j).add(i), x);
            vm[j] = _mm256_max_ps(vm[j], x);
        }
    }
    let mut vmax = [_mm256_setzero_ps(); G];
    for j in 0..G {
        for s in whole..n {
            let x = row(j).add(s);
            *x *= scale;
            vm[j] = _mm256_max_ps(vm[j], _mm256_set1_ps(*x));
        }
        let m = _mm_max_ps(
            _mm256_castps256_ps128(vm[j]),
            _mm256_extractf128_ps::<1>(vm[j]),
        );
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let page_max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let (max, sum) = (&mut *mp.add(j), &mut *sp.add(j));
        if page_max > *max {
            let c = (*max - page_max).exp();
            *sum *= c;
            *max = page_max;
            if c != 1.0 {
                for a in std::slice::from_raw_parts_mut(ap.add(j * d), d) {
                    *a *= c;
                }
            }
        }
        vmax[j] = _mm256_set1_ps(*max);
    }
    let mut lanes = [[_mm256_setzero_ps(); 2]; G];
    for i in (0..whole).step_by(8) {
        for j in 0..G {
            let w = exp8(_mm256_sub_ps(_mm256_loadu_ps(row(j).add(i)), vmax[j]));
            _mm256_storeu_ps(row(j).add(i), w);
            lanes[j][i / 8 % 2] = _mm256_add_ps(lanes[j][i / 8 % 2], w);
        }
    }
    for j in 0..G {
        if whole < n {
            // The tail as `softmax_page` takes it: padded with -inf, weights 0.
            let mut tail = [f32::NEG_INFINITY; 8];
            std::ptr::copy_nonoverlapping(row(j).add(whole), tail.as_mut_ptr(), n - whole);
            let w = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), vmax[j]));
            _mm256_storeu_ps(tail.as_mut_ptr(), w);
            std::ptr::copy_nonoverlapping(tail.as_ptr(), row(j).add(whole), n - whole);
            lanes[j][whole / 8 % 2] = _mm256_add_ps(lanes[j][whole / 8 % 2], w);
        }
        *sp.add(j) += hsum_ps(_mm256_add_ps(lanes[j][0], lanes[j][1]));
    }
    attend_g::<R, G>(ap, d, wp, PAGE_SLOTS, vp, rb, &PAGE_ROWS[..n], ahead);
}
