//! llama.cpp's GGUF LoRA format (what `convert_lora_to_gguf.py` writes): `general.type =
//! adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and for each adapted base tensor
//! `<name>.lora_a` (ggml `[in, rank]`) and `<name>.lora_b` (ggml `[rank, out]`).

use std::collections::HashMap;

use super::{key, pair_from, LoraAdapter, Proj};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;

fn bad(reason: String) -> Error {
    Error::BadAdapter { reason }
}

/// The adapter in `file`, checked against the base model `base`.
pub fn load(file: &GgufFile, base: &GgufFile, name: &str) -> Result<LoraAdapter> {
    let kind = file.opt_str("general.type")?.unwrap_or("");
    let adapter_type = file.opt_str("adapter.type")?.unwrap_or("");
    if kind != "adapter" || adapter_type != "lora" {
        return Err(bad(format!(
            "{name} is not a LoRA adapter (general.type {kind:?}, adapter.type {adapter_type:?})"
        )));
    }
    let arch = file.architecture()?;
    let base_arch = base.architecture()?;
    if arch != base_arch {
        return Err(bad(format!(
            "{name} is an adapter for {arch} models, the base model is {base_arch}"
        )));
    }
    let alpha = file.opt_f64("adapter.lora.alpha")?.unwrap_or(0.0) as f32;
    let mut pairs = HashMap::new();
    for a_info in file.tensors() {
        let Some(target) = a_info.name.strip_suffix(".lora_a") else {
            if let Some(target) = a_info.name.strip_suffix(".lora_b") {
                if file.tensor(&format!("{target}.lora_a")).is_err() {
                    return Err(bad(format!(
                        "{name}: {} has no {target}.lora_a",
                        a_info.name
                    )));
                }
                continue;
            }
            return Err(bad(format!("{name}: unexpected tensor {}", a_info.name)));
        };
        let b_name = format!("{target}.lora_b");
        let b_info = file
            .tensor(&b_name)
            .map_err(|_| bad(format!("{name}: {} has no {b_name}", a_info.name)))?;
        let (layer, proj) = Proj::parse_gguf(target).ok_or_else(|| {
            bad(format!(
                "{name}: weft applies adapters to attention and MLP projections, not to {target}"
            ))
        })?;
        let (n_in, n_out) = base_shape(base, target, name)?;
        let rank = a_info.shape.get(1).copied().unwrap_or(0) as usize;
        if a_info.shape != [n_in as u64, rank as u64]
            || b_info.shape != [rank as u64, n_out as u64]
            || rank == 0
        {
            return Err(bad(format!(
                "{name}: {target} has lora_a {:?} and lora_b {:?}, the base tensor is {n_out} × {n_in} (expected [{n_in}, r] and [r, {n_out}])",
                a_info.shape, b_info.shape
            )));
        }
        let a = values(file, a_info)?;
        let b = values(file, b_info)?;
        let scale = if alpha != 0.0 {
            alpha / rank as f32
        } else {
            1.0
        };
        let pair = pair_from(rank, n_in, n_out, &a, &b, scale)
            .map_err(|reason| bad(format!("{name}: {target}: {reason}")))?;
        pairs.insert(key(layer, proj), pair);
    }
    if pairs.is_empty() {
        return Err(bad(format!("{name} holds no LoRA tensors")));
    }
    Ok(LoraAdapter::new(name, arch, pairs))
}

/// (input, output) features of the base model's tensor `target`.
pub(crate) fn base_shape(base: &GgufFile, target: &str, name: &str) -> Result<(usize, usize)> {
    let info = base.tensor(target).map_err(|_| {
        bad(format!(
            "{name} adapts {target}, which the base model does not have"
        ))
    })?;
    match info.shape[..] {
        [n_in, n_out] => Ok((n_in as usize, n_out as usize)),
        _ => Err(bad(format!("{target} of the base model is not a matrix"))),
    }
}

fn values(file: &GgufFile, info: &TensorInfo) -> Result<Vec<f32>> {
    quant::dequantize_to_vec(info.dtype, file.tensor_data(info))
}
