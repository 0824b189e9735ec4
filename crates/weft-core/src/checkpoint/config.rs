//! A Hugging Face `config.json` read into the GGUF hyper-parameters weft's model files take, with
//! every setting weft does not implement refused by name.
//!
//! Both spellings transformers has written are read: version 4's `rope_theta`,
//! `rope_scaling` and `rope_local_base_freq`, and version 5's `rope_parameters` (one object, or
//! one per attention kind for Gemma 3).

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::gguf::Value as Meta;

/// The decoder families a checkpoint can hold, as weft's model files name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Gemma3,
}

impl Family {
    /// The GGUF architecture name.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Gemma3 => "gemma3",
        }
    }
}

/// The hyper-parameters of a checkpoint's text decoder.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub family: Family,
    pub n_embd: usize,
    pub n_layers: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// `None`: the embedding table's rows.
    pub vocab: Option<usize>,
    pub tied: bool,
    /// `{arch}.…` metadata keys (without the prefix) and values.
    pub meta: Vec<(&'static str, Meta)>,
    /// The special token ids `config.json` names.
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
}

pub(super) fn bad(reason: impl Into<String>) -> Error {
    Error::BadModel {
        reason: reason.into(),
    }
}

fn unsupported(what: String) -> Error {
    bad(format!(
        "config.json: {what}, which weft does not implement"
    ))
}

/// A positive integer field.
fn int(c: &Value, key: &str) -> Result<usize> {
    opt_int(c, key)?.ok_or_else(|| bad(format!("config.json has no {key}")))
}

fn opt_int(c: &Value, key: &str) -> Result<Option<usize>> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().filter(|&n| n > 0 && n <= u32::MAX as u64) {
            Some(n) => Ok(Some(n as usize)),
            None => Err(bad(format!(
                "config.json: {key} = {v} is not a positive integer"
            ))),
        },
    }
}

fn opt_f32(c: &Value, key: &str) -> Result<Option<f32>> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64().filter(|x| x.is_finite()) {
            Some(x) => Ok(Some(x as f32)),
            None => Err(bad(format!("config.json: {key} = {v} is not a number"))),
        },
    }
}

/// A token id field: an integer, or the first of a list (`eos_token_id: [1, 106]`).
pub(super) fn token_id(v: Option<&Value>) -> Option<u32> {
    match v? {
        Value::Array(a) => a.first()?.as_u64(),
        v => v.as_u64(),
    }
    .and_then(|n| u32::try_from(n).ok())
}

/// The defaults transformers' config class of `kind` (`llama`, `mistral`, `gemma3_text`) gives
/// the settings a `config.json` leaves out (the published multimodal Gemma 3 files leave most of
/// `text_config` out). The vocabulary size is left to the embedding table.
fn defaults(kind: &str) -> Value {
    match kind {
        "gemma3_text" => json!({
            "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072,
            "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 4096,
            "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
            "tie_word_embeddings": true, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0
        }),
        "mistral" => json!({
            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
            "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "rope_theta": 10_000.0,
            "sliding_window": 4096, "tie_word_embeddings": false, "bos_token_id": 1,
            "eos_token_id": 2
        }),
        _ => json!({
            "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "rope_theta": 10_000.0, "tie_word_embeddings": false,
            "bos_token_id": 1, "eos_token_id": 2
        }),
    }
}

/// `c` over the defaults of `kind`: a key `c` has (even as `null`) is `c`'s.
fn with_defaults(c: &Value, kind: &str) -> Value {
    let mut merged = defaults(kind);
    if let (Some(m), Some(c)) = (merged.as_object_mut(), c.as_object()) {
        for (k, v) in c {
            m.insert(k.clone(), v.clone());
        }
    }
    merged
}

/// Which family `config.json` describes, and the object holding its text decoder's settings
/// (the top level, or `text_config` of a multimodal Gemma 3).
pub fn family(c: &Value) -> Result<(Family, &Value)> {
    let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
    let archs: Vec<&str> = c
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let is = |names: &[&str], types: &[&str]| {
        archs.iter().any(|a| names.contains(a)) || types.contains(&model_type)
    };
    if is(
        &["LlamaForCausalLM", "MistralForCausalLM"],
        &["llama", "mistral"],
    ) {
        return Ok((Family::Llama, c));
    }
    if is(&["Gemma3ForCausalLM"], &["gemma3_text"]) {
        return Ok((Family::Gemma3, c));
    }
    if is(&["Gemma3ForConditionalGeneration"], &["gemma3"]) {
        let text = c
            .get("text_config")
            .filter(|t| t.is_object())
            .ok_or_else(|| bad("config.json: a Gemma 3 checkpoint without text_config"))?;
        return Ok((Family::Gemma3, text));
    }
    let arch = archs.first().copied().unwrap_or(model_type);
    Err(Error::UnknownArchitecture {
        arch: if arch.is_empty() { "(none named)" } else { arch }.to_string(),
        supported: "LlamaForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration (its text decoder) from safetensors",
    })
}

/// The RoPE base and linear scaling factor of one `rope_parameters` / `rope_scaling` object
/// (`None`: no scaling), refusing the kinds weft does not implement.
fn rope(params: Option<&Value>, theta: Option<f32>) -> Result<(Option<f32>, Option<f32>)> {
    let Some(p) = params.filter(|p| !p.is_null()) else {
        return Ok((theta, None));
    };
    let theta = opt_f32(p, "rope_theta")?.or(theta);
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "linear" => Ok((theta, opt_f32(p, "factor")?)),
        other => Err(unsupported(format!("RoPE scaling {other:?}"))),
    }
}

/// The RoPE of version 5's `params` or, without it, of version 4's `scaling`. A file that
/// carries both is read by both: a scaling weft does not implement in either is refused, and
/// so are two that disagree.
fn rope_of(
    params: Option<&Value>,
    scaling: Option<&Value>,
    theta: Option<f32>,
) -> Result<(Option<f32>, Option<f32>)> {
    let legacy = rope(scaling, theta)?;
    let Some(params) = params.filter(|p| !p.is_null()) else {
        return Ok(legacy);
    };
    let current = rope(Some(params), theta)?;
    if scaling.is_some_and(|s| !s.is_null()) && legacy.1 != current.1 {
        return Err(bad(
            "config.json: rope_parameters and rope_scaling give two different RoPE scalings",
        ));
    }
    Ok(current)
}

/// Reads the decoder's hyper-parameters; `top` is the whole file (for the special token ids).
pub fn read(top: &Value) -> Result<HfConfig> {
    let (family, c) = family(top)?;
    if top.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return Err(bad(
            "config.json: quantization_config (a GPTQ, AWQ or bitsandbytes checkpoint), which weft does not implement: load the unquantized checkpoint, or a GGUF file",
        ));
    }
    let kind = match family {
        Family::Gemma3 => "gemma3_text",
        Family::Llama if c.get("model_type").and_then(Value::as_str) == Some("mistral") => {
            "mistral"
        }
        Family::Llama => "llama",
    };
    let c = &with_defaults(c, kind);
    let n_embd = int(c, "hidden_size")?;
    let n_head = int(c, "num_attention_heads")?;
    let n_head_kv = opt_int(c, "num_key_value_heads")?.unwrap_or(n_head);
    let head_dim = opt_int(c, "head_dim")?.unwrap_or(n_embd / n_head);
    let n_layers = int(c, "num_hidden_layers")?;
    let eps = opt_f32(c, "rms_norm_eps")?;
    for flag in ["attention_bias", "mlp_bias", "use_bidirectional_attention"] {
        if c.get(flag).and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(format!("{flag} = true")));
        }
    }
    let mut meta = vec![
        ("embedding_length", Meta::U32(n_embd as u32)),
        ("block_count", Meta::U32(n_layers as u32)),
        (
            "feed_forward_length",
            Meta::U32(int(c, "intermediate_size")? as u32),
        ),
        ("attention.head_count", Meta::U32(n_head as u32)),
        ("attention.head_count_kv", Meta::U32(n_head_kv as u32)),
        ("attention.key_length", Meta::U32(head_dim as u32)),
        ("attention.value_length", Meta::U32(head_dim as u32)),
    ];
    if let Some(n) = opt_int(c, "max_position_embeddings")? {
        meta.push(("context_length", Meta::U32(n as u32)));
    }
    if let Some(eps) = eps {
        meta.push(("attention.layer_norm_rms_epsilon", Meta::F32(eps)));
    }
    let theta = opt_f32(c, "rope_theta")?;
    let params = c.get("rope_parameters");
    let (base, factor) = match family {
        Family::Llama => {
            let act = c
                .get("hidden_act")
                .and_then(Value::as_str)
                .unwrap_or("silu");
            if act != "silu" {
                return Err(unsupported(format!("hidden_act {act:?}")));
            }
            if opt_int(c, "sliding_window")?.is_some() {
                return Err(unsupported(
                    "a sliding window on a Llama/Mistral model".into(),
                ));
            }
            meta.push(("rope.dimension_count", Meta::U32(head_dim as u32)));
            rope_of(params, c.get("rope_scaling"), theta)?
        }
        Family::Gemma3 => {
            gemma3_checks(c, n_layers, params)?;
            if let Some(w) = opt_int(c, "sliding_window")? {
                meta.push(("attention.sliding_window", Meta::U32(w as u32)));
            }
            let scalar = opt_f32(c, "query_pre_attn_scalar")?.unwrap_or(head_dim as f32);
            meta.push(("attention.scale", Meta::F32(1.0 / scalar.sqrt())));
            let global = params.and_then(|p| p.get("full_attention")).or(params);
            rope_of(global, c.get("rope_scaling"), theta)?
        }
    };
    if let Some(base) = base {
        meta.push(("rope.freq_base", Meta::F32(base)));
    }
    if let Some(f) = factor {
        meta.push(("rope.scaling.type", Meta::String("linear".into())));
        meta.push(("rope.scaling.factor", Meta::F32(f)));
    }
    let tied = c
        .get("tie_word_embeddings")
        .or_else(|| top.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(family == Family::Gemma3);
    // The top level's ids where the decoder's settings (or their defaults) have none.
    let pick = |key: &str| token_id(top.get(key)).or_else(|| token_id(c.get(key)));
    Ok(HfConfig {
        family,
        n_embd,
        n_layers,
        n_head,
        n_head_kv,
        head_dim,
        n_ff: int(c, "intermediate_size")?,
        vocab: opt_int(c, "vocab_size")?,
        tied,
        meta,
        bos: pick("bos_token_id"),
        eos: pick("eos_token_id"),
        pad: pick("pad_token_id"),
    })
}

/// What weft's Gemma 3 file fixes and a checkpoint could set otherwise: the GELU (tanh)
/// activation, no soft-capping, one global layer after every five local ones, and a local RoPE
/// base of 10,000 without scaling.
fn gemma3_checks(c: &Value, n_layers: usize, params: Option<&Value>) -> Result<()> {
    let act = c
        .get("hidden_activation")
        .or_else(|| c.get("hidden_act"))
        .and_then(Value::as_str)
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(unsupported(format!("hidden_activation {act:?}")));
    }
    for cap in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if opt_f32(c, cap)?.is_some() {
            return Err(unsupported(cap.to_string()));
        }
    }
    let global = |i: usize| (i + 1).is_multiple_of(6);
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        let ok = types.len() == n_layers
            && types.iter().enumerate().all(|(i, t)| {
                let want = if global(i) {
                    "full_attention"
                } else {
                    "sliding_attention"
                };
                t.as_str() == Some(want)
            });
        if !ok {
            return Err(unsupported(
                "a layer_types pattern other than five sliding layers per full one".into(),
            ));
        }
    }
    let pattern = opt_int(c, "sliding_window_pattern")?.or(opt_int(c, "_sliding_window_pattern")?);
    if let Some(p) = pattern.filter(|&p| p != 6) {
        return Err(unsupported(format!("sliding_window_pattern {p}")));
    }
    let local = params.and_then(|p| p.get("sliding_attention"));
    let (base, factor) = rope(local, opt_f32(c, "rope_local_base_freq")?)?;
    if let Some(f) = factor {
        return Err(unsupported(format!(
            "RoPE scaling by {f} on the local layers"
        )));
    }
    if let Some(b) = base.filter(|&b| b != 10_000.0) {
        return Err(unsupported(format!(
            "a local RoPE base of {b} (weft's Gemma 3 uses 10000)"
        )));
    }
    Ok(())
}
