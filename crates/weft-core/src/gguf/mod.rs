//! GGUF, the model file format of llama.cpp: reader, value types and a small writer.
//!
//! Layout of a file (all little-endian): magic `GGUF`, version (u32), tensor count (u64),
//! metadata count (u64), the metadata key-value pairs, the tensor infos, padding to the
//! alignment, then the tensor data section.

mod dtype;
mod file;
mod reader;
mod value;
mod writer;

pub use dtype::{GgmlType, QK_K};
#[cfg(unix)]
pub(crate) use file::release_pages;
pub use file::GgufFile;
pub use reader::{TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use value::{Array, Value};
pub use writer::GgufWriter;
