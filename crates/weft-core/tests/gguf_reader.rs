//! The GGUF reader: round trips through our writer, every kind of malformed file ends in a
//! typed error (never a panic), and the real models parse as gguf-py describes them.

use crate::common;

use weft_core::gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};
use weft_core::Error;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small file with every metadata type, nested arrays and three tensors.
fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("u8", Value::U8(7))
        .metadata("i8", Value::I8(-7))
        .metadata("u16", Value::U16(65535))
        .metadata("i16", Value::I16(-300))
        .metadata("u32", Value::U32(1 << 31))
        .metadata("i32", Value::I32(-1))
        .metadata("u64", Value::U64(u64::MAX))
        .metadata("i64", Value::I64(i64::MIN))
        .metadata("f32", Value::F32(1.5))
        .metadata("f64", Value::F64(-2.25))
        .metadata("bool", Value::Bool(true))
        .metadata("str", Value::String("héllo ▁ 日本".into()))
        .metadata("arr.f32", Value::Array(Array::F32(vec![0.5, -1.0])))
        .metadata(
            "arr.str",
            Value::Array(Array::String(vec!["a".into(), String::new(), "ccc".into()])),
        )
        .metadata("arr.bool", Value::Array(Array::Bool(vec![true, false])))
        .metadata("arr.empty", Value::Array(Array::I64(vec![])))
        .metadata(
            "arr.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2, 3]),
                Array::Array(vec![Array::String(vec!["deep".into()])]),
            ])),
        );
    w.tensor("a", GgmlType::F32, &[3], f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor("b", GgmlType::Q8_0, &[32, 2], vec![0x11; 68])
        .tensor("c", GgmlType::F16, &[5], vec![0x22; 10]);
    w
}

#[test]
fn round_trips_every_value_type_and_tensor() {
    let w = sample();
    let file = GgufFile::from_bytes(w.to_bytes()).expect("valid file");
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.metadata().len(), 18);
    assert_eq!(file.get("u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(file.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(file.get_str("str").unwrap(), "héllo ▁ 日本");
    assert_eq!(file.get_f64("f32").unwrap(), 1.5);
    assert!(file.get_bool("bool").unwrap());
    assert_eq!(
        file.get_array("arr.nested").unwrap(),
        &Array::Array(vec![
            Array::U32(vec![1, 2, 3]),
            Array::Array(vec![Array::String(vec!["deep".into()])]),
        ])
    );
    assert!(matches!(
        file.get_u64("str"),
        Err(Error::WrongValueType { .. })
    ));
    assert!(matches!(
        file.get_u64("nope"),
        Err(Error::MissingKey { .. })
    ));

    let a = file.tensor("a").unwrap();
    assert_eq!(file.tensor_data(a), f32_bytes(&[1.0, 2.0, 3.0]).as_slice());
    let b = file.tensor("b").unwrap();
    assert_eq!(
        (b.dtype, b.shape.clone(), b.n_bytes),
        (GgmlType::Q8_0, vec![32, 2], 68)
    );
    assert_eq!(b.offset % 32, 0);
    assert_eq!(file.tensor_data(b), &[0x11; 68][..]);
    assert_eq!(file.tensor_data(file.tensor("c").unwrap()), &[0x22; 10][..]);
    assert!(matches!(
        file.tensor("zz"),
        Err(Error::MissingTensor { .. })
    ));
}

#[test]
fn honours_custom_alignment_and_version_2() {
    let mut w = sample();
    w.version(2).alignment(64);
    w.metadata("general.alignment", Value::U32(64));
    let file = GgufFile::from_bytes(w.to_bytes()).expect("valid file");
    assert_eq!((file.version(), file.alignment()), (2, 64));
    assert_eq!(file.data_offset() % 64, 0);
    for t in file.tensors() {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    assert_eq!(file.tensor_data(file.tensor("c").unwrap()), &[0x22; 10][..]);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().to_bytes();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(
            r.is_err(),
            "file cut at {len} of {} bytes parsed",
            bytes.len()
        );
    }
}

#[test]
fn random_corruption_never_panics() {
    let bytes = sample().to_bytes();
    // xorshift: deterministic, no dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        if let Ok(file) = GgufFile::from_bytes(b) {
            for t in file.tensors() {
                assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
            }
        }
    }
}

/// A file with no metadata and one 4-element F32 tensor named `t`, and the offsets of its
/// tensor-info fields.
fn one_tensor() -> (Vec<u8>, usize, usize, usize) {
    let mut w = GgufWriter::new();
    w.tensor("t", GgmlType::F32, &[4], f32_bytes(&[1.0; 4]));
    let bytes = w.to_bytes();
    // header (24) + name length (8) + "t" + n_dims (4) + one dimension (8)
    let dim_at = 24 + 8 + 1 + 4;
    let type_at = dim_at + 8;
    let offset_at = type_at + 4;
    (bytes, dim_at, type_at, offset_at)
}

fn parse(bytes: Vec<u8>) -> Error {
    GgufFile::from_bytes(bytes).expect_err("malformed file parsed")
}

#[test]
fn bad_magic_and_versions() {
    let mut b = sample().to_bytes();
    b[0] = b'X';
    assert!(matches!(parse(b), Error::BadMagic { .. }));
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut w = sample();
        w.version(v);
        assert!(
            matches!(parse(w.to_bytes()), Error::UnsupportedVersion { version } if version == v)
        );
    }
}

#[test]
fn huge_counts_and_lengths_are_rejected_before_allocating() {
    let base = sample().to_bytes();
    // tensor count, metadata count, first key's length
    for (at, what) in [
        (8, "tensor count"),
        (16, "metadata count"),
        (24, "key length"),
    ] {
        for huge in [u64::MAX, u64::MAX / 2, 1 << 40] {
            let mut b = base.clone();
            b[at..at + 8].copy_from_slice(&huge.to_le_bytes());
            let e = parse(b);
            assert!(
                matches!(e, Error::ImplausibleCount { .. } | Error::Truncated { .. }),
                "{what} = {huge}: {e}"
            );
        }
    }
    // An array claiming 2^60 strings.
    let mut w = GgufWriter::new();
    w.metadata("a", Value::Array(Array::String(vec!["x".into()])));
    let mut b = w.to_bytes();
    let len_at = 24 + 8 + 1 + 4 + 4; // key, value type, element type
    b[len_at..len_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(parse(b), Error::ImplausibleCount { .. }));
}

/// A count in the header is checked against the bytes left (each entry takes some), which a
/// large file lets through at billions: the parser must not reserve for all of them up front.
/// The file here is 1 TiB and sparse, its header claiming as many entries (or tensors) as
/// would fit; its entries, all zeros, are empty keys (names), the second a duplicate.
#[test]
fn a_count_as_large_as_a_huge_file_allows_reserves_nothing_up_front() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let size = 1u64 << 40;
    for (count_at, what) in [(16, "metadata"), (8, "tensor")] {
        let path = dir.path().join(format!("{what}.gguf"));
        let mut header = GgufWriter::new().to_bytes();
        header[count_at..count_at + 8].copy_from_slice(&(size / 32).to_le_bytes());
        std::fs::write(&path, &header).expect("write the header");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("reopen");
        file.set_len(size).expect("a sparse 1 TiB file");
        let e = GgufFile::open(&path)
            .map(|_| ())
            .expect_err("zeros are not entries");
        assert!(
            matches!(e, Error::Duplicate { .. }),
            "{what} count {}: {e}",
            size / 32
        );
    }
}

#[test]
fn unknown_types_are_rejected() {
    let mut w = GgufWriter::new();
    w.metadata("k", Value::U8(1));
    let mut b = w.to_bytes();
    b[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(
        parse(b),
        Error::UnknownValueType { type_id: 13, .. }
    ));

    let (mut b, _, type_at, _) = one_tensor();
    for bad in [4u32, 31, 40, u32::MAX] {
        b[type_at..type_at + 4].copy_from_slice(&bad.to_le_bytes());
        assert!(matches!(parse(b.clone()), Error::UnknownTensorType { .. }));
    }
}

#[test]
fn tensors_past_the_end_or_misaligned_are_rejected() {
    let (b, dim_at, _, offset_at) = one_tensor();
    // Offset past the data.
    let mut b1 = b.clone();
    b1[offset_at..offset_at + 8].copy_from_slice(&64u64.to_le_bytes());
    assert!(matches!(parse(b1), Error::TensorOutOfBounds { .. }));
    // Offset so large that offset + size overflows.
    let mut b2 = b.clone();
    b2[offset_at..offset_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(parse(b2), Error::TensorOutOfBounds { .. }));
    // A dimension larger than the data.
    let mut b3 = b.clone();
    b3[dim_at..dim_at + 8].copy_from_slice(&1000u64.to_le_bytes());
    assert!(matches!(parse(b3), Error::TensorOutOfBounds { .. }));
    // A dimension whose byte size overflows.
    let mut b4 = b.clone();
    b4[dim_at..dim_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(parse(b4), Error::BadShape { .. }));
    // An offset that is not a multiple of the alignment.
    let mut b5 = b.clone();
    b5[offset_at..offset_at + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(parse(b5), Error::BadAlignment { .. }));
    // Too many dimensions.
    let mut b6 = b;
    b6[dim_at - 4..dim_at].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(parse(b6), Error::ImplausibleCount { .. }));
}

#[test]
fn bad_alignment_values_and_partial_blocks_are_rejected() {
    for bad in [
        Value::U32(0),
        Value::U32(3),
        Value::U32(48),
        Value::U64(32),
        Value::String("32".into()),
    ] {
        let mut w = sample();
        w.metadata("general.alignment", bad.clone());
        assert!(
            matches!(parse(w.to_bytes()), Error::BadAlignment { .. }),
            "{bad:?}"
        );
    }
    let mut w = GgufWriter::new();
    w.tensor("q", GgmlType::Q4_0, &[16], vec![0; 18]);
    assert!(matches!(parse(w.to_bytes()), Error::BadShape { .. }));
}

#[test]
fn duplicates_deep_nesting_bad_utf8_and_bad_bools_are_rejected() {
    let mut w = GgufWriter::new();
    w.metadata("k", Value::U8(1)).metadata("k", Value::U8(2));
    assert!(matches!(parse(w.to_bytes()), Error::Duplicate { .. }));

    let mut w = GgufWriter::new();
    w.tensor("t", GgmlType::F32, &[1], vec![0; 4])
        .tensor("t", GgmlType::F32, &[1], vec![0; 4]);
    assert!(matches!(parse(w.to_bytes()), Error::Duplicate { .. }));

    let mut deep = Array::U8(vec![1]);
    for _ in 0..20 {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.metadata("deep", Value::Array(deep));
    assert!(matches!(parse(w.to_bytes()), Error::NestingTooDeep { .. }));

    let mut w = GgufWriter::new();
    w.metadata("s", Value::String("ab".into()));
    let mut b = w.to_bytes();
    let at = 24 + 8 + 1 + 4 + 8;
    b[at] = 0xFF;
    assert!(matches!(parse(b), Error::InvalidUtf8 { .. }));

    let mut w = GgufWriter::new();
    w.metadata("b", Value::Bool(true));
    let mut b = w.to_bytes();
    b[24 + 8 + 1 + 4] = 2;
    assert!(parse(b).to_string().contains("bool"));
}

#[test]
fn opening_a_missing_file_is_an_io_error() {
    let e = GgufFile::open("/nonexistent/model.gguf").expect_err("no such file");
    assert!(matches!(e, Error::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/model.gguf"));
}

/// Tensor counts by type and data offsets as the `gguf` Python package reads these files.
#[test]
fn real_models_parse_as_gguf_py_reads_them() {
    type Expected<'a> = (&'a str, usize, u64, &'a [(GgmlType, usize)]);
    let expect: [Expected; 2] = [
        (
            "smollm2-135m",
            272,
            1_785_664,
            &[
                (GgmlType::Q4_1, 210),
                (GgmlType::F32, 61),
                (GgmlType::Q8_0, 1),
            ],
        ),
        (
            "gemma3-270m",
            236,
            6_525_120,
            &[
                (GgmlType::F32, 109),
                (GgmlType::Q5_0, 81),
                (GgmlType::Q4_K, 27),
                (GgmlType::Q8_0, 10),
                (GgmlType::Q6_K, 9),
            ],
        ),
    ];
    for (name, n_tensors, data_offset, by_type) in expect {
        let file = common::open_model(name);
        assert_eq!(file.version(), 3);
        assert_eq!(file.tensors().len(), n_tensors, "{name}");
        assert_eq!(file.data_offset(), data_offset, "{name}");
        assert_eq!(file.metadata().len(), 33, "{name}"); // GGUF.kv_count in gguf-py
        for &(ty, n) in by_type {
            let count = file.tensors().iter().filter(|t| t.dtype == ty).count();
            assert_eq!(count, n, "{name} {ty}");
        }
        let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
        assert!(total <= file.file_size() - data_offset);
    }
}
