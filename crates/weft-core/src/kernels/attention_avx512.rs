//! AVX-512 (F) twins of the score, softmax and weighted-sum kernels in `attention`, on 512-bit
//! registers: 16 lanes a step and 32 registers, so twice the multiply-adds of the AVX2 twins
//! per instruction (prefill attention is bound by them).
//!
//! A value row is widened 16 values at a time: f16 with `vcvtph2ps`, Q8_0 by sign-extending 16
//! bytes (half a block) and multiplying by the block's scale. Head sizes that are not a
//! multiple of 16 (only odd test shapes) take the AVX2 twins; a key page (by column, f16 or
//! Q8_0) is read 32 slots at a time whatever the head size.
//!
//! The weighted sum adds each value row to an element with the same fused multiply-add, in the
//! same row order, as the AVX2 twin: its results have the same bits, and so have the scores
//! (the same chains a lane); a score never depends on how many heads or keys share the call.
//! [`page_step`] runs the three on a page with the scores kept in registers in between.

use std::arch::x86_64::*;

use super::attention::exp_consts::*;
use super::attention::{
    scalar, KvType, PAGE_ROWS, PAGE_SLOTS, Q8_BLOCK, Q8_KEY_QS, Q8_KEY_SECTION,
};
use super::attention_avx2;
use super::x86::{hsum_ps, prefetch_line, SpreadHints};

/// How a row type is widened, 16 values at a time.
trait Row16 {
    /// Values `i..i + 16` of the row at `p` (`i` a multiple of 16).
    unsafe fn load16(p: *const u8, i: usize) -> __m512;
}

struct F16Row;
struct Q8Row;

impl Row16 for F16Row {
    #[inline(always)]
    unsafe fn load16(p: *const u8, i: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
    }
}

impl Row16 for Q8Row {
    #[inline(always)]
    unsafe fn load16(p: *const u8, i: usize) -> __m512 {
        let b = p.add(i / 32 * Q8_BLOCK);
        let d = _mm512_cvtph_ps(_mm256_set1_epi16((b as *const i16).read_unaligned()));
        let q = _mm_loadu_si128(b.add(2 + i % 32) as *const __m128i);
        _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))
    }
}

/// The sum of the 16 lanes: the two halves added, then as [`hsum_ps`] (a fixed order).
#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

/// Calls `$f::<..., G, V>(args)` for `G` the `$g` query rows and `V` the 16-slot registers a
/// row needs for `$n` slots of a column key page (f16 or Q8_0): the whole page in two, or its
/// first 16 slots in one (a prefill's page on the diagonal, a partial last page).
macro_rules! by_shape {
    ($g:expr, $n:expr, $f:ident::<$($t:ty),*>($($a:expr),*)) => {{
        macro_rules! by_group {
            ($v:literal) => {
                match $g {
                    1 => $f::<$($t,)* 1, $v>($($a),*),
                    2 => $f::<$($t,)* 2, $v>($($a),*),
                    3 => $f::<$($t,)* 3, $v>($($a),*),
                    4 => $f::<$($t,)* 4, $v>($($a),*),
                    5 => $f::<$($t,)* 5, $v>($($a),*),
                    6 => $f::<$($t,)* 6, $v>($($a),*),
                    7 => $f::<$($t,)* 7, $v>($($a),*),
                    8 => $f::<$($t,)* 8, $v>($($a),*),
                    g => panic!("attention kernels take 1 to 8 heads, got {g}"),
                }
            };
        }
        match $n {
            0 => {}
            1..=16 => by_group!(1),
            _ => by_group!(2),
        }
    }};
}

/// How a column key page is scored: the scores of `G` query rows (`qp`, `G × d`) against the
/// first `16·V` slots of the page at `kp`, in registers (row `j`, slots `16v..16v + 16` in
/// `[j][v]`), hinting the page at `ahead` in as the same lines of this one are read.
trait KeyCols {
    unsafe fn scores<const G: usize, const V: usize>(
        qp: *const f32,
        kp: *const u8,
        d: usize,
        ahead: *const u8,
    ) -> [[__m512; V]; G];
}

struct F16Cols;
struct Q8Cols;

impl KeyCols for F16Cols {
    /// Each line of the page (the 32 slots' value `t`) is widened once, into two registers,
    /// for all the heads; each (head, slot) lane is one multiply-add chain over `t` in order —
    /// the scalar kernel's chain, so the scores have its bits. Two chains a head: six for
    /// SmolLM2's three-head groups, short of the eight the FMA units could overlap, but twelve
    /// (two pages side by side, or two chains a lane) made its whole page step at most 4%
    /// faster. A page costs `d·g/8` multiply-adds and `2d` conversions, and no horizontal sums.
    // `j`, `v` index the query rows, the slot halves and the accumulators at once.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn scores<const G: usize, const V: usize>(
        qp: *const f32,
        kp: *const u8,
        d: usize,
        ahead: *const u8,
    ) -> [[__m512; V]; G] {
        let mut acc = [[_mm512_setzero_ps(); V]; G];
        for t in 0..d {
            // The next page's line `t` as this page's is read.
            prefetch_line(ahead, t * 64);
            let line = kp.add(t * 64);
            let mut k = [_mm512_setzero_ps(); V];
            for v in 0..V {
                k[v] = _mm512_cvtph_ps(_mm256_loadu_si256(line.add(32 * v) as *const __m256i));
            }
            for j in 0..G {
                let q = _mm512_set1_ps(*qp.add(j * d + t));
                for v in 0..V {
                    acc[j][v] = _mm512_fmadd_ps(q, k[v], acc[j][v]);
                }
            }
        }
        acc
    }
}

impl KeyCols for Q8Cols {
    /// Each half line of a block (the 32 slots' byte of value `t`) is widened once, into two
    /// registers, for all the heads; each (head, slot) lane is a multiply-add chain over the
    /// block's 32 values, then one multiply-add by the slots' scales into the score — the
    /// scalar kernel's operations, so the scores have its bits. No horizontal sums.
    // `j`, `v` index the query rows, the slot halves and the accumulators at once.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn scores<const G: usize, const V: usize>(
        qp: *const f32,
        kp: *const u8,
        d: usize,
        ahead: *const u8,
    ) -> [[__m512; V]; G] {
        let mut score = [[_mm512_setzero_ps(); V]; G];
        for b in 0..d / 32 {
            let sec = kp.add(b * Q8_KEY_SECTION);
            // The next page's scales, then a line for every two values `t`, as this page's
            // are read.
            prefetch_line(ahead, b * Q8_KEY_SECTION);
            let mut blk = [[_mm512_setzero_ps(); V]; G];
            for t in 0..32 {
                if t % 2 == 0 {
                    prefetch_line(ahead, b * Q8_KEY_SECTION + Q8_KEY_QS + 32 * t);
                }
                let line = sec.add(Q8_KEY_QS + 32 * t);
                let mut k = [_mm512_setzero_ps(); V];
                for v in 0..V {
                    let bytes = _mm_loadu_si128(line.add(16 * v) as *const __m128i);
                    k[v] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
                }
                for j in 0..G {
                    let q = _mm512_set1_ps(*qp.add(j * d + 32 * b + t));
                    for v in 0..V {
                        blk[j][v] = _mm512_fmadd_ps(q, k[v], blk[j][v]);
                    }
                }
            }
            for v in 0..V {
                let scale = _mm512_cvtph_ps(_mm256_loadu_si256(sec.add(32 * v) as *const __m256i));
                for j in 0..G {
                    score[j][v] = _mm512_fmadd_ps(blk[j][v], scale, score[j][v]);
                }
            }
        }
        score
    }
}

/// AVX-512 twin of [`super::attention::dots`] for an f16 key page (stored by column; see
/// [`F16Cols`]).
///
/// # Safety
/// The CPU must support AVX-512 F and VL besides AVX2, FMA and F16C; the shapes must be as
/// the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub unsafe fn dots_f16(
    qs: &[f32],
    page: &[u8],
    n: usize,
    g: usize,
    out: &mut [f32],
    stride: usize,
    ahead: *const u8,
) {
    let (qp, kp, op, d) = (qs.as_ptr(), page.as_ptr(), out.as_mut_ptr(), qs.len() / g);
    by_shape!(g, n, cols_tile::<F16Cols>(qp, kp, d, op, stride, n, ahead));
}

/// AVX-512 twin of [`super::attention::dots`] for a Q8_0 key page (stored by column, block
/// by block: see [`Q8_KEY_SECTION`] and [`Q8Cols`]).
///
/// # Safety
/// The CPU must support AVX-512 F and VL besides AVX2, FMA and F16C; the shapes must be as
/// the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub unsafe fn dots_q8(
    qs: &[f32],
    page: &[u8],
    n: usize,
    g: usize,
    out: &mut [f32],
    stride: usize,
    ahead: *const u8,
) {
    let (qp, kp, op, d) = (qs.as_ptr(), page.as_ptr(), out.as_mut_ptr(), qs.len() / g);
    by_shape!(g, n, cols_tile::<Q8Cols>(qp, kp, d, op, stride, n, ahead));
}

/// The scores of `G` query rows (`qp`, `G × d`) against the first `16·V` slots of a column key
/// page (`kp`), the first `n` of them written to `op[j·stride + s]`.
#[inline(always)]
unsafe fn cols_tile<K: KeyCols, const G: usize, const V: usize>(
    qp: *const f32,
    kp: *const u8,
    d: usize,
    op: *mut f32,
    stride: usize,
    n: usize,
    ahead: *const u8,
) {
    let acc = K::scores::<G, V>(qp, kp, d, ahead);
    for (j, acc) in acc.iter().enumerate() {
        let o = op.add(j * stride);
        if n == 16 * V {
            for (v, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(16 * v), a);
            }
        } else {
            let mut tmp = [0f32; 32];
            for (v, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(tmp.as_mut_ptr().add(16 * v), a);
            }
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), o, n);
        }
    }
}

/// AVX-512 twin of [`super::attention::attend`] (bit for bit the AVX2 twin's results).
///
/// # Safety
/// The CPU must support AVX-512 F and VL besides AVX2, FMA and F16C; the shapes must be as
/// the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(clippy::too_many_arguments)]
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
    if !d.is_multiple_of(16) {
        return attention_avx2::attend(kv, acc, d, w, ws, values, rows, ahead);
    }
    let g = acc.len() / d;
    let (ap, vp, wp, rb) = (
        acc.as_mut_ptr(),
        values.as_ptr(),
        w.as_ptr(),
        kv.row_bytes(d),
    );
    let ahead = (ahead, PAGE_SLOTS * rb);
    macro_rules! by_group {
        ($r:ty) => {
            match g {
                1 => attend_g::<$r, 1>(ap, d, wp, ws, vp, rb, rows, ahead),
                2 => attend_g::<$r, 2>(ap, d, wp, ws, vp, rb, rows, ahead),
                3 => attend_g::<$r, 3>(ap, d, wp, ws, vp, rb, rows, ahead),
                4 => attend_g::<$r, 4>(ap, d, wp, ws, vp, rb, rows, ahead),
                5 => attend_g::<$r, 5>(ap, d, wp, ws, vp, rb, rows, ahead),
                6 => attend_g::<$r, 6>(ap, d, wp, ws, vp, rb, rows, ahead),
                7 => attend_g::<$r, 7>(ap, d, wp, ws, vp, rb, rows, ahead),
                8 => attend_g::<$r, 8>(ap, d, wp, ws, vp, rb, rows, ahead),
                g => panic!("attention kernels take 1 to 8 heads, got {g}"),
            }
        };
    }
    match kv {
        KvType::F16 => by_group!(F16Row),
        KvType::Q8_0 => by_group!(Q8Row),
    }
}

/// For each 16-wide slice of the head dimension (`S` at a time: 4 for up to 4 heads, else 2,
/// so the `S·G` accumulators fit 32 registers beside a row), the `G` heads' accumulators stay
/// in registers while every listed value row is widened once and added to all of them with
/// its per-head weight (`wp[j·ws + i]`, broadcast once for the `S` slices). Walking the rows
/// once per 64 values rather than per 32 halves the broadcasts and the row walks (SmolLM2's
/// 64-value heads: one walk).
///
/// `ahead` is a page (its first byte, or null, and its length) to hint in, spread evenly over
/// the row steps of every walk: a decode passes the next page's values, so they stream in
/// while this page's are summed (see [`super::attention::attend`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_g<R: Row16, const G: usize>(
    ap: *mut f32,
    d: usize,
    wp: *const f32,
    ws: usize,
    vp: *const u8,
    rb: usize,
    rows: &[u32],
    ahead: (*const u8, usize),
) {
    let wide = if G <= 4 { d / 64 } else { 0 };
    let walks = wide + (d - 64 * wide) / 32 + (d % 32) / 16;
    let hints = SpreadHints::new(ahead.0, ahead.1, walks * rows.len());
    // `c`: the walk's first value; `k`: its first hint step.
    let (mut c, mut k) = (0, 0);
    if G <= 4 {
        while c + 64 <= d {
            attend_slices::<R, G, 4>(ap.add(c), d, wp, ws, vp, rb, rows, c, &hints, k);
            (c, k) = (c + 64, k + rows.len());
        }
    }
    while c + 32 <= d {
        attend_slices::<R, G, 2>(ap.add(c), d, wp, ws, vp, rb, rows, c, &hints, k);
        (c, k) = (c + 32, k + rows.len());
    }
    if c < d {
        // One 16-wide slice left (d is a multiple of 16).
        attend_slices::<R, G, 1>(ap.add(c), d, wp, ws, vp, rb, rows, c, &hints, k);
    }
}

/// [`attend_g`] for the `S` slices from value `c` (`ap` at the first head's value `c`); row
/// `i` takes hint step `k0 + i`.
// `j` indexes the weights and the accumulators at once.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_slices<R: Row16, const G: usize, const S: usize>(
    ap: *mut f32,
    d: usize,
    wp: *const f32,
    ws: usize,
    vp: *const u8,
    rb: usize,
    rows: &[u32],
    c: usize,
    hints: &SpreadHints,
    k0: usize,
) {
    let mut a = [[_mm512_setzero_ps(); G]; S];
    for (h, a) in a.iter_mut().enumerate() {
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(ap.add(j * d + 16 * h));
        }
    }
    for (i, &r) in rows.iter().enumerate() {
        hints.at(k0 + i);
        let row = vp.add(r as usize * rb);
        let mut v = [_mm512_setzero_ps(); S];
        for (h, v) in v.iter_mut().enumerate() {
            *v = R::load16(row, c + 16 * h);
        }
        for j in 0..G {
            let wj = _mm512_set1_ps(*wp.add(j * ws + i));
            for h in 0..S {
                a[h][j] = _mm512_fmadd_ps(wj, v[h], a[h][j]);
            }
        }
    }
    for (h, a) in a.iter().enumerate() {
        for (j, a) in a.iter().enumerate() {
            _mm512_storeu_ps(ap.add(j * d + 16 * h), *a);
        }
    }
}

/// `exp` of 16 lanes: the operations of `attention_avx2`'s `exp8` (and [`scalar::exp`]'s
/// formula) lane by lane, so a weight has the same bits in both sets.
#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    // Lanes below the floor (and -inf, NaN) give 0.
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_FLOOR));
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_FLOOR)),
        _mm512_set1_ps(EXP_CEIL),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_setzero_ps();
    for c in POLY {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let two_n = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(two_n))
}

/// AVX-512 twin of [`super::attention::softmax_page`] (the bits of the AVX2 twin): 16 scores
/// at a time, the tail through masked loads and stores, the sum in the 16 lanes of slot
/// `s % 16`.
///
/// # Safety
/// The CPU must support AVX-512 F besides AVX2, FMA and F16C; `slots`, if given, must be as
/// long as `scores`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub unsafe fn softmax_page(
    scores: &mut [f32],
    slots: Option<&[u32]>,
    scale: f32,
    max: &mut f32,
    sum: &mut f32,
) -> f32 {
    let (n, p) = (scores.len(), scores.as_mut_ptr());
    let vscale = _mm512_set1_ps(scale);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    // The 16 scores from `i`, the tail's missing ones -inf; and back (plain loads and stores
    // but in the tail). Macros, not closures: a closure would not inherit the target features.
    macro_rules! load {
        ($i:expr) => {
            if $i + 16 <= n {
                _mm512_loadu_ps(p.add($i))
            } else {
                _mm512_mask_loadu_ps(ninf, ((1u32 << (n - $i)) - 1) as __mmask16, p.add($i))
            }
        };
    }
    macro_rules! store {
        ($i:expr, $x:expr) => {
            if $i + 16 <= n {
                _mm512_storeu_ps(p.add($i), $x)
            } else {
                _mm512_mask_storeu_ps(p.add($i), ((1u32 << (n - $i)) - 1) as __mmask16, $x)
            }
        };
    }
    let mut vm = ninf;
    let mut i = 0;
    while i < n {
        let x = _mm512_mul_ps(load!(i), vscale);
        store!(i, x);
        vm = _mm512_max_ps(vm, x);
        i += 16;
    }
    let page_max = _mm512_reduce_max_ps(vm);
    let mut c = 1.0;
    if page_max > *max {
        c = (*max - page_max).exp();
        *sum *= c;
        *max = page_max;
    }
    let vmax = _mm512_set1_ps(*max);
    // Slot `s`'s weight goes to lane `s % 16`: with `slots` absent, score `i` is slot `i`
    // (the tail's padding weighs 0, which adds nothing).
    let mut lanes = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let w = exp16(_mm512_sub_ps(load!(i), vmax));
        store!(i, w);
        lanes = _mm512_add_ps(lanes, w);
        i += 16;
    }
    let page_sum = match slots {
        // Lanes `l` and `l + 8`, then as `hsum_ps` (the order of the AVX2 twin).
        None => hsum512(lanes),
        slots => scalar::slot_sum(scores, slots),
    };
    *sum += page_sum;
    c
}

/// AVX-512 twin of [`super::attention::page_step`]: the scores of the `g` heads stay in
/// registers through their softmax step (the heads' steps side by side, so their reductions
/// and `exp`s overlap rather than run one head after the other), and only the weights go
/// through memory, to be broadcast by the weighted sum. The operations of
/// [`dots_f16`]/[`dots_q8`], [`softmax_page`] and [`attend`] lane by lane: the same bits.
///
/// # Safety
/// The CPU must support AVX-512 F and VL besides AVX2, FMA and F16C; `d` must be a multiple
/// of 16 and the shapes as the safe wrapper checks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
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
    let (g, rb) = (max.len(), kv.row_bytes(qs.len() / max.len()));
    let (qp, kp, vp, d) = (qs.as_ptr(), keys.as_ptr(), values.as_ptr(), qs.len() / g);
    let (mp, sp, ap) = (max.as_mut_ptr(), sum.as_mut_ptr(), acc.as_mut_ptr());
    let args = (qp, kp, vp, rb, d, n, scale);
    match kv {
        KvType::F16 => by_shape!(g, n, step::<F16Cols, F16Row>(args, mp, sp, ap, ahead)),
        KvType::Q8_0 => by_shape!(g, n, step::<Q8Cols, Q8Row>(args, mp, sp, ap, ahead)),
    }
}

/// [`page_step`] for `G` heads and `16·V` slots: `args` are the query rows, the key and value
/// pages, the value row size, `d`, `n` and the scale.
// `j`, `v` index the heads, the slot halves and their registers at once.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn step<K: KeyCols, R: Row16, const G: usize, const V: usize>(
    args: (*const f32, *const u8, *const u8, usize, usize, usize, f32),
    mp: *mut f32,
    sp: *mut f32,
    ap: *mut f32,
    ahead: (*const u8, *const u8),
) {
    let (qp, kp, vp, rb, d, n, scale) = args;
    let scores = K::scores::<G, V>(qp, kp, d, ahead.0);
    // As `softmax_page`: the slots past `n` score -inf, each score is scaled, the page's max
    // taken; then each head's max and sum move to the page's, and its weights are
    // `exp(score - max)`, summed in the 16 lanes.
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (vscale, tail) = (_mm512_set1_ps(scale), (n - 16 * (V - 1)) as u32);
    let mut w = [[0f32; PAGE_SLOTS]; G];
    for j in 0..G {
        let mut x = scores[j];
        let mut vm = ninf;
        for v in 0..V {
            if v == V - 1 && tail < 16 {
                x[v] = _mm512_mask_mov_ps(ninf, ((1u32 << tail) - 1) as __mmask16, x[v]);
            }
            x[v] = _mm512_mul_ps(x[v], vscale);
            vm = _mm512_max_ps(vm, x[v]);
        }
        let (max, sum) = (&mut *mp.add(j), &mut *sp.add(j));
        let page_max = _mm512_reduce_max_ps(vm);
        if page_max > *max {
            let c = (*max - page_max).exp();
            *sum *= c;
            *max = page_max;
            for a in std::slice::from_raw_parts_mut(ap.add(j * d), d) {
                *a *= c;
            }
        }
        let vmax = _mm512_set1_ps(*max);
        let mut lanes = _mm512_setzero_ps();
        for v in 0..V {
            let wv = exp16(_mm512_sub_ps(x[v], vmax));
            _mm512_storeu_ps(w[j].as_mut_ptr().add(16 * v), wv);
            lanes = _mm512_add_ps(lanes, wv);
        }
        *sum += hsum512(lanes);
    }
    let ahead = (ahead.1, PAGE_SLOTS * rb);
    let wp = w.as_ptr() as *const f32;
    attend_g::<R, G>(ap, d, wp, PAGE_SLOTS, vp, rb, &PAGE_ROWS[..n], ahead);
}
