//! Reading a model's tensors and hyper-parameters out of its GGUF file, with shape checks.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::Matrix;
use crate::quant;

/// A weight matrix inside the model file (no copy: it is read from the mapped file).
#[derive(Debug, Clone)]
pub struct Linear {
    /// Where the tensor lies in the file, kept so the forward pass needs no lookup by name.
    info: TensorInfo,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

impl Linear {
    /// The matrix view, borrowing the file's bytes.
    pub fn matrix<'a>(&self, file: &'a GgufFile) -> Result<Matrix<'a>> {
        Matrix::new(
            self.info.dtype,
            file.tensor_data(&self.info),
            self.rows,
            self.cols,
        )
    }
}

/// Looks up tensors and hyper-parameters of one architecture (`{arch}.…` keys).
pub struct Loader {
    pub file: Arc<GgufFile>,
    pub arch: String,
}

fn bad(reason: String) -> Error {
    Error::BadModel { reason }
}

impl Loader {
    /// A required integer hyper-parameter `{arch}.{key}`, which must be positive.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let full = format!("{}.{key}", self.arch);
        let v = self.file.get_u64(&full)?;
        if v == 0 || v > u32::MAX as u64 {
            return Err(bad(format!("{full} = {v}")));
        }
        Ok(v as usize)
    }

    /// An optional integer hyper-parameter.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let full = format!("{}.{key}", self.arch);
        match self.file.get(&full) {
            None => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    /// An optional float hyper-parameter.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        let full = format!("{}.{key}", self.arch);
        Ok(self.file.opt_f64(&full)?.map(|v| v as f32))
    }

    /// A weight matrix `name` of shape `rows × cols` (ggml `[cols, rows]`).
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let info = self.file.tensor(name)?;
        if info.shape != [cols as u64, rows as u64] {
            return Err(bad(format!(
                "tensor {name} has shape {:?}, expected [{cols}, {rows}]",
                info.shape
            )));
        }
        let lin = Linear {
            info: info.clone(),
            rows,
            cols,
        };
        lin.matrix(&self.file)?; // checks the type is one the kernels run
        Ok(lin)
    }

    /// Whether the file has a tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_ok()
    }

    /// A vector (norm weights, frequency factors) of `len` values, dequantized to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.file.tensor(name)?;
        if info.n_elements() != len as u64 {
            return Err(bad(format!(
                "tensor {name} has {} values, expected {len}",
                info.n_elements()
            )));
        }
        quant::dequantize_to_vec(info.dtype, self.file.tensor_data(info))
    }
}
