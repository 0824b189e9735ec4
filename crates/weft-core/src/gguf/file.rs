//! An open GGUF file: parsed metadata plus zero-copy views of the tensor data.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::reader::{parse_header, Header, TensorInfo};
use super::value::{Array, Value};
use crate::error::{Error, Result};

/// The bytes behind a [`GgufFile`]: a read-only memory map or a buffer the caller handed over.
enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A validated GGUF file. Tensor data is never copied: [`GgufFile::tensor_data`] returns a
/// slice of the mapped file (or of the owned buffer).
///
/// ```no_run
/// use weft_core::gguf::GgufFile;
/// let file = GgufFile::open("model.gguf")?;
/// println!("{} tensors, architecture {}", file.tensors().len(), file.architecture()?);
/// let embd = file.tensor("token_embd.weight")?;
/// println!("{} {:?}: {} bytes", embd.dtype, embd.shape, file.tensor_data(embd).len());
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct GgufFile {
    storage: Storage,
    header: Header,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps the file at `path`, then parses and validates its header.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. weft never writes to model files; as with every
        // mmap-based loader (llama.cpp included), another process truncating the file while it
        // is mapped is outside what we can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mmap(map))
    }

    /// Parses a GGUF file held in memory (for example embedded in a binary or received over a
    /// socket). The buffer is kept, not copied.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        let header = parse_header(storage.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            header,
            key_index,
            tensor_index,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Alignment of the tensor data, from `general.alignment` (default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute file offset where the tensor data starts.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The metadata value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.header.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(key: &str, expected: &'static str, found: &Value) -> Error {
        Error::WrongValueType {
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    /// The unsigned integer under `key` (any integer width).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong(key, "an unsigned integer", v))
    }

    /// The number under `key` (any float or integer type).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| Self::wrong(key, "a number", v))
    }

    /// The bool under `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong(key, "a bool", v))
    }

    /// The string under `key`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "a string", v))
    }

    /// The array under `key`.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "an array", v))
    }

    /// Like [`get_u64`](Self::get_u64), but `None` when the key is absent.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    /// Like [`get_f64`](Self::get_f64), but `None` when the key is absent.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|_| self.get_f64(key)).transpose()
    }

    /// Like [`get_bool`](Self::get_bool), but `None` when the key is absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    /// Like [`get_str`](Self::get_str), but `None` when the key is absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    /// `general.architecture`, e.g. `"llama"` or `"gemma3"`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// The info of tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_string(),
            })
    }

    /// The raw bytes of a tensor, straight from the mapped file.
    ///
    /// `info` must come from this file's [`tensors`](Self::tensors) or [`tensor`](Self::tensor):
    /// its extent was checked against the file when the header was parsed.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        // For infos of this file the range was checked at parse time; anything else gets an
        // empty slice rather than a panic.
        let start = self.header.data_offset.saturating_add(info.offset);
        let end = start.saturating_add(info.n_bytes);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.storage.bytes().get(s..e))
            .unwrap_or(&[])
    }

    /// Hints that `bytes` (a slice of this file, e.g. a tensor copied elsewhere at load time)
    /// will not be read again soon: their pages leave the process's resident set. Reading them
    /// later is still correct (they fault back in from the file). A no-op for files read into
    /// memory or slices of something else.
    pub fn release(&self, bytes: &[u8]) {
        #[cfg(unix)]
        if let Storage::Mmap(map) = &self.storage {
            let base = map.as_ptr() as usize;
            let start = bytes.as_ptr() as usize;
            if start < base || start + bytes.len() > base + map.len() || bytes.is_empty() {
                return;
            }
            release_pages(map, start - base, bytes.len());
        }
        #[cfg(not(unix))]
        let _ = bytes;
    }

    /// The whole file's bytes (header and tensor data), e.g. to hash it.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Total size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }
}

/// Drops the pages of `map[offset..offset + len]` from the process's resident set: the one
/// place model readers (GGUF files, safetensors files) give back pages they copied from.
#[cfg(unix)]
pub(crate) fn release_pages(map: &memmap2::Mmap, offset: usize, len: usize) {
    // SAFETY: the mapping is read-only (shared, never written), so MADV_DONTNEED only unmaps
    // clean file pages from this process; a later access maps them in again from the page
    // cache with the same contents (the assumption `Mmap::map` already makes: nobody rewrites
    // the file). No reference into the range is invalidated.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
}
