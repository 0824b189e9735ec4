//! A safetensors file (Hugging Face's weight format): memory-mapped or in memory, its header
//! parsed once with the `safetensors` crate, and every tensor read checked for name, shape and
//! type, so a truncated or mislabelled file is an [`Error::BadModel`], never a panic.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// The bytes of the file: mapped from disk or owned.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One tensor's entry in the header.
#[derive(Debug, Clone)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Its bytes within the file.
    range: Range<usize>,
}

/// A parsed safetensors file.
pub struct TensorFile {
    name: String,
    bytes: Bytes,
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for TensorFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorFile")
            .field("name", &self.name)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl TensorFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<TensorFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: a read-only map of a model file nobody is expected to change while it is
        // loaded (as for GGUF files); all reads are bounds-checked against the header.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        TensorFile::parse(path.display().to_string(), Bytes::Mapped(map))
    }

    /// Parses a safetensors file held in memory; `name` is used in error messages.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<TensorFile> {
        TensorFile::parse(name.to_string(), Bytes::Owned(bytes))
    }

    fn parse(name: String, bytes: Bytes) -> Result<TensorFile> {
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::BadModel {
            reason: format!("{name} is not a valid safetensors file: {e}"),
        })?;
        let base = bytes.as_ptr() as usize;
        let entries = st
            .tensors()
            .into_iter()
            .map(|(tensor, view)| {
                // The crate checked that the data lies inside the buffer.
                let start = view.data().as_ptr() as usize - base;
                let entry = Entry {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    range: start..start + view.data().len(),
                };
                (tensor, entry)
            })
            .collect();
        Ok(TensorFile {
            name,
            bytes,
            entries,
        })
    }

    /// The file's name (its path, for a file on disk).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every tensor's name and shape.
    pub fn tensors(&self) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
        self.entries
            .iter()
            .map(|(name, e)| (name.clone(), e.shape.clone()))
    }

    /// Whether the file has a tensor `tensor`.
    pub fn has(&self, tensor: &str) -> bool {
        self.entries.contains_key(tensor)
    }

    /// The values of tensor `tensor` as f32 (stored as F32, F16 or BF16), after checking that
    /// its shape is `shape`. The mapped pages read leave the resident set again (the values
    /// are copied; reading the tensor again faults them back in).
    pub fn f32(&self, tensor: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let rows = shape.first().copied().unwrap_or(1);
        self.f32_rows(tensor, shape, 0..rows)
    }

    /// [`TensorFile::f32`] of the outermost rows `rows` only (a 1-D tensor's rows are its
    /// values; a 0-D tensor has one), so a large matrix can be converted a slice at a time.
    pub fn f32_rows(&self, tensor: &str, shape: &[usize], rows: Range<usize>) -> Result<Vec<f32>> {
        let bad = |reason: String| Error::BadModel {
            reason: format!("{}: {reason}", self.name),
        };
        let entry = self
            .entries
            .get(tensor)
            .ok_or_else(|| bad(format!("missing tensor {tensor}")))?;
        if entry.shape != shape {
            return Err(bad(format!(
                "tensor {tensor} has shape {:?}, expected {shape:?}",
                entry.shape
            )));
        }
        let n_rows = shape.first().copied().unwrap_or(1).max(1);
        if rows.start > rows.end || rows.end > n_rows {
            return Err(bad(format!("tensor {tensor}: rows {rows:?} of {n_rows}")));
        }
        let row_bytes = entry.range.len() / n_rows;
        let range =
            entry.range.start + rows.start * row_bytes..entry.range.start + rows.end * row_bytes;
        let values = to_f32(entry.dtype, &self.bytes[range.clone()]).ok_or_else(|| {
            bad(format!(
                "tensor {tensor} is {:?}; weights must be F32, F16 or BF16",
                entry.dtype
            ))
        })?;
        self.release(range);
        Ok(values)
    }

    /// Drops the mapped pages of `range` from the resident set (a no-op for bytes in memory).
    fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let (Bytes::Mapped(map), false) = (&self.bytes, range.is_empty()) {
            crate::gguf::release_pages(map, range.start, range.len());
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

/// Little-endian F32, F16 or BF16 bytes as f32 values; `None` for any other type.
pub fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}
