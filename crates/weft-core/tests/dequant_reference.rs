//! weft's dequantizers against an independent reference: gguf-py (llama.cpp's Python package).
//!
//! The fixtures in `tests/fixtures/dequant/` are made by `scripts/gen_dequant_fixtures.py`:
//! raw ggml blocks (slices of real tensors of SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M, plus
//! seeded synthetic blocks for the other types) and the f32 values gguf-py decodes them to.
//!
//! Comparison is **bit-exact** for every type: ggml's formulas are one or two `f32` operations
//! per element (`d * q`, `d * q + m`, `(d * sc) * q - (dmin * m)`), and weft performs them in
//! the same order without fused multiply-add, as does numpy, so every result rounds
//! identically. The only allowance is that a NaN matches any NaN (payloads are not meaningful);
//! the fixtures contain NaN only in the synthetic plain-float cases.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use weft_core::gguf::GgmlType;
use weft_core::quant::{dequantize, dequantize_to_vec, is_supported};

/// The tensor types each real model contains; each must be covered by real (non-synthetic)
/// data, from the start and from the middle of a tensor.
const REAL_MODEL_TYPES: &[(&str, &[GgmlType])] = &[
    ("smollm2", &[GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]),
    (
        "gemma3",
        &[
            GgmlType::F32,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ],
    ),
];

struct Case {
    name: String,
    dtype: GgmlType,
    n_elements: usize,
    source: String,
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dequant")
}

fn dtype_by_name(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("manifest names unknown ggml type {name:?}"))
}

fn load_manifest() -> Vec<Case> {
    let path = fixture_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest is JSON");
    let cases = manifest["cases"]
        .as_array()
        .expect("manifest has a cases array");
    cases
        .iter()
        .map(|c| {
            let field = |k: &str| {
                c[k].as_str()
                    .unwrap_or_else(|| panic!("case {c} has no string field {k:?}"))
                    .to_owned()
            };
            Case {
                name: field("name"),
                dtype: dtype_by_name(&field("type")),
                n_elements: c["n_elements"].as_u64().expect("n_elements") as usize,
                source: field("source"),
            }
        })
        .collect()
}

fn read_fixture(name: &str, ext: &str) -> Vec<u8> {
    let path = fixture_dir().join(format!("{name}.{ext}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Model and first block of a real case's source `"<model>:<tensor>[<first>..<end>)"`.
fn parse_real_source(source: &str) -> Option<(&str, u64)> {
    let (model, rest) = source.split_once(':')?;
    let range = rest.rsplit_once('[')?.1;
    let first = range.split_once("..")?.0.parse().ok()?;
    Some((model, first))
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let cases = load_manifest();
    assert!(!cases.is_empty(), "manifest lists no cases");
    let mut failures = Vec::new();
    for case in &cases {
        let raw = read_fixture(&case.name, "raw");
        let want: Vec<f32> = read_fixture(&case.name, "f32")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(want.len(), case.n_elements, "{}: .f32 length", case.name);
        assert_eq!(
            raw.len() / case.dtype.type_size() * case.dtype.block_size(),
            case.n_elements,
            "{}: .raw length",
            case.name
        );

        let mut got = vec![f32::NAN; case.n_elements];
        dequantize(case.dtype, &raw, &mut got)
            .unwrap_or_else(|e| panic!("{}: dequantize failed: {e}", case.name));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&dequantize_to_vec(case.dtype, &raw).unwrap()),
            bits(&got),
            "{}: dequantize_to_vec differs from dequantize",
            case.name
        );

        let bad: Vec<usize> = (0..case.n_elements)
            .filter(|&i| {
                let (g, w) = (got[i], want[i]);
                g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan())
            })
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{} ({}, {}): {} of {} elements differ; first at {i}: weft {:e} ({:#010x}), \
                 gguf-py {:e} ({:#010x})",
                case.name,
                case.dtype,
                case.source,
                bad.len(),
                case.n_elements,
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits(),
            ));
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn real_model_types_are_covered_by_real_data() {
    let cases = load_manifest();
    let mut missing = Vec::new();
    for &(model, types) in REAL_MODEL_TYPES {
        for &dtype in types {
            let firsts: Vec<u64> = cases
                .iter()
                .filter(|c| c.dtype == dtype)
                .filter_map(|c| parse_real_source(&c.source))
                .filter(|&(m, _)| m == model)
                .map(|(_, first)| first)
                .collect();
            if !firsts.contains(&0) {
                missing.push(format!(
                    "{model} {dtype}: no slice from the start of a tensor"
                ));
            }
            if !firsts.iter().any(|&f| f > 0) {
                missing.push(format!("{model} {dtype}: no slice from inside a tensor"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fixture coverage lost (rerun scripts/gen_dequant_fixtures.py):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_supported_type_has_a_fixture() {
    let covered: BTreeSet<&str> = load_manifest()
        .iter()
        .map(|c| c.dtype.name())
        .collect::<BTreeSet<_>>();
    let uncovered: Vec<GgmlType> = GgmlType::ALL
        .into_iter()
        .filter(|&t| is_supported(t) && !covered.contains(t.name()))
        .collect();
    assert!(
        uncovered.is_empty(),
        "supported types without a fixture: {uncovered:?}"
    );
}
