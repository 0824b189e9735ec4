//! Hugging Face PEFT adapters: a directory with `adapter_config.json` (`r`, `lora_alpha`,
//! `target_modules`, …) and `adapter_model.safetensors` (`…layers.N.self_attn.q_proj.lora_A.weight`
//! of shape `[r, in]`, `….lora_B.weight` of shape `[out, r]`).
//!
//! Module names map to the GGUF base tensors as the model converter maps them (`q_proj` →
//! `attn_q`, …). For the llama architecture, the converter permutes the rows of `q_proj` and
//! `k_proj` (its rotary layout differs from Hugging Face's); the `B` matrices of those
//! projections get the same permutation here, as llama.cpp's `convert_lora_to_gguf.py` does.

use std::collections::HashMap;
use std::path::Path;

use safetensors::SafeTensors;
use serde_json::Value;

use super::gguf::base_shape;
use super::{key, pair_from, LoraAdapter, Proj};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::models::tensor_file::to_f32;

fn bad(reason: String) -> Error {
    Error::BadAdapter { reason }
}

/// The PEFT adapter in directory `dir`, checked against the base model `base`.
pub fn load(dir: &Path, base: &GgufFile) -> Result<LoraAdapter> {
    let name = dir.display().to_string();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let config_path = dir.join("adapter_config.json");
    let config: Value =
        serde_json::from_slice(&std::fs::read(&config_path).map_err(io(&config_path))?)
            .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
    let flag = |k: &str| config.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("use_dora") {
        return Err(bad(format!(
            "{name}: DoRA adapters (use_dora) are not supported"
        )));
    }
    if flag("fan_in_fan_out") {
        return Err(bad(format!(
            "{name}: fan_in_fan_out adapters are not supported"
        )));
    }
    if config
        .get("bias")
        .and_then(Value::as_str)
        .is_some_and(|b| b != "none")
    {
        return Err(bad(format!(
            "{name}: adapters with trained biases are not supported"
        )));
    }
    for k in ["rank_pattern", "alpha_pattern"] {
        if config
            .get(k)
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(bad(format!("{name}: per-module {k} is not supported")));
        }
    }
    let peft_type = config.get("peft_type").and_then(Value::as_str);
    if peft_type.is_some_and(|t| !t.eq_ignore_ascii_case("lora")) {
        return Err(bad(format!(
            "{name}: a {} adapter (peft_type); weft loads LoRA adapters",
            peft_type.unwrap_or_default()
        )));
    }
    let empty = |m: &Value| m.is_null() || m.as_array().is_some_and(Vec::is_empty);
    if config.get("modules_to_save").is_some_and(|m| !empty(m)) {
        return Err(bad(format!(
            "{name}: modules_to_save (full weights) is not supported"
        )));
    }
    if config.get("layer_replication").is_some_and(|m| !empty(m)) {
        return Err(bad(format!(
            "{name}: layer_replication (a model with repeated layers) is not supported"
        )));
    }
    let r = match config.get("r") {
        None => return Err(bad(format!("{name}: adapter_config.json has no rank r"))),
        Some(r) => r.as_u64().filter(|&r| r > 0).ok_or_else(|| {
            bad(format!(
                "{name}: adapter_config.json's rank r must be a positive integer, not {r}"
            ))
        })? as usize,
    };
    // PEFT's LoraConfig defaults lora_alpha to 8, and scales by alpha / r even when alpha is 0
    // (llama.cpp's GGUF files are the ones where 0 means "no scaling").
    let alpha = match config.get("lora_alpha") {
        None | Some(Value::Null) => 8.0,
        Some(a) => a.as_f64().filter(|a| a.is_finite()).ok_or_else(|| {
            bad(format!(
                "{name}: adapter_config.json's lora_alpha must be a number, not {a}"
            ))
        })? as f32,
    };
    let scale = if flag("use_rslora") {
        alpha / (r as f32).sqrt()
    } else {
        alpha / r as f32
    };

    let weights_path = dir.join("adapter_model.safetensors");
    let file = std::fs::File::open(&weights_path).map_err(io(&weights_path))?;
    // SAFETY: read-only map of a file nobody is expected to change while we read it (as for
    // the model files).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(&weights_path))?;
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| bad(format!("{}: {e}", weights_path.display())))?;

    let arch = base.architecture()?.to_string();
    let heads = |k: &str| {
        base.get_u64(&format!("{arch}.attention.{k}"))
            .map(|v| v as usize)
    };
    let n_head = heads("head_count")?;
    let n_head_kv = base
        .opt_u64(&format!("{arch}.attention.head_count_kv"))?
        .map_or(n_head, |v| v as usize);

    let mut pairs = HashMap::new();
    for (tensor_name, _) in st.tensors() {
        let Some(prefix) = tensor_name.strip_suffix(".lora_A.weight") else {
            if let Some(prefix) = tensor_name.strip_suffix(".lora_B.weight") {
                if st.tensor(&format!("{prefix}.lora_A.weight")).is_err() {
                    return Err(bad(format!(
                        "{name}: {tensor_name} has no {prefix}.lora_A.weight"
                    )));
                }
                continue;
            }
            return Err(bad(format!("{name}: unexpected tensor {tensor_name}")));
        };
        let (layer, proj) = parse_module(prefix).ok_or_else(|| {
            bad(format!(
                "{name}: cannot map module {prefix} to a projection"
            ))
        })?;
        let target = format!("blk.{layer}.{}.weight", proj.gguf_name());
        let (n_in, n_out) = base_shape(base, &target, &name)?;
        let a = read(&st, &tensor_name, &name)?;
        let b_name = format!("{prefix}.lora_B.weight");
        let b = read(&st, &b_name, &name)?;
        if a.0 != [r, n_in] || b.0 != [n_out, r] {
            return Err(bad(format!(
                "{name}: {prefix} has lora_A {:?} and lora_B {:?}; expected [{r}, {n_in}] and [{n_out}, {r}] (rank {r} from adapter_config.json)",
                a.0, b.0
            )));
        }
        let mut b = b.1;
        if arch == "llama" && matches!(proj, Proj::Q | Proj::K) {
            let heads = if proj == Proj::Q { n_head } else { n_head_kv };
            b = permute_rows(&b, n_out, r, heads).ok_or_else(|| {
                bad(format!(
                    "{name}: {prefix} rows do not split into {heads} heads"
                ))
            })?;
        }
        let pair = pair_from(r, n_in, n_out, &a.1, &b, scale)
            .map_err(|reason| bad(format!("{name}: {prefix}: {reason}")))?;
        pairs.insert(key(layer, proj), pair);
    }
    if pairs.is_empty() {
        return Err(bad(format!("{name} holds no LoRA tensors")));
    }
    Ok(LoraAdapter::new(name, arch, pairs))
}

/// `(layer, projection)` of a PEFT module path such as
/// `base_model.model.model.layers.3.self_attn.q_proj`.
fn parse_module(prefix: &str) -> Option<(usize, Proj)> {
    let at = prefix.find("layers.")?;
    let rest = &prefix[at + "layers.".len()..];
    let (layer, rest) = rest.split_once('.')?;
    let module = rest.rsplit('.').next()?;
    let proj = Proj::ALL.into_iter().find(|p| p.hf_name() == module)?;
    Some((layer.parse().ok()?, proj))
}

/// A tensor's shape and values as f32.
fn read(st: &SafeTensors, tensor: &str, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let view = st
        .tensor(tensor)
        .map_err(|_| bad(format!("{name}: missing tensor {tensor}")))?;
    let values = to_f32(view.dtype(), view.data()).ok_or_else(|| {
        bad(format!(
            "{name}: tensor {tensor} has unsupported type {:?}",
            view.dtype()
        ))
    })?;
    Ok((view.shape().to_vec(), values))
}

/// The rows of `w` (`n_out × cols`, row-major) in the order llama's converter gives `q_proj` /
/// `k_proj`: within each head, the two rotary halves interleaved (row `h·d + 2j + s` takes row
/// `h·d + s·d/2 + j`).
pub fn permute_rows(w: &[f32], n_out: usize, cols: usize, heads: usize) -> Option<Vec<f32>> {
    if heads == 0 || !n_out.is_multiple_of(2 * heads) {
        return None;
    }
    let d = n_out / heads;
    let half = d / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let src = h * d + s * half + j;
                let dst = h * d + 2 * j + s;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    Some(out)
}
