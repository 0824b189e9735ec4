//! Parsing a GGUF header: magic, version, metadata, tensor infos.
//!
//! The parser reads from one byte slice and checks every count and length against the bytes
//! that are left before it allocates or slices anything, so a corrupt or hostile file ends in an
//! [`Error`] and never in a panic, an out-of-bounds read or a huge allocation.

use std::collections::HashSet;

use super::dtype::GgmlType;
use super::value::{type_id, Array, Value};
use crate::error::{Error, Result};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted; real files nest at most once.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub dtype: GgmlType,
    /// Shape in ggml order: `shape[0]` is the innermost (contiguous) dimension.
    pub shape: Vec<u64>,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Size of the tensor's data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Everything in a GGUF file before its tensor data.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast is lossless.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &'static str) -> Result<usize> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|bytes| bytes <= self.remaining());
        if !fits {
            return Err(Error::ImplausibleCount {
                what,
                count,
                offset: self.pos as u64,
            });
        }
        // count * min_size <= remaining, and min_size >= 1, so count fits in usize.
        Ok(count as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Error::InvalidUtf8 {
            what,
            offset: start,
        })
    }

    /// Reads `n` fixed-size elements with `f` decoding each one's little-endian bytes.
    fn vec<T, const N: usize>(
        &mut self,
        n: u64,
        what: &'static str,
        f: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        let n = self.check_count(n, N as u64, what)?;
        let bytes = self.take((n * N) as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    fn value(&mut self, key: &str, ty: u32) -> Result<Value> {
        const W: &str = "metadata value";
        Ok(match ty {
            type_id::U8 => Value::U8(self.array::<1>(W)?[0]),
            type_id::I8 => Value::I8(self.array::<1>(W)?[0] as i8),
            type_id::U16 => Value::U16(u16::from_le_bytes(self.array(W)?)),
            type_id::I16 => Value::I16(i16::from_le_bytes(self.array(W)?)),
            type_id::U32 => Value::U32(u32::from_le_bytes(self.array(W)?)),
            type_id::I32 => Value::I32(i32::from_le_bytes(self.array(W)?)),
            type_id::U64 => Value::U64(u64::from_le_bytes(self.array(W)?)),
            type_id::I64 => Value::I64(i64::from_le_bytes(self.array(W)?)),
            type_id::F32 => Value::F32(f32::from_le_bytes(self.array(W)?)),
            type_id::F64 => Value::F64(f64::from_le_bytes(self.array(W)?)),
            type_id::BOOL => Value::Bool(self.bool()?),
            type_id::STRING => Value::String(self.string("metadata string")?),
            type_id::ARRAY => Value::Array(self.array_value(key, 1)?),
            type_id => {
                return Err(Error::UnknownValueType {
                    key: key.to_string(),
                    type_id,
                })
            }
        })
    }

    fn bool(&mut self) -> Result<bool> {
        let offset = self.pos as u64;
        match self.array::<1>("metadata bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Error::ImplausibleCount {
                what: "bool byte (must be 0 or 1)",
                count: 2,
                offset,
            }),
        }
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(Error::NestingTooDeep {
                key: key.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.u32("array element type")?;
        let n = self.u64("array length")?;
        const W: &str = "array";
        Ok(match elem {
            type_id::U8 => Array::U8(self.vec(n, W, |[b]: [u8; 1]| b)?),
            type_id::I8 => Array::I8(self.vec(n, W, |[b]: [u8; 1]| b as i8)?),
            type_id::U16 => Array::U16(self.vec(n, W, u16::from_le_bytes)?),
            type_id::I16 => Array::I16(self.vec(n, W, i16::from_le_bytes)?),
            type_id::U32 => Array::U32(self.vec(n, W, u32::from_le_bytes)?),
            type_id::I32 => Array::I32(self.vec(n, W, i32::from_le_bytes)?),
            type_id::U64 => Array::U64(self.vec(n, W, u64::from_le_bytes)?),
            type_id::I64 => Array::I64(self.vec(n, W, i64::from_le_bytes)?),
            type_id::F32 => Array::F32(self.vec(n, W, f32::from_le_bytes)?),
            type_id::F64 => Array::F64(self.vec(n, W, f64::from_le_bytes)?),
            type_id::BOOL => {
                let n = self.check_count(n, 1, "bool array")?;
                Array::Bool((0..n).map(|_| self.bool()).collect::<Result<_>>()?)
            }
            type_id::STRING => {
                // Each string takes at least its 8-byte length.
                let n = self.check_count(n, 8, "string array")?;
                let strings = (0..n)
                    .map(|_| self.string("string in array"))
                    .collect::<Result<_>>()?;
                Array::String(strings)
            }
            type_id::ARRAY => {
                // Each nested array takes at least its type and length (12 bytes).
                let n = self.check_count(n, 12, "nested array")?;
                let arrays = (0..n)
                    .map(|_| self.array_value(key, depth + 1))
                    .collect::<Result<_>>()?;
                Array::Array(arrays)
            }
            type_id => {
                return Err(Error::UnknownValueType {
                    key: key.to_string(),
                    type_id,
                })
            }
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims as usize > MAX_DIMS {
            return Err(Error::ImplausibleCount {
                what: "tensor dimensions",
                count: n_dims.into(),
                offset: self.pos as u64,
            });
        }
        let shape = (0..n_dims)
            .map(|_| self.u64("tensor dimension"))
            .collect::<Result<Vec<u64>>>()?;
        let type_id = self.u32("tensor type")?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| Error::UnknownTensorType {
            name: name.clone(),
            type_id,
        })?;
        let offset = self.u64("tensor offset")?;
        let bad_shape = |reason| Error::BadShape {
            name: name.clone(),
            shape: shape.clone(),
            dtype,
            reason,
        };
        // ggml stores dimensions as int64: the element count must fit in one.
        let n_elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad_shape("element count overflows"))?;
        let row = shape.first().copied().unwrap_or(1);
        if row % dtype.block_size() as u64 != 0 {
            return Err(bad_shape("rows are not a whole number of blocks"));
        }
        let n_bytes = dtype
            .row_bytes(n_elements)
            .ok_or_else(|| bad_shape("byte size overflows"))?;
        Ok(TensorInfo {
            name,
            dtype,
            shape,
            offset,
            n_bytes,
        })
    }
}

/// Parses and validates the header of a GGUF file held in `bytes` (the whole file).
/// Most metadata entries or tensor infos reserved for before any is read (a large model has a
/// few thousand tensors).
const RESERVE_MAX: usize = 4096;

pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header> {
    let mut cur = Cursor { bytes, pos: 0 };
    let magic: [u8; 4] = cur.array("magic")?;
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = cur.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(Error::UnsupportedVersion { version });
    }
    let n_tensors = cur.u64("tensor count")?;
    let n_kv = cur.u64("metadata count")?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
    let n_kv = cur.check_count(n_kv, 13, "metadata entries")?;

    // The count is only plausible so far (each entry could fit in the file): reserve for a
    // real file's worth and let a larger one grow as its entries parse, so a crafted count
    // cannot ask for several times the file's size before the first entry is read.
    let mut metadata = Vec::with_capacity(n_kv.min(RESERVE_MAX));
    let mut keys = HashSet::with_capacity(n_kv.min(RESERVE_MAX));
    for _ in 0..n_kv {
        let key = cur.string("metadata key")?;
        let ty = cur.u32("metadata value type")?;
        let value = cur.value(&key, ty)?;
        if !keys.insert(key.clone()) {
            return Err(Error::Duplicate {
                what: "metadata key",
                name: key,
            });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(Error::BadAlignment {
                what: format!("general.alignment is {v} ({})", v.type_name()),
                alignment: 0,
            })
        }
    };

    // A tensor info takes at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset) bytes.
    let n_tensors = cur.check_count(n_tensors, 24, "tensor infos")?;
    let mut tensors = Vec::with_capacity(n_tensors.min(RESERVE_MAX));
    let mut names = HashSet::with_capacity(n_tensors.min(RESERVE_MAX));
    for _ in 0..n_tensors {
        let info = cur.tensor_info()?;
        if !names.insert(info.name.clone()) {
            return Err(Error::Duplicate {
                what: "tensor",
                name: info.name,
            });
        }
        tensors.push(info);
    }

    let header_end = cur.pos as u64;
    // header_end <= file length, far from u64::MAX: the round-up cannot overflow.
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(Error::BadAlignment {
                what: format!("tensor {:?} starts at data offset {}", t.name, t.offset),
                alignment,
            });
        }
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(Error::TensorOutOfBounds {
                name: t.name.clone(),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                data_len,
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
