//! Loading models from tiny synthetic GGUF files (built with our writer): a well-formed tiny
//! Llama runs, and every kind of bad model file is a typed error, not a panic.

use std::sync::Arc;

use weft_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use weft_core::runner::{BatchEntry, ModelRunner, RunnerConfig};
use weft_core::Error;

const D: u64 = 32; // hidden size: one Q8_0 block per row
const FF: u64 = 64;
const VOCAB: u64 = 8;

fn f32s(n: u64, f: impl Fn(u64) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| f(i).to_le_bytes()).collect()
}

/// A 1-layer Llama with hidden size 32, 2 heads of 16, F32 weights (small values).
fn tiny_llama() -> GgufWriter {
    tiny_llama_claiming(1)
}

/// [`tiny_llama`] whose `llama.block_count` says `blocks` (it holds block 0 alone).
fn tiny_llama_claiming(blocks: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("llama.block_count", Value::U32(blocks))
        .metadata("llama.embedding_length", Value::U32(D as u32))
        .metadata("llama.feed_forward_length", Value::U32(FF as u32))
        .metadata("llama.attention.head_count", Value::U32(2))
        .metadata("llama.context_length", Value::U32(64));
    let wgt = |rows: u64, cols: u64| f32s(rows * cols, |i| ((i * 37 % 17) as f32 - 8.0) / 64.0);
    w.tensor(
        "token_embd.weight",
        GgmlType::F32,
        &[D, VOCAB],
        wgt(VOCAB, D),
    )
    .tensor("output_norm.weight", GgmlType::F32, &[D], f32s(D, |_| 1.0));
    for (name, rows, cols) in [
        ("attn_q", D, D),
        ("attn_k", D, D),
        ("attn_v", D, D),
        ("attn_output", D, D),
        ("ffn_gate", FF, D),
        ("ffn_up", FF, D),
        ("ffn_down", D, FF),
    ] {
        w.tensor(
            &format!("blk.0.{name}.weight"),
            GgmlType::F32,
            &[cols, rows],
            wgt(rows, cols),
        );
    }
    w.tensor(
        "blk.0.attn_norm.weight",
        GgmlType::F32,
        &[D],
        f32s(D, |_| 1.0),
    )
    .tensor(
        "blk.0.ffn_norm.weight",
        GgmlType::F32,
        &[D],
        f32s(D, |_| 1.0),
    );
    w
}

fn load(w: &GgufWriter) -> Result<ModelRunner, Error> {
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes())?);
    ModelRunner::new(
        file,
        &RunnerConfig {
            n_threads: 2,
            kv_tokens: 256,
            ..Default::default()
        },
    )
}

#[test]
fn a_tiny_synthetic_llama_runs_and_is_causal() {
    let mut r = load(&tiny_llama()).expect("tiny model loads");
    assert_eq!(r.info().vocab_size, VOCAB as usize);
    assert_eq!(r.n_ctx(), 64);
    let seq = r.new_sequence();
    let batch: Vec<BatchEntry> = [1u32, 2, 3]
        .iter()
        .enumerate()
        .map(|(i, &token)| BatchEntry {
            token,
            pos: i as u32,
            seq,
            logits: true,
            mask: None,
            hidden: false,
            embed: None,
        })
        .collect();
    let all = r.forward(&batch).expect("forward").to_vec();
    assert_eq!(all.len(), 3 * VOCAB as usize);
    assert!(all.iter().all(|v| v.is_finite()));
    // Causality: the first token's logits do not depend on the tokens after it.
    let seq2 = r.new_sequence();
    let first = r
        .forward(
            &batch[..1]
                .iter()
                .map(|e| BatchEntry { seq: seq2, ..*e })
                .collect::<Vec<_>>(),
        )
        .expect("forward");
    assert_eq!(first, &all[..VOCAB as usize]);
    r.free_sequence(seq);
    r.free_sequence(seq2);
    assert!(r.kv_usage().iter().all(|u| u.free == u.total));
}

/// A context length asked for grows the KV cache to hold it, also past the model's training
/// context: the tiny model (trained on 64 tokens) runs a sequence of 300 in a cache of 256.
#[test]
fn an_explicit_context_length_sizes_the_cache() {
    let file = Arc::new(GgufFile::from_bytes(tiny_llama().to_bytes()).expect("tiny model"));
    let cfg = RunnerConfig {
        n_threads: 2,
        kv_tokens: 256,
        n_ctx: Some(300),
        ..Default::default()
    };
    let mut r = ModelRunner::new(file, &cfg).expect("loads");
    assert_eq!(r.n_ctx(), 300);
    let seq = r.new_sequence();
    let tokens: Vec<u32> = (0..300).map(|i| i % VOCAB as u32).collect();
    let logits = r
        .forward(&BatchEntry::run_of(&tokens, seq, 0, false))
        .expect("300 tokens fit");
    assert!(logits.iter().all(|v| v.is_finite()));
    let one_more = BatchEntry::run_of(&[1], seq, 300, false);
    assert!(matches!(
        r.forward(&one_more),
        Err(Error::ContextOverflow { n_ctx: 300, .. })
    ));
}

/// With a layer pager the blocks load one by one; a block count of billions (the file holds
/// one block) must end at block 1's missing tensors, not reserve a slot for every block first.
#[test]
fn a_huge_block_count_with_a_layer_pager_is_a_typed_error() {
    let w = tiny_llama_claiming(u32::MAX);
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes()).expect("parses"));
    let pager = Arc::new(weft_core::models::LayerPager::new(2));
    let e = ModelRunner::new(
        file,
        &RunnerConfig {
            n_threads: 2,
            kv_tokens: 256,
            layer_pager: Some(pager),
            ..Default::default()
        },
    )
    .map(|_| ())
    .expect_err("block 1 is missing");
    assert!(e.to_string().contains("blk.1."), "{e}");
}

#[test]
fn unknown_architecture_is_a_typed_error() {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("mamba".into()));
    let e = load(&w).err().expect("must fail");
    assert!(
        matches!(e, Error::UnknownArchitecture { ref arch, .. } if arch == "mamba"),
        "{e}"
    );
    assert!(e.to_string().contains("llama, gemma3"), "{e}");
    let e = load(&GgufWriter::new()).err().expect("must fail");
    assert!(matches!(e, Error::MissingKey { .. }), "{e}");
}

#[test]
fn missing_tensors_bad_shapes_and_bad_hyperparameters_are_typed_errors() {
    // Drop a tensor by rebuilding without it.
    let full = GgufFile::from_bytes(tiny_llama().to_bytes()).expect("valid");
    let rebuild = |skip: &str, reshape: Option<(&str, Vec<u64>)>, meta: Option<(&str, Value)>| {
        let mut w = GgufWriter::new();
        for (k, v) in full.metadata() {
            match &meta {
                Some((mk, mv)) if mk == k => w.metadata(k, mv.clone()),
                _ => w.metadata(k, v.clone()),
            };
        }
        for t in full.tensors().iter().filter(|t| t.name != skip) {
            let mut shape = t.shape.clone();
            if let Some((name, s)) = &reshape {
                if *name == t.name {
                    shape = s.clone();
                }
            }
            w.tensor(&t.name, t.dtype, &shape, full.tensor_data(t).to_vec());
        }
        w
    };
    let e = load(&rebuild("blk.0.ffn_up.weight", None, None))
        .err()
        .expect("must fail");
    assert!(
        matches!(e, Error::MissingTensor { ref name } if name == "blk.0.ffn_up.weight"),
        "{e}"
    );
    let e = load(&rebuild(
        "",
        Some(("blk.0.attn_q.weight", vec![D * 2, D / 2])),
        None,
    ))
    .err()
    .expect("must fail");
    assert!(matches!(e, Error::BadModel { .. }), "{e}");
    let e = load(&rebuild(
        "",
        None,
        Some(("llama.attention.head_count", Value::U32(0))),
    ))
    .err()
    .expect("must fail");
    assert!(matches!(e, Error::BadModel { .. }), "{e}");
    let e = load(&rebuild(
        "",
        None,
        Some(("llama.block_count", Value::String("one".into()))),
    ))
    .err()
    .expect("must fail");
    assert!(matches!(e, Error::WrongValueType { .. }), "{e}");
}

/// `w` with its metadata `meta` set (added or replaced) and tensors `extra` added.
fn with(
    w: &GgufWriter,
    meta: &[(&str, Value)],
    extra: &[(&str, GgmlType, Vec<u64>)],
) -> GgufWriter {
    let file = GgufFile::from_bytes(w.to_bytes()).expect("valid");
    let mut out = GgufWriter::new();
    for (k, v) in file.metadata() {
        if !meta.iter().any(|(mk, _)| mk == k) {
            out.metadata(k, v.clone());
        }
    }
    for (k, v) in meta {
        out.metadata(k, v.clone());
    }
    for t in file.tensors() {
        if let Some((_, dtype, shape)) = extra.iter().find(|(n, ..)| *n == t.name) {
            // Replaced: the same name with another type (zero bytes of the right size).
            let bytes = dtype.row_bytes(shape[0]).expect("whole blocks") * shape[1];
            out.tensor(&t.name, *dtype, shape, vec![0; bytes as usize]);
        } else {
            out.tensor(&t.name, t.dtype, &t.shape, file.tensor_data(t).to_vec());
        }
    }
    for (name, dtype, shape) in extra {
        if file.tensor(name).is_err() {
            let n: u64 = shape.iter().product();
            out.tensor(name, *dtype, shape, f32s(n, |_| 0.5));
        }
    }
    out
}

/// Logits of tokens 1, 2, 3 at positions 0, 1, 2 (RoPE turns every one but the first).
fn logits_of(w: &GgufWriter) -> Vec<f32> {
    let mut r = load(w).expect("loads");
    let seq = r.new_sequence();
    let out = r
        .forward(&BatchEntry::run_of(&[1, 2, 3], seq, 0, true))
        .expect("forward")
        .to_vec();
    r.free_sequence(seq);
    out
}

#[test]
fn more_heads_than_dimensions_is_a_head_size_of_0() {
    // 64 heads of a 32-wide model and no key length: a head size of 0, with the empty
    // attention matrices that size makes. Refused as the head size it is (it was refused only
    // by the output projection's shape, as a matrix of no columns).
    let w = with(
        &tiny_llama(),
        &[("llama.attention.head_count", Value::U32(64))],
        &[
            ("blk.0.attn_q.weight", GgmlType::F32, vec![D, 0]),
            ("blk.0.attn_k.weight", GgmlType::F32, vec![D, 0]),
            ("blk.0.attn_v.weight", GgmlType::F32, vec![D, 0]),
            ("blk.0.attn_output.weight", GgmlType::F32, vec![0, D]),
        ],
    );
    let e = load(&w).err().expect("must fail");
    assert!(matches!(e, Error::BadModel { .. }), "{e}");
}

/// Biases (a "llamafied" Qwen) and a mixture of experts are refused by name: the Llama model
/// reads neither, and running without them would give wrong outputs silently.
#[test]
fn biases_and_experts_the_model_does_not_read_are_refused() {
    for (name, what) in [
        ("blk.0.attn_q.bias", "bias vectors (blk.0.attn_q.bias)"),
        ("blk.0.ffn_gate_exps.weight", "a mixture of experts"),
    ] {
        let w = with(&tiny_llama(), &[], &[(name, GgmlType::F32, vec![D])]);
        let e = load(&w).err().expect("must fail");
        assert!(
            matches!(e, Error::UnsupportedModel { .. }) && e.to_string().contains(what),
            "{e}"
        );
    }
}

/// RoPE scaling as llama.cpp reads it: linear by default, from `rope.scaling.factor` or the
/// older `rope.scale_linear`; none for type "none"; YaRN refused rather than read as linear.
#[test]
fn rope_scaling_types_are_read_as_llama_cpp_reads_them() {
    let plain = logits_of(&tiny_llama());
    let factor = |key: &str| (key.to_string(), Value::F32(4.0));
    let (k1, v1) = factor("llama.rope.scaling.factor");
    let linear = logits_of(&with(&tiny_llama(), &[(&k1, v1.clone())], &[]));
    assert_ne!(linear, plain, "a factor of 4 changes the logits");
    let (k2, v2) = factor("llama.rope.scale_linear");
    assert_eq!(logits_of(&with(&tiny_llama(), &[(&k2, v2)], &[])), linear);
    let typed = |t: &str| {
        with(
            &tiny_llama(),
            &[
                (&k1, v1.clone()),
                ("llama.rope.scaling.type", Value::String(t.into())),
            ],
            &[],
        )
    };
    assert_eq!(logits_of(&typed("linear")), linear);
    assert_eq!(logits_of(&typed("none")), plain);
    let e = load(&typed("yarn")).err().expect("must fail");
    assert!(
        matches!(e, Error::UnsupportedModel { .. }) && e.to_string().contains("yarn"),
        "{e}"
    );
}

/// A weight of a type the kernels do not run names the tensor; one that can be dequantized
/// (Q8_1) says that widening the weights runs it, one that cannot (IQ4_NL) does not.
#[test]
fn a_weight_type_without_kernels_names_the_tensor() {
    for (dtype, widens) in [(GgmlType::Q8_1, true), (GgmlType::IQ4_NL, false)] {
        let w = with(
            &tiny_llama(),
            &[],
            &[("blk.0.attn_output.weight", dtype, vec![D, D])],
        );
        let e = load(&w).err().expect("must fail");
        let text = e.to_string();
        assert!(
            matches!(e, Error::UnsupportedWeight { ref name, .. } if name == "blk.0.attn_output.weight"),
            "{e}"
        );
        assert_eq!(text.contains("widened"), widens, "{text}");
    }
}

/// A Gemma 3 of `blocks` blocks, hidden size 64, 2 heads of 16 (so n_embd / n_head = 32 is
/// not the head size), F32 weights, with `attention.scale` if given.
fn tiny_gemma3(blocks: u32, scale: Option<f32>) -> GgufWriter {
    const E: u64 = 64;
    const HD: u64 = 16;
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("gemma3".into()))
        .metadata("gemma3.block_count", Value::U32(blocks))
        .metadata("gemma3.embedding_length", Value::U32(E as u32))
        .metadata("gemma3.feed_forward_length", Value::U32(FF as u32))
        .metadata("gemma3.attention.head_count", Value::U32(2))
        .metadata("gemma3.attention.head_count_kv", Value::U32(1))
        .metadata("gemma3.attention.key_length", Value::U32(HD as u32))
        .metadata("gemma3.attention.value_length", Value::U32(HD as u32))
        .metadata("gemma3.context_length", Value::U32(64));
    if let Some(s) = scale {
        w.metadata("gemma3.attention.scale", Value::F32(s));
    }
    let wgt = |rows: u64, cols: u64| f32s(rows * cols, |i| ((i * 37 % 17) as f32 - 8.0) / 16.0);
    let ones = |n: u64| f32s(n, |i| 0.5 + (i % 3) as f32 / 4.0);
    w.tensor(
        "token_embd.weight",
        GgmlType::F32,
        &[E, VOCAB],
        wgt(VOCAB, E),
    )
    .tensor("output_norm.weight", GgmlType::F32, &[E], ones(E));
    for b in 0..blocks {
        for (name, rows, cols) in [
            ("attn_q", 2 * HD, E),
            ("attn_k", HD, E),
            ("attn_v", HD, E),
            ("attn_output", E, 2 * HD),
            ("ffn_gate", FF, E),
            ("ffn_up", FF, E),
            ("ffn_down", E, FF),
        ] {
            let t = format!("blk.{b}.{name}.weight");
            w.tensor(&t, GgmlType::F32, &[cols, rows], wgt(rows, cols));
        }
        for (name, n) in [
            ("attn_norm", E),
            ("attn_q_norm", HD),
            ("attn_k_norm", HD),
            ("post_attention_norm", E),
            ("ffn_norm", E),
            ("post_ffw_norm", E),
        ] {
            let t = format!("blk.{b}.{name}.weight");
            w.tensor(&t, GgmlType::F32, &[n], ones(n));
        }
    }
    w
}

/// Without `attention.scale` (llama.cpp's converter writes none), Gemma 3 scales its queries
/// by 1/√(head size), except the 27B, told by its 62 blocks, which scales by
/// 1/√(n_embd / n_head) (its `query_pre_attn_scalar`, 168 where the head size is 128), as
/// llama.cpp does.
#[test]
fn gemma3_27b_scales_its_queries_by_the_hidden_size_per_head() {
    for (blocks, per_head) in [(18, 16.0f32), (62, 32.0)] {
        let default = logits_of(&tiny_gemma3(blocks, None));
        let named = logits_of(&tiny_gemma3(blocks, Some(1.0 / per_head.sqrt())));
        assert_eq!(default, named, "{blocks} blocks");
        let other = if per_head == 16.0 { 32.0f32 } else { 16.0 };
        let wrong = logits_of(&tiny_gemma3(blocks, Some(1.0 / other.sqrt())));
        assert_ne!(
            default, wrong,
            "{blocks} blocks: the scale shows in the logits"
        );
    }
}
