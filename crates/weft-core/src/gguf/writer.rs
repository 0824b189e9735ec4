//! A small GGUF writer: builds the tiny synthetic models and the malformed files tests need.

use super::dtype::GgmlType;
use super::reader::{DEFAULT_ALIGNMENT, MAGIC};
use super::value::{type_id, Array, Value};

/// Builds a GGUF file in memory.
///
/// ```
/// use weft_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};
/// let mut w = GgufWriter::new();
/// w.metadata("general.architecture", Value::String("llama".into()));
/// let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// w.tensor("x", GgmlType::F32, &[2], data);
/// let file = GgufFile::from_bytes(w.to_bytes())?;
/// assert_eq!(file.architecture()?, "llama");
/// assert_eq!(file.tensor("x")?.shape, vec![2]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version number written in the header (tests write invalid ones on purpose).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the alignment used to place tensors. Does not add `general.alignment`: add it with
    /// [`metadata`](Self::metadata) when it differs from 32.
    pub fn alignment(&mut self, alignment: u64) -> &mut Self {
        self.alignment = alignment.max(1);
        self
    }

    /// Adds a metadata key-value pair.
    pub fn metadata(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor. `shape` is in ggml order (innermost first); `data` holds its raw bytes.
    pub fn tensor(
        &mut self,
        name: &str,
        dtype: GgmlType,
        shape: &[u64],
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors
            .push((name.to_string(), dtype, shape.to_vec(), data));
        self
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut out, offsets) = self.header();
        let data_start = out.len() as u64;
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Serializes the file, freeing each tensor's bytes once copied: the peak memory is the
    /// file plus one tensor, not twice the file (for a model converted in memory).
    pub fn into_bytes(mut self) -> Vec<u8> {
        let (mut out, offsets) = self.header();
        let data_start = out.len() as u64;
        let end = offsets.last().zip(self.tensors.last());
        out.reserve(end.map_or(0, |(o, t)| {
            (data_start + o) as usize + t.3.len() - out.len()
        }));
        for ((_, _, _, data), off) in self.tensors.drain(..).zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(&data);
        }
        out
    }

    /// The header, metadata and tensor table, padded to the alignment, and each tensor's
    /// offset from the start of the data.
    fn header(&self) -> (Vec<u8>, Vec<u64>) {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dtype, shape, data) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&dtype.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        pad_to(&mut out, self.alignment);
        (out, offsets)
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => type_id::U8,
        Value::I8(_) => type_id::I8,
        Value::U16(_) => type_id::U16,
        Value::I16(_) => type_id::I16,
        Value::U32(_) => type_id::U32,
        Value::I32(_) => type_id::I32,
        Value::U64(_) => type_id::U64,
        Value::I64(_) => type_id::I64,
        Value::F32(_) => type_id::F32,
        Value::F64(_) => type_id::F64,
        Value::Bool(_) => type_id::BOOL,
        Value::String(_) => type_id::STRING,
        Value::Array(_) => type_id::ARRAY,
    }
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(&value_type(v).to_le_bytes());
    write_payload(out, v);
}

fn write_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &Array) {
    fn items<T>(out: &mut Vec<u8>, ty: u32, v: &[T], mut f: impl FnMut(&mut Vec<u8>, &T)) {
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            f(out, x);
        }
    }
    match a {
        Array::U8(v) => items(out, type_id::U8, v, |o, x| o.push(*x)),
        Array::I8(v) => items(out, type_id::I8, v, |o, x| o.push(*x as u8)),
        Array::U16(v) => items(out, type_id::U16, v, |o, x| o.extend(x.to_le_bytes())),
        Array::I16(v) => items(out, type_id::I16, v, |o, x| o.extend(x.to_le_bytes())),
        Array::U32(v) => items(out, type_id::U32, v, |o, x| o.extend(x.to_le_bytes())),
        Array::I32(v) => items(out, type_id::I32, v, |o, x| o.extend(x.to_le_bytes())),
        Array::U64(v) => items(out, type_id::U64, v, |o, x| o.extend(x.to_le_bytes())),
        Array::I64(v) => items(out, type_id::I64, v, |o, x| o.extend(x.to_le_bytes())),
        Array::F32(v) => items(out, type_id::F32, v, |o, x| o.extend(x.to_le_bytes())),
        Array::F64(v) => items(out, type_id::F64, v, |o, x| o.extend(x.to_le_bytes())),
        Array::Bool(v) => items(out, type_id::BOOL, v, |o, x| o.push(u8::from(*x))),
        Array::String(v) => items(out, type_id::STRING, v, |o, s| write_string(o, s)),
        Array::Array(v) => items(out, type_id::ARRAY, v, write_array),
    }
}
