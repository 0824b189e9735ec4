use super::*;
use crate::gguf::GgmlType;

fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

#[test]
fn block_byte_sizes_match_ggml_type_sizes() {
    let pairs = [
        (GgmlType::Q4_0, Q4_0_BYTES),
        (GgmlType::Q4_1, Q4_1_BYTES),
        (GgmlType::Q5_0, Q5_0_BYTES),
        (GgmlType::Q5_1, Q5_1_BYTES),
        (GgmlType::Q8_0, Q8_0_BYTES),
        (GgmlType::Q8_1, Q8_1_BYTES),
        (GgmlType::Q2_K, Q2_K_BYTES),
        (GgmlType::Q3_K, Q3_K_BYTES),
        (GgmlType::Q4_K, Q4_K_BYTES),
        (GgmlType::Q5_K, Q5_K_BYTES),
        (GgmlType::Q6_K, Q6_K_BYTES),
        (GgmlType::Q8_K, Q8_K_BYTES),
    ];
    for (t, bytes) in pairs {
        assert_eq!(t.type_size(), bytes, "{t}");
    }
}

#[test]
fn scalar_readers() {
    assert_eq!(read_f16(&[0x00, 0x3C], 0), 1.0);
    assert_eq!(read_f16(&[0xFF, 0x00, 0xC0], 1), -2.0);
    assert_eq!(read_f16(&[0x01, 0x00], 0), 2f32.powi(-24)); // smallest subnormal
    assert_eq!(read_f32(&1.5f32.to_le_bytes(), 0), 1.5);
    assert_eq!(read_bf16(&[0x80, 0x3F], 0), 1.0);
    assert_eq!(read_bf16(&[0xC0, 0xC0], 0), -6.0);
}

#[test]
fn q4_0_nibbles() {
    // d = 0.5, byte j = (15 - j) << 4 | j: q[j] = j, q[j + 16] = 15 - j.
    let mut b = [0u8; Q4_0_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(0.5));
    for j in 0..16 {
        b[2 + j] = ((15 - j as u8) << 4) | j as u8;
    }
    let mut out = [0f32; QK32];
    dequantize_block_q4_0(&b, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(out[j + 16], (7.0 - j as f32) * 0.5);
    }
}

#[test]
fn q4_1_offset() {
    // d = 0.25, m = -1.0, all low nibbles 3 and high nibbles 12.
    let mut b = [0xC3u8; Q4_1_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(0.25));
    b[2..4].copy_from_slice(&f16_bytes(-1.0));
    let mut out = [0f32; QK32];
    dequantize_block_q4_1(&b, &mut out);
    assert!(out[..16].iter().all(|&x| x == 3.0 * 0.25 - 1.0));
    assert!(out[16..].iter().all(|&x| x == 12.0 * 0.25 - 1.0));
}

#[test]
fn q5_0_high_bits() {
    // d = 2, all nibbles 0xF, high bits set for even elements only: q = 31 or 15.
    let mut b = [0xFFu8; Q5_0_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(2.0));
    b[2..6].copy_from_slice(&0x5555_5555u32.to_le_bytes());
    let mut out = [0f32; QK32];
    dequantize_block_q5_0(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let q = if i % 2 == 0 { 31.0 } else { 15.0 };
        assert_eq!(x, (q - 16.0) * 2.0, "element {i}");
    }
    // Element 16 takes bit 16 of qh (not bit 1 of byte 0's neighbour).
    b[2..6].copy_from_slice(&(1u32 << 16).to_le_bytes());
    b[6..22].fill(0);
    dequantize_block_q5_0(&b, &mut out);
    assert_eq!(out[16], 0.0);
    assert_eq!(out[0], -32.0);
}

#[test]
fn q5_1_offset_and_high_bits() {
    // d = 1, m = 0.5; q[j] = j for j < 16 (nibble j, no high bit), q[j+16] = 16 + j.
    let mut b = [0u8; Q5_1_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(1.0));
    b[2..4].copy_from_slice(&f16_bytes(0.5));
    b[4..8].copy_from_slice(&0xFFFF_0000u32.to_le_bytes());
    for j in 0..16 {
        b[8 + j] = ((j as u8) << 4) | j as u8;
    }
    let mut out = [0f32; QK32];
    dequantize_block_q5_1(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, i as f32 + 0.5, "element {i}");
    }
}

#[test]
fn q8_0_and_q8_1_signed_bytes() {
    let mut b0 = [0u8; Q8_0_BYTES];
    b0[0..2].copy_from_slice(&f16_bytes(-0.125));
    let mut b1 = [0u8; Q8_1_BYTES];
    b1[0..2].copy_from_slice(&f16_bytes(-0.125));
    b1[2..4].copy_from_slice(&f16_bytes(1234.0)); // s is not used
    for i in 0..QK32 {
        let q = (i as i32 * 8 - 128) as i8; // -128, -120, …, 120
        b0[2 + i] = q as u8;
        b1[4 + i] = q as u8;
    }
    let (mut o0, mut o1) = ([0f32; QK32], [0f32; QK32]);
    dequantize_block_q8_0(&b0, &mut o0);
    dequantize_block_q8_1(&b1, &mut o1);
    for i in 0..QK32 {
        let want = (i as f32 * 8.0 - 128.0) * -0.125;
        assert_eq!(o0[i], want);
        assert_eq!(o1[i], want);
    }
}

#[test]
fn q2_k_scales_mins_and_order() {
    // d = 1, dmin = 0.5; sub-block s has scale s % 16 and min 1; quant 2-bit fields are
    // (0, 1, 2, 3) for shifts (0, 2, 4, 6): byte 0b11_10_01_00 = 0xE4.
    let mut b = [0u8; Q2_K_BYTES];
    for (s, byte) in b[0..16].iter_mut().enumerate() {
        *byte = (1 << 4) | s as u8;
    }
    b[16..80].fill(0xE4);
    b[80..82].copy_from_slice(&f16_bytes(1.0));
    b[82..84].copy_from_slice(&f16_bytes(0.5));
    let mut out = [0f32; QK_K];
    dequantize_block_q2_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
        let s = 8 * h + 2 * k + l / 16;
        let q = k as f32;
        assert_eq!(x, s as f32 * q - 0.5, "element {i}");
    }
}

#[test]
fn q3_k_scales_and_high_mask() {
    // Scale s = 32 + s (so sc - 32 = s): low nibbles s & 15, top bits 2 (all scales >= 32).
    let mut b = [0u8; Q3_K_BYTES];
    let sc: Vec<u8> = (0..16).map(|s| 32 + s as u8).collect();
    for j in 0..8 {
        b[96 + j] = (sc[j] & 0x0F) | ((sc[j + 8] & 0x0F) << 4);
    }
    for j in 0..4 {
        let mut v = 0u8;
        for g in 0..4 {
            v |= (sc[4 * g + j] >> 4) << (2 * g);
        }
        b[96 + 8 + j] = v;
    }
    for (s, &want) in sc.iter().enumerate() {
        assert_eq!(q3_k_scale(&b[96..108], s), want);
    }
    // Low bits: all 3. High mask: bit set only for h = 0 (bits 0..4) → q = 3 there, -1 else.
    b[32..96].fill(0xFF);
    b[0..32].fill(0x0F);
    b[108..110].copy_from_slice(&f16_bytes(0.5));
    let mut out = [0f32; QK_K];
    dequantize_block_q3_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
        let s = 8 * h + 2 * k + l / 16;
        let q = if h == 0 { 3.0 } else { -1.0 };
        assert_eq!(x, 0.5 * s as f32 * q, "element {i}");
    }
}

/// Packs 8 six-bit scales and mins the way Q4_K/Q5_K store them.
fn pack_k4(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for j in 0..4 {
        b[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        b[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        b[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    b
}

#[test]
fn k4_scale_min_unpacks_all_six_bits() {
    let sc = [1, 62, 33, 17, 63, 48, 5, 40];
    let mn = [63, 0, 21, 34, 49, 16, 60, 3];
    let packed = pack_k4(sc, mn);
    for j in 0..8 {
        assert_eq!(k4_scale_min(&packed, j), (sc[j], mn[j]), "sub-block {j}");
    }
}

#[test]
fn q4_k_sub_blocks() {
    // d = 0.5, dmin = 0.25, scale s = s + 1, min s = 2*s; nibbles: low = l % 16, high = 15 - l % 16.
    let sc = [1, 2, 3, 4, 5, 6, 7, 8];
    let mn = [0, 2, 4, 6, 8, 10, 12, 14];
    let mut b = [0u8; Q4_K_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(0.5));
    b[2..4].copy_from_slice(&f16_bytes(0.25));
    b[4..16].copy_from_slice(&pack_k4(sc, mn));
    for p in 0..4 {
        for l in 0..32 {
            let lo = (l % 16) as u8;
            b[16 + 32 * p + l] = lo | ((15 - lo) << 4);
        }
    }
    let mut out = [0f32; QK_K];
    dequantize_block_q4_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let (s, l) = (i / 32, i % 32);
        let q = (if s % 2 == 0 { l % 16 } else { 15 - l % 16 }) as f32;
        let want = 0.5 * sc[s] as f32 * q - 0.25 * mn[s] as f32;
        assert_eq!(x, want, "element {i}");
    }
}

#[test]
fn q5_k_high_bits() {
    // All low nibbles 0; qh[l] = 0b1010_1010 → sub-blocks 1, 3, 5, 7 get q = 16, others 0.
    let sc = [1, 1, 2, 2, 3, 3, 4, 4];
    let mn = [1, 0, 1, 0, 1, 0, 1, 0];
    let mut b = [0u8; Q5_K_BYTES];
    b[0..2].copy_from_slice(&f16_bytes(1.0));
    b[2..4].copy_from_slice(&f16_bytes(2.0));
    b[4..16].copy_from_slice(&pack_k4(sc, mn));
    b[16..48].fill(0xAA);
    let mut out = [0f32; QK_K];
    dequantize_block_q5_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let s = i / 32;
        let q = if s % 2 == 1 { 16.0 } else { 0.0 };
        assert_eq!(x, sc[s] as f32 * q - 2.0 * mn[s] as f32, "element {i}");
    }
    // A low nibble and the high bit combine: q = 15 | 16 = 31 in sub-block 0.
    b[48] = 0x0F;
    b[16] = 0x01;
    dequantize_block_q5_k(&b, &mut out);
    assert_eq!(out[0], 31.0 - 2.0);
}

#[test]
fn q6_k_quant_order() {
    // Give every element a distinct q and check it lands at the documented index.
    let mut b = [0u8; Q6_K_BYTES];
    let want_q = |i: usize| (i % 64) as i32 - 32;
    for i in 0..QK_K {
        let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
        let u = (want_q(i) + 32) as u8;
        b[64 * h + 32 * (k % 2) + l] |= (u & 0x0F) << (4 * (k / 2));
        b[128 + 32 * h + l] |= (u >> 4) << (2 * k);
    }
    for s in 0..16 {
        b[192 + s] = (s as i8 - 8) as u8;
    }
    b[208..210].copy_from_slice(&f16_bytes(0.5));
    let mut out = [0f32; QK_K];
    dequantize_block_q6_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        let s = i / 16;
        assert_eq!(x, 0.5 * (s as f32 - 8.0) * want_q(i) as f32, "element {i}");
    }
}

#[test]
fn q8_k_f32_scale() {
    let mut b = [0u8; Q8_K_BYTES];
    b[0..4].copy_from_slice(&0.1f32.to_le_bytes());
    for i in 0..QK_K {
        b[4 + i] = (i as u8).wrapping_sub(128);
    }
    b[260..292].fill(0xAB); // bsums are not used
    let mut out = [0f32; QK_K];
    dequantize_block_q8_k(&b, &mut out);
    for (i, &x) in out.iter().enumerate() {
        assert_eq!(x, 0.1f32 * (i as f32 - 128.0));
    }
}
