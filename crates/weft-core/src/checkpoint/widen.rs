//! A quantized GGUF file with its matrices widened to F16 or F32: the same values (each
//! quantized block dequantized once, as ggml's `dequantize_row_*` gives them), multiplied by
//! the kernels' float paths, which keep the `f32` activations instead of rounding them to 8
//! bits per block of 32 the way quantized matrices do.
//!
//! What that buys: the model's output becomes a smooth function of its inputs and of an
//! adapter's weights at scales below the activation rounding (finite differences, zeroth-order
//! training with a small `sigma`). What it costs: 3.5–7× the file's bytes, and decode speed in
//! proportion.

use super::WeightType;
use crate::error::Result;
use crate::gguf::{GgmlType, GgufFile, GgufWriter};

/// The GGUF bytes of `file` with every quantized tensor stored as `weights` (F16 or F32; Q8_0
/// keeps the file as it is, so it gives `None`). Metadata and float tensors are copied.
pub fn widen(file: &GgufFile, weights: WeightType) -> Result<Option<Vec<u8>>> {
    if weights == WeightType::Q8_0 {
        return Ok(None);
    }
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        // The writer sets its own alignment; the file type is the new one.
        if key != "general.alignment" && key != "general.file_type" {
            w.metadata(key, value.clone());
        }
    }
    // llama.cpp's `LLAMA_FTYPE_ALL_F32` and `LLAMA_FTYPE_MOSTLY_F16`.
    let file_type = if weights == WeightType::F32 { 0 } else { 1 };
    w.metadata("general.file_type", crate::gguf::Value::U32(file_type));
    for info in file.tensors() {
        let data = file.tensor_data(info);
        if is_float(info.dtype) {
            w.tensor(&info.name, info.dtype, &info.shape, data.to_vec());
        } else {
            let values = crate::quant::dequantize_to_vec(info.dtype, data)?;
            w.tensor(
                &info.name,
                weights.ggml(),
                &info.shape,
                weights.encode(&values),
            );
        }
    }
    Ok(Some(w.into_bytes()))
}

fn is_float(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;

    #[test]
    fn quantized_tensors_are_widened_to_their_dequantized_values() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 7.0).collect();
        let q8 = WeightType::Q8_0.encode(&values);
        let norm: Vec<u8> = [1.5f32; 32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", Value::String("llama".into()))
            .tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[32, 2], q8.clone())
            .tensor("blk.0.attn_norm.weight", GgmlType::F32, &[32], norm.clone());
        let file = GgufFile::from_bytes(w.to_bytes()).expect("a GGUF file");
        assert!(widen(&file, WeightType::Q8_0).expect("widen").is_none());
        let expected = crate::quant::dequantize_to_vec(GgmlType::Q8_0, &q8).expect("dequantize");
        for (weights, dtype) in [
            (WeightType::F32, GgmlType::F32),
            (WeightType::F16, GgmlType::F16),
        ] {
            let bytes = widen(&file, weights).expect("widen").expect("a new file");
            let wide = GgufFile::from_bytes(bytes).expect("a GGUF file");
            assert_eq!(wide.architecture().expect("arch"), "llama");
            let q = &wide.tensors()[0];
            assert_eq!((q.dtype, q.shape.as_slice()), (dtype, &[32u64, 2][..]));
            let got = crate::quant::dequantize_to_vec(dtype, wide.tensor_data(q)).expect("read");
            for (g, e) in got.iter().zip(&expected) {
                let tolerance = if dtype == GgmlType::F32 {
                    0.0
                } else {
                    e.abs() / 1024.0
                };
                assert!((g - e).abs() <= tolerance, "{g} vs {e}");
            }
            let n = &wide.tensors()[1];
            assert_eq!((n.dtype, wide.tensor_data(n)), (GgmlType::F32, &norm[..]));
        }
    }
}
