//! The kernels of attention over the KV cache: scores of a group of query heads against a page
//! of keys, the online-softmax step of one head over a page, and the weighted sum of value rows.
//!
//! Keys and values are stored as [`KvType`] says: f16 (llama.cpp's default cache) or Q8_0
//! (ggml's `block_q8_0`: per 32 values an f16 scale and 32 signed bytes, 34 bytes instead of
//! 64), read as raw bytes, [`PAGE_SLOTS`] keys or values of one KV head to a page.
//!
//! Values are rows (a weighted sum adds whole rows). An f16 key page is stored by *column*:
//! value `t` of the key in slot `s` at element `t·PAGE_SLOTS + s`, so the page's 32 values `t`
//! fill one 64-byte line and a key's score is one lane of a vector — a dot product is a
//! chain of multiply-adds down the lane, with no horizontal sums at the end (they were a third
//! of the score kernel's cycles for SmolLM2's 64-value heads). Every kernel set makes the same
//! chain, `t` in order, so f16 scores have the same bits in every set and never depend on the
//! other keys or heads of the call. A Q8_0 key page is stored by column too, block by block
//! (see [`Q8_KEY_SECTION`]): for each block of 32 values, the page's 32 scales, then its 32
//! slots' bytes of value `t` in a half line for each `t`. A lane's score is a chain of
//! multiply-adds over the block's 32 values, then one multiply-add by the key's scale into the
//! score, block after block: again no horizontal sums, and the same bits in every set (the
//! keys as rows took 2.25× the f16 kernel's time, most of it reducing lanes).
//! [`write_key`] and [`key_value`] know the layouts; snapshots keep keys as rows
//! ([`key_page_to_rows`], [`key_rows_to_page`]).

use std::str::FromStr;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::{attention_avx2, attention_avx512};
use super::{use_avx2, use_avx512};

/// Keys (or values) of one KV head in a page of the cache.
pub const PAGE_SLOTS: usize = 32;

/// Most query heads one call takes (the heads sharing a KV head in GQA, or a part of them).
pub const MAX_GROUP: usize = 8;

/// How the KV cache stores a key or value row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// IEEE half precision, 2 bytes a value (llama.cpp's default).
    #[default]
    F16,
    /// ggml's Q8_0: blocks of 32 values as one f16 scale and 32 signed bytes (8.5 bits a
    /// value). The row length must be a multiple of 32.
    Q8_0,
}

impl KvType {
    /// Bytes of one row of `d` values (for Q8_0, `d` a multiple of 32).
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            KvType::F16 => 2 * d,
            KvType::Q8_0 => d / 32 * Q8_BLOCK,
        }
    }

    /// Whether rows of `d` values can be stored in this type.
    pub fn fits(self, d: usize) -> bool {
        match self {
            KvType::F16 => true,
            KvType::Q8_0 => d.is_multiple_of(32),
        }
    }

    /// The name `--kv-type` takes and ggml uses: `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<KvType, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            other => Err(format!(
                "unknown KV cache type {other:?} (expected f16 or q8_0)"
            )),
        }
    }
}

/// Bytes of one Q8_0 block: an f16 scale and 32 signed bytes.
pub(crate) use crate::quant::blocks::Q8_0_BYTES as Q8_BLOCK;

/// Bytes of block `b`'s section of a Q8_0 key page (at `b · Q8_KEY_SECTION`): the
/// [`PAGE_SLOTS`] slots' f16 scales (slot `s` at `2s`), then for each of the block's 32 values
/// `t` the slots' signed bytes (slot `s` at `Q8_KEY_QS + 32t + s`). As many bytes as the
/// page's 32 rows' blocks `b`.
pub const Q8_KEY_SECTION: usize = PAGE_SLOTS * Q8_BLOCK;

/// Offset of the bytes in a [`Q8_KEY_SECTION`]: after the scales.
pub const Q8_KEY_QS: usize = 2 * PAGE_SLOTS;

/// For every byte of slot `s`'s row in a Q8_0 key page of `d`-value keys: its offset in the
/// page's keys as rows (`s · row_bytes + …`) and in the page itself.
fn q8_key_offsets(d: usize) -> impl Iterator<Item = (usize, usize)> {
    let rb = KvType::Q8_0.row_bytes(d);
    (0..PAGE_SLOTS).flat_map(move |s| {
        (0..d / 32).flat_map(move |b| {
            let (row, sec) = (s * rb + b * Q8_BLOCK, b * Q8_KEY_SECTION);
            let scale = (0..2).map(move |i| (row + i, sec + 2 * s + i));
            let qs = (0..32).map(move |t| (row + 2 + t, sec + Q8_KEY_QS + 32 * t + s));
            scale.chain(qs)
        })
    })
}

/// Stores the row `x` as `kv` into `out` (`kv.row_bytes(x.len())` bytes). Q8_0 is the
/// activation quantizer of matmul ([`super::quantize::quantize_row_q8_0`], ggml's x86
/// rounding, as llama.cpp writes its own Q8_0 cache on x86) packed into `block_q8_0` bytes.
///
/// # Panics
/// If `out` has the wrong length or `kv` cannot hold `x.len()` values.
pub fn quantize_row(kv: KvType, x: &[f32], out: &mut [u8]) {
    assert!(
        kv.fits(x.len()) && out.len() == kv.row_bytes(x.len()),
        "quantize_row: shape mismatch"
    );
    match kv {
        KvType::F16 => super::f32_to_f16_bytes(x, out),
        KvType::Q8_0 => {
            // Up to 8 blocks per quantizer call (a head of up to 256 values at once).
            let (mut qs, mut d) = ([0i8; 256], [0f32; 8]);
            for (o, xs) in out.chunks_mut(8 * Q8_BLOCK).zip(x.chunks(256)) {
                let (qs, d) = (&mut qs[..xs.len()], &mut d[..xs.len() / 32]);
                super::quantize::quantize_row_q8_0(xs, qs, d);
                for ((o, qb), &db) in o
                    .chunks_exact_mut(Q8_BLOCK)
                    .zip(qs.chunks_exact(32))
                    .zip(&*d)
                {
                    // `db` is already rounded to f16, so this conversion is exact.
                    o[..2].copy_from_slice(&f16::from_f32(db).to_le_bytes());
                    for (b, &q) in o[2..].iter_mut().zip(qb) {
                        *b = q as u8;
                    }
                }
            }
        }
    }
}

/// Element `i` of a row stored as `kv`.
#[inline]
pub fn row_value(kv: KvType, row: &[u8], i: usize) -> f32 {
    match kv {
        KvType::F16 => f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32(),
        KvType::Q8_0 => {
            let b = &row[i / 32 * Q8_BLOCK..];
            f16::from_le_bytes([b[0], b[1]]).to_f32() * f32::from(b[2 + i % 32] as i8)
        }
    }
}

/// Stores the key `x` in slot `slot` of the key page `page` (one KV head's [`PAGE_SLOTS`] keys
/// of `x.len()` values, laid out as the module doc says), rounded to `kv`.
///
/// # Panics
/// If `page` is not a key page of `x.len()`-value keys of `kv`, or `slot` is past its end.
pub fn write_key(kv: KvType, x: &[f32], page: &mut [u8], slot: usize) {
    let rb = kv.row_bytes(x.len());
    assert!(
        kv.fits(x.len()) && page.len() == PAGE_SLOTS * rb && slot < PAGE_SLOTS,
        "write_key: shape mismatch"
    );
    match kv {
        KvType::F16 => {
            // Rounded 256 values at a time by the vector converter, then spread down the
            // slot's column.
            let mut h = [0u8; 512];
            for (c, xs) in x.chunks(256).enumerate() {
                let h = &mut h[..2 * xs.len()];
                super::f32_to_f16_bytes(xs, h);
                for (i, v) in h.chunks_exact(2).enumerate() {
                    let at = 2 * ((256 * c + i) * PAGE_SLOTS + slot);
                    page[at..at + 2].copy_from_slice(v);
                }
            }
        }
        KvType::Q8_0 => {
            // Quantized 256 values (8 blocks) at a time, then each block spread into its
            // section: the scale, and a byte down each value's column.
            let mut row = [0u8; 8 * Q8_BLOCK];
            for (c, xs) in x.chunks(256).enumerate() {
                let row = &mut row[..xs.len() / 32 * Q8_BLOCK];
                quantize_row(kv, xs, row);
                for (i, blk) in row.chunks_exact(Q8_BLOCK).enumerate() {
                    let sec = &mut page[(8 * c + i) * Q8_KEY_SECTION..][..Q8_KEY_SECTION];
                    sec[2 * slot..2 * slot + 2].copy_from_slice(&blk[..2]);
                    for (t, &q) in blk[2..].iter().enumerate() {
                        sec[Q8_KEY_QS + 32 * t + slot] = q;
                    }
                }
            }
        }
    }
}

/// Value `t` of the key in slot `slot` of a key page of `d`-value keys stored as `kv`.
#[inline]
pub fn key_value(kv: KvType, page: &[u8], d: usize, slot: usize, t: usize) -> f32 {
    debug_assert!(
        t < d && slot < PAGE_SLOTS,
        "key_value: no value {t} in slot {slot}"
    );
    match kv {
        KvType::F16 => row_value(kv, page, t * PAGE_SLOTS + slot),
        KvType::Q8_0 => {
            let sec = &page[t / 32 * Q8_KEY_SECTION..];
            let scale = f16::from_le_bytes([sec[2 * slot], sec[2 * slot + 1]]).to_f32();
            scale * f32::from(sec[Q8_KEY_QS + 32 * (t % 32) + slot] as i8)
        }
    }
}

/// Copies the key page `page` (`d`-value keys stored as `kv`) to `rows`: its [`PAGE_SLOTS`]
/// keys as rows, one after the other, the layout of values (and of a snapshot's keys).
///
/// # Panics
/// If `page` or `rows` is not one page long.
pub fn key_page_to_rows(kv: KvType, d: usize, page: &[u8], rows: &mut [u8]) {
    let n = PAGE_SLOTS * kv.row_bytes(d);
    assert!(
        page.len() == n && rows.len() == n,
        "key_page_to_rows: shape mismatch"
    );
    match kv {
        KvType::F16 => {
            for (r, p) in f16_key_offsets(d) {
                rows[r..r + 2].copy_from_slice(&page[p..p + 2]);
            }
        }
        KvType::Q8_0 => {
            for (r, p) in q8_key_offsets(d) {
                rows[r] = page[p];
            }
        }
    }
}

/// The inverse of [`key_page_to_rows`]: stores [`PAGE_SLOTS`] key rows as a key page.
///
/// # Panics
/// If `rows` or `page` is not one page long.
pub fn key_rows_to_page(kv: KvType, d: usize, rows: &[u8], page: &mut [u8]) {
    let n = PAGE_SLOTS * kv.row_bytes(d);
    assert!(
        page.len() == n && rows.len() == n,
        "key_rows_to_page: shape mismatch"
    );
    match kv {
        KvType::F16 => {
            for (r, p) in f16_key_offsets(d) {
                page[p..p + 2].copy_from_slice(&rows[r..r + 2]);
            }
        }
        KvType::Q8_0 => {
            for (r, p) in q8_key_offsets(d) {
                page[p] = rows[r];
            }
        }
    }
}

/// For every value `t` of every slot `s` of an f16 key page of `d`-value keys: its byte offset
/// in the page's keys as rows (`s·d + t`) and in the page itself (`t·PAGE_SLOTS + s`).
fn f16_key_offsets(d: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..PAGE_SLOTS)
        .flat_map(move |s| (0..d).map(move |t| (2 * (s * d + t), 2 * (t * PAGE_SLOTS + s))))
}

/// `ahead` as the x86 kernels take it: the first byte to prefetch, or null for none.
#[cfg(target_arch = "x86_64")]
fn ahead_ptr(ahead: &[u8]) -> *const u8 {
    if ahead.is_empty() {
        std::ptr::null()
    } else {
        ahead.as_ptr()
    }
}

/// `out[j·stride + s] = Σ_t qs[j·d + t] · key_s[t]` for the slots `s < n` of the key page
/// `page` (one KV head's [`PAGE_SLOTS`] keys of `d` values, stored as `kv`): the scores of `g`
/// query heads (`qs`, `g × d`). A score has the same bits whatever `n`, `g` and the page's other
/// keys (see the module doc).
///
/// `ahead` is empty, or the key page that will be scored next (the next page of this head):
/// the SIMD kernels hint its lines in as they read the same lines of `page`, so the next page
/// streams in while this one is scored instead of in one burst that stalls. [`attend`] does the
/// same for the next page's values, so a decode's hints run all through its arithmetic.
///
/// # Panics
/// If `g` is not in `1..=MAX_GROUP`, `qs.len()` is not `g·d` with `d` storable as `kv`, `page`
/// is not one key page, `n > PAGE_SLOTS`, `out` is too short, or `ahead` is neither empty nor
/// one page.
#[allow(clippy::too_many_arguments)]
pub fn dots(
    kv: KvType,
    qs: &[f32],
    page: &[u8],
    n: usize,
    g: usize,
    out: &mut [f32],
    stride: usize,
    ahead: &[u8],
) {
    let d = qs.len() / g.max(1);
    let rb = kv.row_bytes(d);
    assert!(
        (1..=MAX_GROUP).contains(&g)
            && d > 0
            && qs.len() == g * d
            && kv.fits(d)
            && page.len() == PAGE_SLOTS * rb
            && n <= PAGE_SLOTS,
        "attention::dots: shape mismatch"
    );
    assert!(
        n == 0 || out.len() >= (g - 1) * stride + n,
        "attention::dots: output too short"
    );
    assert!(
        ahead.is_empty() || ahead.len() == page.len(),
        "attention::dots: `ahead` is not a page"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let ahead = ahead_ptr(ahead);
        match kv {
            // SAFETY (all four): the features were detected; the shapes are checked.
            KvType::F16 if use_avx512() => {
                return unsafe { attention_avx512::dots_f16(qs, page, n, g, out, stride, ahead) };
            }
            KvType::F16 if use_avx2() => {
                return unsafe { attention_avx2::dots_f16(qs, page, n, g, out, stride, ahead) };
            }
            KvType::Q8_0 if use_avx512() => {
                return unsafe { attention_avx512::dots_q8(qs, page, n, g, out, stride, ahead) };
            }
            KvType::Q8_0 if use_avx2() => {
                return unsafe { attention_avx2::dots_q8(qs, page, n, g, out, stride, ahead) };
            }
            _ => {}
        }
    }
    scalar::dots(kv, qs, page, n, g, out, stride)
}

/// `acc[j·d..][..d] += Σ_i w[j·ws + i] · values[rows[i]]` for the `g = acc.len() / d` heads:
/// attention's weighted sum of value rows (rows of `d` values stored as `kv`), with each
/// head's weights in a row of its own (`ws` apart).
///
/// `ahead` is empty, or the value page that will be summed next (the next page of this head):
/// the SIMD kernels hint its lines spread evenly over their row steps, as [`dots`] hints the
/// next keys. (Hinting the next values in bursts between the softmax steps instead, the SIMD
/// kernels then hinting nothing here, left the memory idle while this sum ran: Gemma 3's
/// decode attention from memory, one thread, took 53 ns a key against 36–40 on an AMD EPYC
/// Zen 5, SmolLM2's 10.1 against 9.7.)
///
/// # Panics
/// If `d` is 0 or not storable as `kv`, `acc.len()` is not `g·d` with `g` in range, `w` is too
/// short, a row is past the end of `values`, or `ahead` is neither empty nor one page.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    kv: KvType,
    acc: &mut [f32],
    d: usize,
    w: &[f32],
    ws: usize,
    values: &[u8],
    rows: &[u32],
    ahead: &[u8],
) {
    let g = acc.len() / d.max(1);
    assert!(
        d > 0 && kv.fits(d) && acc.len() == g * d && (1..=MAX_GROUP).contains(&g),
        "attention::attend: shape mismatch"
    );
    assert!(
        rows.is_empty() || w.len() >= (g - 1) * ws + rows.len(),
        "attention::attend: too few weights"
    );
    let rb = kv.row_bytes(d);
    assert!(
        rows.iter().all(|&r| (r as usize + 1) * rb <= values.len()),
        "attention::attend: value row out of range"
    );
    assert!(
        ahead.is_empty() || ahead.len() == PAGE_SLOTS * rb,
        "attention::attend: `ahead` is not a page"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let ahead = ahead_ptr(ahead);
        if use_avx512() {
            // SAFETY: AVX-512 F (with AVX2/FMA/F16C) was detected; shapes are checked.
            return unsafe { attention_avx512::attend(kv, acc, d, w, ws, values, rows, ahead) };
        }
        if use_avx2() {
            // SAFETY: AVX2/FMA/F16C were detected; shapes are checked.
            return unsafe { attention_avx2::attend(kv, acc, d, w, ws, values, rows, ahead) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ahead;
    scalar::attend(kv, acc, d, w, ws, values, rows)
}

/// Slot numbers of a whole page, `0..PAGE_SLOTS`: the rows of a page's weighted sum.
pub(crate) static PAGE_ROWS: [u32; PAGE_SLOTS] = {
    let mut rows = [0; PAGE_SLOTS];
    let mut s = 0;
    while s < PAGE_SLOTS {
        rows[s] = s as u32;
        s += 1;
    }
    rows
};

/// One page of attention for `g = max.len()` heads that see its slots `0..n` (no mask, no
/// bias): [`dots`] of the query rows `qs` (`g × d`) against `keys`, each head's
/// [`softmax_page`] step (scaled by `scale`; its running `max` and `sum`, its row of `acc`
/// multiplied by the step's factor), then the [`attend`] of `values` — the flash-attention
/// inner step. The results have the bits of those three calls; the heads' softmax steps run
/// side by side (the step per head, one after the other, was a fifth of a decode's attention
/// kernels on AVX-512: reductions and `exp`s waiting on each other), and on AVX-512 the scores
/// stay in registers through them. `ahead_keys` and `ahead_values` are as [`dots`] and
/// [`attend`] take them.
///
/// # Panics
/// If `g` is not in `1..=MAX_GROUP`, `sum`, `qs` or `acc` do not hold `g` rows (`d` values
/// each, `d` storable as `kv`), a page is not one page, or `n > PAGE_SLOTS`.
#[allow(clippy::too_many_arguments)]
pub fn page_step(
    kv: KvType,
    qs: &[f32],
    keys: &[u8],
    values: &[u8],
    n: usize,
    scale: f32,
    max: &mut [f32],
    sum: &mut [f32],
    acc: &mut [f32],
    ahead_keys: &[u8],
    ahead_values: &[u8],
) {
    let g = max.len();
    let d = qs.len() / g.max(1);
    let page = PAGE_SLOTS * kv.row_bytes(d);
    assert!(
        (1..=MAX_GROUP).contains(&g)
            && d > 0
            && kv.fits(d)
            && qs.len() == g * d
            && sum.len() == g
            && acc.len() == g * d
            && keys.len() == page
            && values.len() == page
            && n <= PAGE_SLOTS,
        "attention::page_step: shape mismatch"
    );
    assert!(
        [ahead_keys, ahead_values]
            .iter()
            .all(|a| a.is_empty() || a.len() == page),
        "attention::page_step: `ahead` is not a page"
    );
    #[cfg(target_arch = "x86_64")]
    if use_avx512() && d.is_multiple_of(16) {
        let ahead = (ahead_ptr(ahead_keys), ahead_ptr(ahead_values));
        // SAFETY: AVX-512 F (with AVX2/FMA/F16C) was detected; the shapes are checked.
        return unsafe {
            attention_avx512::page_step(kv, qs, keys, values, n, scale, max, sum, acc, ahead)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && d.is_multiple_of(8) {
        let ahead = (ahead_ptr(ahead_keys), ahead_ptr(ahead_values));
        // SAFETY: AVX2/FMA/F16C were detected; the shapes are checked.
        return unsafe {
            attention_avx2::page_step(kv, qs, keys, values, n, scale, max, sum, acc, ahead)
        };
    }
    let mut scores = [0f32; PAGE_SLOTS * MAX_GROUP];
    dots(kv, qs, keys, n, g, &mut scores, PAGE_SLOTS, ahead_keys);
    for (j, sc) in scores.chunks_exact_mut(PAGE_SLOTS).take(g).enumerate() {
        let c = softmax_page(&mut sc[..n], None, scale, &mut max[j], &mut sum[j]);
        if c != 1.0 {
            acc[j * d..(j + 1) * d].iter_mut().for_each(|a| *a *= c);
        }
    }
    attend(
        kv,
        acc,
        d,
        &scores,
        PAGE_SLOTS,
        values,
        &PAGE_ROWS[..n],
        ahead_values,
    );
}

/// One page of one head's online softmax. Each score is first multiplied by `scale` (the
/// attention scale; 1 when the caller scaled them). With `m` the larger of `*max` and the
/// page's largest score: each score becomes its weight `exp(score - m)`, `*sum` is rescaled to `m`
/// and the page's weights added, `*max = m`. Returns `exp(old max - m)`, the factor the head's
/// accumulated values must be multiplied by (exactly 1 when the max did not grow).
///
/// `slots` names the page slot of each score (`None`: score `i` is slot `i`, a whole page).
/// The page's weights are summed in 16 lanes, slot `s` into lane `s % 16`, each lane in slot
/// order, and the lanes then in a fixed order: short chains of additions instead of one long
/// one (the serial sum was a tenth of SmolLM2's decode at depth 4,096), the same bits in every
/// kernel set, and a key left out gives the same bits as a key kept with weight 0 (a mask's
/// bias of -inf and a mask that drops the slot agree bit for bit).
///
/// # Panics
/// If `slots` is given and not as long as `scores`.
pub fn softmax_page(
    scores: &mut [f32],
    slots: Option<&[u32]>,
    scale: f32,
    max: &mut f32,
    sum: &mut f32,
) -> f32 {
    assert!(
        slots.is_none_or(|s| s.len() == scores.len()),
        "attention::softmax_page: one slot per score"
    );
    #[cfg(target_arch = "x86_64")]
    if use_avx512() {
        // SAFETY: AVX-512 F (with AVX2/FMA/F16C) was detected; the slots were checked.
        return unsafe { attention_avx512::softmax_page(scores, slots, scale, max, sum) };
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the slots were checked.
        return unsafe { attention_avx2::softmax_page(scores, slots, scale, max, sum) };
    }
    scalar::softmax_page(scores, slots, scale, max, sum)
}

/// Constants of the `exp` both kernel sets use for softmax weights: `exp(x) = 2ⁿ · eʳ` with
/// `n = round(x · log₂e)` and `r = x − n·ln 2` (ln 2 in two parts, Cody–Waite), `eʳ` by its
/// degree-6 Taylor polynomial (|r| ≤ ln 2 / 2: relative error below 2·10⁻⁷). Below
/// [`EXP_FLOOR`] the weight is 0: next to the page max's weight of 1 it could not count.
pub(crate) mod exp_consts {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// 1/720, 1/120, 1/24, 1/6, 1/2, 1, 1 (highest power first).
    pub const POLY: [f32; 7] = [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    pub const EXP_FLOOR: f32 = -87.0;
    pub const EXP_CEIL: f32 = 88.0;
}

/// Scalar reference kernels (the oracle of the AVX2 ones, and the path of other CPUs).
pub(crate) mod scalar {
    use super::exp_consts::*;
    use super::{key_value, row_value, KvType, Q8_KEY_QS, Q8_KEY_SECTION};
    use half::f16;

    /// `exp(x)` by the vector kernels' method and constants (see [`super::exp_consts`]), but
    /// with separate roundings where they fuse a multiply-add: it may differ from their
    /// results in the last bit, which the tests allow (a CPU without FMA has no fast fused
    /// multiply-add for this path to use).
    pub fn exp(x: f32) -> f32 {
        if x.is_nan() || x < EXP_FLOOR {
            return 0.0;
        }
        let x = x.min(EXP_CEIL);
        let n = (x * LOG2E).round_ties_even();
        let r = x - n * LN2_HI - n * LN2_LO;
        let p = POLY.iter().fold(0.0f32, |p, &c| p * r + c);
        p * f32::from_bits(((n as i32 + 127) as u32) << 23)
    }

    /// F16 keys: one fused multiply-add chain per score, `t` in order. Q8_0 keys: for each
    /// block, a chain over its 32 values of the query times the key's byte, then one
    /// multiply-add of that by the key's scale into the score. Both the SIMD kernels' lanes,
    /// bit for bit.
    pub fn dots(
        kv: KvType,
        qs: &[f32],
        page: &[u8],
        n: usize,
        g: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let d = qs.len() / g;
        for s in 0..n {
            for (j, q) in qs.chunks_exact(d).enumerate() {
                let k = |t: usize| key_value(kv, page, d, s, t);
                out[j * stride + s] = match kv {
                    KvType::F16 => {
                        (q.iter().enumerate()).fold(0.0, |a, (t, &x)| x.mul_add(k(t), a))
                    }
                    KvType::Q8_0 => q.chunks_exact(32).enumerate().fold(0.0, |score, (b, qb)| {
                        let sec = &page[b * Q8_KEY_SECTION..];
                        let byte = |t: usize| f32::from(sec[Q8_KEY_QS + 32 * t + s] as i8);
                        let blk =
                            (qb.iter().enumerate()).fold(0.0, |a, (t, &x)| x.mul_add(byte(t), a));
                        let scale = f16::from_le_bytes([sec[2 * s], sec[2 * s + 1]]).to_f32();
                        blk.mul_add(scale, score)
                    }),
                };
            }
        }
    }

    pub fn attend(
        kv: KvType,
        acc: &mut [f32],
        d: usize,
        w: &[f32],
        ws: usize,
        values: &[u8],
        rows: &[u32],
    ) {
        let rb = kv.row_bytes(d);
        for (i, &r) in rows.iter().enumerate() {
            let v = &values[r as usize * rb..][..rb];
            for (j, a) in acc.chunks_exact_mut(d).enumerate() {
                for (t, a) in a.iter_mut().enumerate() {
                    *a += w[j * ws + i] * row_value(kv, v, t);
                }
            }
        }
    }

    pub fn softmax_page(
        scores: &mut [f32],
        slots: Option<&[u32]>,
        scale: f32,
        max: &mut f32,
        sum: &mut f32,
    ) -> f32 {
        scores.iter_mut().for_each(|s| *s *= scale);
        let page_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut c = 1.0;
        if page_max > *max {
            c = (*max - page_max).exp();
            *sum *= c;
            *max = page_max;
        }
        for s in scores.iter_mut() {
            *s = exp(*s - *max);
        }
        *sum += slot_sum(scores, slots);
        c
    }

    /// The sum of `weights` as [`super::softmax_page`] takes it: weight `i` into lane
    /// `slots[i] % 16` (`i % 16` without slots), lanes `l` and `l + 8` added, then those 8 as
    /// `((m0 + m4) + (m2 + m6)) + ((m1 + m5) + (m3 + m7))` (the order of `x86::hsum_ps`).
    pub fn slot_sum(weights: &[f32], slots: Option<&[u32]>) -> f32 {
        let mut l = [0f32; 16];
        for (i, &w) in weights.iter().enumerate() {
            l[slots.map_or(i, |s| s[i] as usize) % 16] += w;
        }
        let m: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
        ((m[0] + m[4]) + (m[2] + m[6])) + ((m[1] + m[5]) + (m[3] + m[7]))
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
