//! Tests of the attention kernels: every x86 set against the scalar oracle, the key pages'
//! layouts, the softmax steps and the page step.

use super::*;
use crate::kernels::testutil::Rng;

fn close(a: f32, b: f32) {
    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
}

fn rows_of(kv: KvType, x: &[f32], d: usize) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / d * kv.row_bytes(d)];
    for (o, r) in out.chunks_exact_mut(kv.row_bytes(d)).zip(x.chunks_exact(d)) {
        quantize_row(kv, r, o);
    }
    out
}

#[test]
fn q8_0_rows_are_ggml_blocks_within_half_a_step() {
    let mut rng = Rng::new(9);
    let x = rng.f32s(64, 3.0);
    let row = rows_of(KvType::Q8_0, &x, 64);
    assert_eq!(
        row.len(),
        68,
        "two 34-byte blocks: half of f16's 128 bytes, plus scales"
    );
    let mut expect = [0f32; 32];
    for (b, xb) in row.chunks_exact(Q8_BLOCK).zip(x.chunks_exact(32)) {
        crate::quant::blocks::dequantize_block_q8_0(b.try_into().unwrap(), &mut expect);
        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (t, (&e, &v)) in expect.iter().zip(xb).enumerate() {
            assert!(
                (e - v).abs() <= 0.5 * step * 1.001 + 1e-3 * step,
                "{e} vs {v}"
            );
            assert_eq!(e, row_value(KvType::Q8_0, b, t));
        }
    }
}

#[test]
fn exp_is_accurate_and_zero_far_below() {
    for i in -8700..=100 {
        let x = i as f32 / 100.0;
        let (a, b) = (scalar::exp(x), x.exp());
        assert!((a - b).abs() <= 3e-7 * b, "exp({x}) = {a}, not {b}");
    }
    assert_eq!(scalar::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(scalar::exp(-100.0), 0.0);
}

type DotsFn = fn(KvType, &[f32], &[u8], usize, usize, &mut [f32], usize, &[u8]);
type AttendFn = fn(KvType, &mut [f32], usize, &[f32], usize, &[u8], &[u32], &[u8]);

/// The kernel sets this CPU can run, by name: the dispatching wrappers and each x86 twin.
fn kernel_sets() -> Vec<(&'static str, DotsFn, AttendFn)> {
    #[allow(unused_mut)]
    let mut sets: Vec<(&'static str, DotsFn, AttendFn)> = vec![
        ("dispatch", dots, attend),
        (
            "scalar",
            |kv, q, p, n, g, o, s, _| scalar::dots(kv, q, p, n, g, o, s),
            |kv, a, d, w, ws, v, r, _| scalar::attend(kv, a, d, w, ws, v, r),
        ),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::SimdLevel;
        if SimdLevel::Avx2.available() {
            // SAFETY (both closures): AVX2/FMA/F16C are present; the shapes are valid.
            sets.push((
                "avx2",
                |kv, q, p, n, g, o, s, x| unsafe {
                    let x = ahead_ptr(x);
                    match kv {
                        KvType::F16 => attention_avx2::dots_f16(q, p, n, g, o, s, x),
                        KvType::Q8_0 => attention_avx2::dots_q8(q, p, n, g, o, s, x),
                    }
                },
                |kv, a, d, w, ws, v, r, x| unsafe {
                    attention_avx2::attend(kv, a, d, w, ws, v, r, ahead_ptr(x))
                },
            ));
        }
        if SimdLevel::Avx512.available() {
            // SAFETY (both closures): AVX-512 F and AVX2 are present; the shapes are valid.
            sets.push((
                "avx512",
                |kv, q, p, n, g, o, s, x| unsafe {
                    let x = ahead_ptr(x);
                    match kv {
                        KvType::F16 => attention_avx512::dots_f16(q, p, n, g, o, s, x),
                        KvType::Q8_0 => attention_avx512::dots_q8(q, p, n, g, o, s, x),
                    }
                },
                |kv, a, d, w, ws, v, r, x| unsafe {
                    attention_avx512::attend(kv, a, d, w, ws, v, r, ahead_ptr(x))
                },
            ));
        }
    }
    sets
}

/// A key page of `PAGE_SLOTS` random keys of `d` values, and the keys.
fn key_page(rng: &mut Rng, kv: KvType, d: usize) -> (Vec<u8>, Vec<Vec<f32>>) {
    let mut page = vec![0u8; PAGE_SLOTS * kv.row_bytes(d)];
    let keys: Vec<Vec<f32>> = (0..PAGE_SLOTS).map(|_| rng.f32s(d, 1.0)).collect();
    for (s, k) in keys.iter().enumerate() {
        write_key(kv, k, &mut page, s);
    }
    (page, keys)
}

/// A key page reads back what was written (f16: exactly the f16 rounding; Q8_0: its
/// quantized row), and goes to rows and back unchanged.
#[test]
fn key_pages_round_trip_through_rows() {
    let mut rng = Rng::new(4);
    for kv in [KvType::F16, KvType::Q8_0] {
        for d in [32, 64, 40] {
            if !kv.fits(d) {
                continue;
            }
            let (page, keys) = key_page(&mut rng, kv, d);
            let mut rows = vec![0u8; page.len()];
            key_page_to_rows(kv, d, &page, &mut rows);
            let rb = kv.row_bytes(d);
            for (s, k) in keys.iter().enumerate() {
                let mut row = vec![0u8; rb];
                quantize_row(kv, k, &mut row);
                assert_eq!(&rows[s * rb..(s + 1) * rb], &row[..], "{kv} d {d} slot {s}");
                for (t, &x) in k.iter().enumerate() {
                    assert_eq!(key_value(kv, &page, d, s, t), row_value(kv, &row, t));
                    if kv == KvType::F16 {
                        assert_eq!(key_value(kv, &page, d, s, t), f16::from_f32(x).to_f32());
                    }
                }
            }
            let mut back = vec![0u8; page.len()];
            key_rows_to_page(kv, d, &rows, &mut back);
            assert_eq!(back, page);
        }
    }
}

/// Every kernel set against the scalar oracle, for both storage types, every group size
/// and strides: the scores bit for bit (the same multiply-add chains a score in every
/// set). A score has the same bits in a call for part of the page and with its
/// key alone in another page. The weighted sums of all sets have the same bits (one fused
/// multiply-add per row and element, in row order, whatever the vector width).
#[test]
fn kernels_match_scalar_and_pages_match_keys() {
    let sets = kernel_sets();
    eprintln!(
        "attention kernel sets tested: {:?}",
        sets.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    let mut rng = Rng::new(5);
    for kv in [KvType::F16, KvType::Q8_0] {
        for d in [32, 64, 96, 256, 40] {
            if !kv.fits(d) {
                continue;
            }
            let (page, keys) = key_page(&mut rng, kv, d);
            // The "next page" the score and sum calls hint in (it changes no result).
            let (ahead, _) = key_page(&mut rng, kv, d);
            let values = rows_of(kv, &rng.f32s(11 * d, 1.0), d);
            let rows = [7u32, 0, 3, 9, 4, 10, 1, 2, 5];
            for g in 1..=MAX_GROUP {
                let qs = rng.f32s(g * d, 1.0);
                let stride = 37;
                let w = rng.f32s(g * 16, 1.0);
                let init = rng.f32s(g * d, 1.0);
                let mut oracle = vec![0f32; g * stride];
                scalar::dots(kv, &qs, &page, PAGE_SLOTS, g, &mut oracle, stride);
                let mut sums = Vec::new();
                for &(name, dots, attend) in &sets {
                    let mut all = vec![0f32; g * stride];
                    dots(kv, &qs, &page, PAGE_SLOTS, g, &mut all, stride, &ahead);
                    for (&a, &b) in oracle.iter().zip(&all) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{kv} {name}");
                    }
                    // Part of the page: the same bits, nothing past `n` written.
                    let n = 11 + g;
                    let mut part = vec![f32::NAN; g * stride];
                    dots(kv, &qs, &page, n, g, &mut part, stride, &[]);
                    for j in 0..g {
                        for s in 0..stride {
                            let (a, b) = (all[j * stride + s], part[j * stride + s]);
                            match s < n {
                                true => assert_eq!(a.to_bits(), b.to_bits(), "{name} {s}"),
                                false => assert!(b.is_nan(), "{name}: slot {s} written"),
                            }
                        }
                    }
                    // Each key alone, in slot 0 of a page of other keys.
                    let (mut other, _) = key_page(&mut rng, kv, d);
                    for (s, k) in keys.iter().enumerate().step_by(5) {
                        write_key(kv, k, &mut other, 0);
                        let mut one = vec![0f32; (g - 1) * stride + 1];
                        dots(kv, &qs, &other, 1, g, &mut one, stride, &[]);
                        for j in 0..g {
                            assert_eq!(
                                one[j * stride].to_bits(),
                                all[j * stride + s].to_bits(),
                                "{name}: {kv} d {d} g {g} key {s}"
                            );
                        }
                    }
                    let (mut a1, mut a2) = (init.clone(), init.clone());
                    scalar::attend(kv, &mut a1, d, &w, 16, &values, &rows);
                    attend(kv, &mut a2, d, &w, 16, &values, &rows, &ahead);
                    a1.iter().zip(&a2).for_each(|(&a, &b)| close(b, a));
                    if name != "scalar" {
                        sums.push(a2);
                    }
                }
                let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    sums.windows(2).all(|p| bits(&p[0]) == bits(&p[1])),
                    "weighted sums differ between kernel sets: {kv} d {d} g {g}"
                );
            }
        }
    }
}

type PageStepFn =
    fn(KvType, &[f32], &[u8], &[u8], usize, f32, &mut [f32], &mut [f32], &mut [f32], &[u8], &[u8]);

/// The three kernels of a page step one after the other (scale 0.125): the dispatchers',
/// or with `simd` the AVX2 set's (whose bits every SIMD set gives) where it runs.
#[allow(clippy::too_many_arguments)]
fn compose(
    simd: bool,
    kv: KvType,
    qs: &[f32],
    keys: &[u8],
    values: &[u8],
    n: usize,
    m: &mut [f32],
    s: &mut [f32],
    a: &mut [f32],
) {
    let (g, ps) = (m.len(), PAGE_SLOTS);
    let d = qs.len() / g;
    let mut w = vec![0f32; g * ps];
    #[cfg(target_arch = "x86_64")]
    if simd && crate::kernels::SimdLevel::Avx2.available() && d.is_multiple_of(8) {
        let none = std::ptr::null();
        // SAFETY: AVX2/FMA/F16C are present; the shapes are valid.
        unsafe {
            match kv {
                KvType::F16 => attention_avx2::dots_f16(qs, keys, n, g, &mut w, ps, none),
                KvType::Q8_0 => attention_avx2::dots_q8(qs, keys, n, g, &mut w, ps, none),
            }
            for j in 0..g {
                let sc = &mut w[j * ps..][..n];
                let c = attention_avx2::softmax_page(sc, None, 0.125, &mut m[j], &mut s[j]);
                a[j * d..(j + 1) * d].iter_mut().for_each(|a| *a *= c);
            }
            attention_avx2::attend(kv, a, d, &w, ps, values, &PAGE_ROWS[..n], none);
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    dots(kv, qs, keys, n, g, &mut w, ps, &[]);
    for j in 0..g {
        let c = softmax_page(&mut w[j * ps..][..n], None, 0.125, &mut m[j], &mut s[j]);
        a[j * d..(j + 1) * d].iter_mut().for_each(|a| *a *= c);
    }
    attend(kv, a, d, &w, ps, values, &PAGE_ROWS[..n], &[]);
}

/// A page step has the bits of its three kernels called one after the other, in every
/// set this CPU runs: for both storage types, every group size, whole and partial pages,
/// and heads whose running max is unset, below the page's (the state rescaled) or above it.
#[test]
fn page_step_matches_its_three_kernels() {
    #[allow(unused_mut)]
    let mut sets: Vec<(&str, PageStepFn)> = vec![("dispatch", page_step)];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::SimdLevel;
        if SimdLevel::Avx2.available() {
            sets.push(("avx2", |kv, q, k, v, n, sc, m, s, a, ak, av| {
                let ahead = (ahead_ptr(ak), ahead_ptr(av));
                // SAFETY: AVX2/FMA/F16C are present; the shapes are valid.
                unsafe { attention_avx2::page_step(kv, q, k, v, n, sc, m, s, a, ahead) }
            }));
        }
        if SimdLevel::Avx512.available() {
            sets.push(("avx512", |kv, q, k, v, n, sc, m, s, a, ak, av| {
                let ahead = (ahead_ptr(ak), ahead_ptr(av));
                // SAFETY (both): AVX-512 F and AVX2 are present; the shapes are valid (the
                // test's head sizes are multiples of 8; of 16 for the AVX-512 step).
                if !(q.len() / m.len()).is_multiple_of(16) {
                    // As the dispatcher on this level: the AVX2 step.
                    return unsafe {
                        attention_avx2::page_step(kv, q, k, v, n, sc, m, s, a, ahead)
                    };
                }
                unsafe { attention_avx512::page_step(kv, q, k, v, n, sc, m, s, a, ahead) }
            }));
        }
    }
    let mut rng = Rng::new(12);
    for kv in [KvType::F16, KvType::Q8_0] {
        for d in [32, 64, 96, 256, 40, 24] {
            if !kv.fits(d) {
                continue;
            }
            let (keys, _) = key_page(&mut rng, kv, d);
            let (ahead, _) = key_page(&mut rng, kv, d);
            let values = rows_of(kv, &rng.f32s(PAGE_SLOTS * d, 1.0), d);
            for g in 1..=MAX_GROUP {
                let qs = rng.f32s(g * d, 1.0);
                for n in [1, 9, 16, 17, 32] {
                    for start in [f32::NEG_INFINITY, -30.0, 30.0] {
                        let mut s0 = vec![0.0; g];
                        let a0 = match start {
                            f32::NEG_INFINITY => vec![0.0; g * d],
                            _ => rng.f32s(g * d, 1.0),
                        };
                        if start > f32::NEG_INFINITY {
                            s0.iter_mut().for_each(|s| *s = 3.0);
                        }
                        let state = (vec![start; g], s0, a0);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let (k, v) = (&keys[..], &values[..]);
                        for &(name, step) in &sets {
                            // "dispatch" against the dispatchers' kernels, the SIMD sets
                            // against the AVX2 ones (all SIMD kernels give their bits).
                            let (mut m1, mut s1, mut a1) = state.clone();
                            let simd = name != "dispatch";
                            compose(simd, kv, &qs, k, v, n, &mut m1, &mut s1, &mut a1);
                            let (mut m2, mut s2, mut a2) = state.clone();
                            step(
                                kv, &qs, k, v, n, 0.125, &mut m2, &mut s2, &mut a2, &ahead, &ahead,
                            );
                            assert_eq!(
                                (bits(&m1), bits(&s1), bits(&a1)),
                                (bits(&m2), bits(&s2), bits(&a2)),
                                "{name}: {kv} d {d} g {g} n {n} max {start}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn softmax_page_matches_scalar_and_exact_exp() {
    let mut rng = Rng::new(8);
    for n in [1, 5, 8, 13, 32] {
        let s: Vec<f32> = rng.f32s(n, 6.0);
        let (mut a, mut b) = (s.clone(), s.clone());
        let (mut ma, mut sa) = (0.5f32, 2.0f32);
        let (mut mb, mut sb) = (0.5f32, 2.0f32);
        let ca = scalar::softmax_page(&mut a, None, 1.0, &mut ma, &mut sa);
        let cb = softmax_page(&mut b, None, 1.0, &mut mb, &mut sb);
        assert_eq!((ma, ca), (mb, cb));
        close(sb, sa);
        let m = s.iter().copied().fold(0.5f32, f32::max);
        for ((&x, &wa), &wb) in s.iter().zip(&a).zip(&b) {
            close(wa, (x - m).exp());
            close(wb, wa);
        }
        close(
            sa,
            2.0 * (0.5 - m).exp() + s.iter().map(|&x| (x - m).exp()).sum::<f32>(),
        );
        // The scale is applied first, as a separate multiply would.
        let (mut c, mut d) = (s.clone(), s.iter().map(|&x| x * 0.125).collect::<Vec<_>>());
        let (mut mc, mut sc, mut md, mut sd) = (0.5f32, 2.0f32, 0.5f32, 2.0f32);
        softmax_page(&mut c, None, 0.125, &mut mc, &mut sc);
        softmax_page(&mut d, None, 1.0, &mut md, &mut sd);
        assert_eq!((c, mc, sc), (d, md, sd));
    }
}

/// A page whose every third slot is hidden by a score of -inf (a mask's bias) and the same
/// page with those slots left out (a mask that drops them, slots listed) give the same
/// weights and sum, bit for bit, in every kernel set; the SIMD sets agree bit for bit, and
/// with the scalar oracle closely.
#[test]
fn softmax_page_dropped_slots_equal_hidden_ones() {
    type Softmax = fn(&mut [f32], Option<&[u32]>, f32, &mut f32, &mut f32) -> f32;
    #[allow(unused_mut)]
    let mut sets: Vec<(&str, Softmax)> =
        vec![("scalar", scalar::softmax_page), ("dispatch", softmax_page)];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::SimdLevel;
        if SimdLevel::Avx2.available() {
            // SAFETY: AVX2/FMA/F16C are present; the slots match the scores.
            sets.push(("avx2", |s, sl, c, m, t| unsafe {
                attention_avx2::softmax_page(s, sl, c, m, t)
            }));
        }
        if SimdLevel::Avx512.available() {
            // SAFETY: AVX-512 F and AVX2 are present; the slots match the scores.
            sets.push(("avx512", |s, sl, c, m, t| unsafe {
                attention_avx512::softmax_page(s, sl, c, m, t)
            }));
        }
    }
    let mut rng = Rng::new(11);
    for n in [5, 8, 13, 16, 21, 32] {
        let s = rng.f32s(n, 6.0);
        let hidden: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 1 { f32::NEG_INFINITY } else { s[i] })
            .collect();
        let slots: Vec<u32> = (0..n as u32).filter(|i| i % 3 != 1).collect();
        let kept: Vec<f32> = slots.iter().map(|&i| s[i as usize]).collect();
        let mut results = Vec::new();
        for &(name, softmax) in &sets {
            let (mut a, mut b) = (hidden.clone(), kept.clone());
            let (mut ma, mut sa, mut mb, mut sb) = (0.5f32, 2.0f32, 0.5f32, 2.0f32);
            let ca = softmax(&mut a, None, 0.3, &mut ma, &mut sa);
            let cb = softmax(&mut b, Some(&slots), 0.3, &mut mb, &mut sb);
            assert_eq!(
                (ca, ma, sa.to_bits()),
                (cb, mb, sb.to_bits()),
                "{name} n {n}"
            );
            for (&i, &w) in slots.iter().zip(&b) {
                assert_eq!(a[i as usize].to_bits(), w.to_bits(), "{name} n {n}");
            }
            assert!(a.iter().skip(1).step_by(3).all(|&w| w == 0.0));
            results.push((name, sa, a));
        }
        let (_, s0, w0) = &results[0];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (name, sum, w) in &results[1..] {
            close(*sum, *s0);
            w.iter().zip(w0).for_each(|(&x, &y)| close(x, y));
            assert_eq!(
                (sum.to_bits(), bits(w)),
                (results[1].1.to_bits(), bits(&results[1].2)),
                "{name} n {n}: SIMD sets differ"
            );
        }
    }
}
