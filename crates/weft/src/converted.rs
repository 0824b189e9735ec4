//! Hugging Face checkpoint folders, converted once: the GGUF that
//! [`checkpoint::convert`] makes is written into the cache (`converted/` under the hub's
//! home, beside the fetched models) and mapped from there on, as any GGUF file is. Later loads
//! skip the conversion (seconds for a large vocabulary), and the model's memory is a GGUF
//! file's: a conversion held in memory would keep its bytes beside the repacked copies the
//! kernels read.
//!
//! A cached file is named after the folder and keyed by the folder's path, the weight type, the
//! conversion's version and every file of the folder (name, size, modification time): a change
//! to any makes a new conversion, which replaces the folder's older one. Where the cache cannot
//! be written, the conversion is used from memory.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};
use weft_core::checkpoint::{self, WeightType};
use weft_core::gguf::GgufFile;

use crate::error::Result;
use crate::Hub;

/// The model at `path` as a GGUF file, and the file it is mapped from (`None` when held in
/// memory): the GGUF file itself, or the cached conversion of the decoder checkpoint folder
/// `path` names, its matrices in `weights`. A cache that cannot be written leaves the conversion
/// in memory, with a warning on standard error (each load converts again).
pub fn open_model(path: &Path, weights: WeightType) -> Result<(GgufFile, Option<PathBuf>)> {
    let Some(dir) = checkpoint::folder_of(path).filter(|d| !checkpoint::is_encoder(d)) else {
        return Ok((GgufFile::open(path)?, Some(path.to_path_buf())));
    };
    let cached = Hub::from_env()
        .ok()
        .and_then(|hub| cache_path(&hub.home().join("converted"), &dir, weights));
    if let Some(file) = cached.as_deref().filter(|f| f.is_file()) {
        if let Ok(gguf) = GgufFile::open(file) {
            return Ok((gguf, Some(file.to_path_buf())));
        }
    }
    let bytes = checkpoint::convert(&dir, weights)?;
    if let Some(file) = cached {
        match store(&file, &bytes) {
            Ok(()) => {
                drop(bytes);
                return Ok((GgufFile::open(&file)?, Some(file)));
            }
            Err(e) => eprintln!(
                "weft: cannot keep the conversion of {} in {} ({e}); it is used from memory and made again on the next load",
                dir.display(),
                file.display()
            ),
        }
    }
    Ok((GgufFile::from_bytes(bytes)?, None))
}

/// `<cache>/<folder name>-<path hash>-<weights>-<contents hash>.gguf`, or `None` when the
/// folder cannot be listed.
fn cache_path(cache: &Path, dir: &Path, weights: WeightType) -> Option<PathBuf> {
    let dir = dir.canonicalize().ok()?;
    let mut files: Vec<(String, u64, u128)> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            // The file a link points to: its size and time are what change.
            let meta = std::fs::metadata(e.path()).ok().filter(|m| m.is_file())?;
            let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                mtime.as_nanos(),
            ))
        })
        .collect();
    files.sort();
    let mut contents = Sha256::new();
    contents.update(format!("conversion {}\n", checkpoint::VERSION));
    for (name, len, mtime) in &files {
        contents.update(format!("{name} {len} {mtime}\n"));
    }
    let hex = |d: &[u8]| {
        d.iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let name = dir.file_name()?.to_string_lossy();
    let prefix = format!(
        "{name}-{}-{weights}-",
        hex(&Sha256::digest(dir.as_os_str().as_encoded_bytes()))
    );
    Some(cache.join(format!("{prefix}{}.gguf", hex(&contents.finalize()))))
}

/// Writes `bytes` to `file` (through a temporary name, so a reader never sees half a file) and
/// removes the folder's older conversions to the same weight type.
fn store(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)?;
    // The prefix is everything but the contents hash and the extension.
    let prefix = name.rsplit_once('-').map(|(p, _)| format!("{p}-"));
    if let (Some(prefix), Ok(entries)) = (prefix, std::fs::read_dir(dir)) {
        for e in entries.flatten() {
            let other = e.file_name().to_string_lossy().into_owned();
            if other.starts_with(&prefix) && other.ends_with(".gguf") && other != name {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}
