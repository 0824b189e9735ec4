//! Hugging Face checkpoint folders, converted once (and GGUF files asked for in F16 / F32,
//! widened once by [`checkpoint::widen`]): the GGUF that
//! [`checkpoint::convert`] makes is written into the cache (`converted/` under the hub's
//! home, beside the fetched models) and mapped from there on, as any GGUF file is. Later loads
//! skip the conversion (seconds for a large vocabulary), and the model's memory is a GGUF
//! file's: a conversion held in memory would keep its bytes beside the repacked copies the
//! kernels read.
//!
//! A cached file is named after the folder and keyed by the folder's path, the weight type, the
//! conversion's version and every file of the folder (name, size, modification time): a change
//! to any makes a new conversion, which replaces the folder's older one. Where the cache cannot
//! be written, the conversion is used from memory. Beside each conversion a `.source` file
//! names its source, so that [`prune_conversions`] can tell the conversions no load will use
//! again (their source moved, changed or gone) from the current ones.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};
use weft_core::checkpoint::{self, WeightType};
use weft_core::gguf::GgufFile;

use crate::error::Result;
use crate::Hub;

/// The model at `path` as a GGUF file, and the file it is mapped from (`None` when held in
/// memory): the GGUF file itself, or the cached conversion of the decoder checkpoint folder
/// `path` names, its matrices in `weights`. A GGUF file asked for in F16 or F32 has its
/// quantized matrices widened (cached the same way); Q8_0, the default, keeps a GGUF file's
/// own types. A cache that cannot be written leaves the conversion in memory, with a warning
/// on standard error (each load converts again).
pub fn open_model(path: &Path, weights: WeightType) -> Result<(GgufFile, Option<PathBuf>)> {
    let folder = checkpoint::folder_of(path).filter(|d| !checkpoint::is_encoder(d));
    if folder.is_none() && weights == WeightType::Q8_0 {
        return Ok((GgufFile::open(path)?, Some(path.to_path_buf())));
    }
    let source = folder.as_deref().unwrap_or(path);
    let cached = Hub::from_env()
        .ok()
        .and_then(|hub| cache_path(&hub.home().join("converted"), source, weights));
    if let Some(file) = cached.as_deref().filter(|f| f.is_file()) {
        if let Ok(gguf) = GgufFile::open(file) {
            return Ok((gguf, Some(file.to_path_buf())));
        }
    }
    let bytes = match &folder {
        Some(dir) => checkpoint::convert(dir, weights)?,
        // A GGUF file asked for in F16 / F32: its quantized matrices widened.
        None => {
            let file = GgufFile::open(path)?;
            checkpoint::widen(&file, weights)?.unwrap_or_default()
        }
    };
    if let Some(file) = cached {
        match store(&file, &bytes, source) {
            Ok(()) => {
                drop(bytes);
                return Ok((GgufFile::open(&file)?, Some(file)));
            }
            Err(e) => eprintln!(
                "weft: cannot keep the conversion of {} in {} ({e}); it is used from memory and made again on the next load",
                source.display(),
                file.display()
            ),
        }
    }
    Ok((GgufFile::from_bytes(bytes)?, None))
}

/// `<cache>/<name>-<path hash>-<weights>-<contents hash>.gguf` for the folder or GGUF file
/// `source`, or `None` when it cannot be listed.
fn cache_path(cache: &Path, source: &Path, weights: WeightType) -> Option<PathBuf> {
    let dir = source.canonicalize().ok()?;
    let entries: Vec<PathBuf> = if dir.is_dir() {
        let listed = std::fs::read_dir(&dir).ok()?;
        listed.filter_map(|e| Some(e.ok()?.path())).collect()
    } else {
        vec![dir.clone()]
    };
    let mut files: Vec<(String, u64, u128)> = entries
        .into_iter()
        .filter_map(|path| {
            // The file a link points to: its size and time are what change.
            let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
            let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
            Some((
                path.file_name()?.to_string_lossy().into_owned(),
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
    let name = match dir.is_dir() {
        true => dir.file_name()?.to_string_lossy(),
        false => dir.file_stem()?.to_string_lossy(),
    };
    let prefix = format!(
        "{name}-{}-{weights}-",
        hex(&Sha256::digest(dir.as_os_str().as_encoded_bytes()))
    );
    Some(cache.join(format!("{prefix}{}.gguf", hex(&contents.finalize()))))
}

/// Writes `bytes` to `file` (through a temporary name, so a reader never sees half a file)
/// with the sidecar naming `source`, and removes the folder's older conversions to the same
/// weight type.
fn store(file: &Path, bytes: &[u8], source: &Path) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)?;
    if let Ok(source) = source.canonicalize() {
        let _ = std::fs::write(sidecar(file), source.as_os_str().as_encoded_bytes());
    }
    // The prefix is everything but the contents hash and the extension.
    let prefix = name.rsplit_once('-').map(|(p, _)| format!("{p}-"));
    if let (Some(prefix), Ok(entries)) = (prefix, std::fs::read_dir(dir)) {
        for e in entries.flatten() {
            let other = e.file_name().to_string_lossy().into_owned();
            if other.starts_with(&prefix) && other.ends_with(".gguf") && other != name {
                let _ = std::fs::remove_file(e.path());
                remove_sidecars(&e.path());
            }
        }
    }
    Ok(())
}

/// Removes the files beside a removed conversion: the one naming its source, and the cached
/// fingerprint sessions saved on it made.
fn remove_sidecars(file: &Path) {
    let _ = std::fs::remove_file(sidecar(file));
    let _ = std::fs::remove_file(crate::session::fingerprint::cache_path(file));
}

/// The file beside conversion `file` that names its source.
fn sidecar(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".source");
    PathBuf::from(name)
}

/// One conversion in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversion {
    /// The converted GGUF file.
    pub file: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// The checkpoint folder or GGUF file it was made from (`None`: not recorded, as by
    /// versions of weft before the record).
    pub source: Option<PathBuf>,
    /// Whether loading `source` now would use this file: the source is where it was, with
    /// the same files.
    pub current: bool,
}

/// The conversions in the cache under `home` (the hub's home: `converted/` in it), by name.
pub fn conversions(home: &Path) -> Vec<Conversion> {
    let cache = home.join("converted");
    let Ok(entries) = std::fs::read_dir(&cache) else {
        return Vec::new();
    };
    let mut out: Vec<Conversion> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .filter_map(|file| {
            let bytes = std::fs::metadata(&file).ok()?.len();
            let source = std::fs::read(sidecar(&file))
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .map(PathBuf::from);
            // The weight type is the name's second field from the end.
            let name = file.file_stem()?.to_string_lossy().into_owned();
            let weights = name.rsplit('-').nth(1).and_then(|w| w.parse().ok());
            let current = match (&source, weights) {
                (Some(src), Some(w)) => cache_path(&cache, src, w).is_some_and(|p| p == file),
                _ => false,
            };
            Some(Conversion {
                file,
                bytes,
                source,
                current,
            })
        })
        .collect();
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

/// Removes the conversions under `home` that no load will use again (see
/// [`Conversion::current`]) and temporary files left by interrupted ones; returns what was
/// removed. A removed conversion costs only a new conversion should its source come back.
/// An error names the file that could not be removed.
pub fn prune_conversions(home: &Path) -> std::io::Result<Vec<Conversion>> {
    let remove = |f: &Path| {
        std::fs::remove_file(f).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot remove {}: {e}", f.display()))
        })
    };
    let mut removed = Vec::new();
    for c in conversions(home).into_iter().filter(|c| !c.current) {
        remove(&c.file)?;
        remove_sidecars(&c.file);
        removed.push(c);
    }
    // Temporary files of conversions whose writer is gone.
    if let Ok(entries) = std::fs::read_dir(home.join("converted")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_suffix(".tmp")
                .and_then(|n| n.rsplit('.').next())
                .and_then(|p| p.parse::<u32>().ok());
            // Where there is no /proc to ask, every writer counts as alive: a temporary file
            // a running conversion is writing is never taken from under it.
            let alive = pid.is_some_and(|p| {
                !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{p}")).exists()
            });
            if name.starts_with('.') && pid.is_some() && !alive {
                let bytes = e.metadata().map_or(0, |m| m.len());
                remove(&e.path())?;
                removed.push(Conversion {
                    file: e.path(),
                    bytes,
                    source: None,
                    current: false,
                });
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_current_conversions_only() {
        let home = std::env::temp_dir().join(format!("weft-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let cache = home.join("converted");
        std::fs::create_dir_all(&cache).expect("cache");
        let source = |name: &str, text: &str| {
            let p = home.join(name);
            std::fs::write(&p, text).expect("source");
            p
        };
        let (kept, changed, gone) = (
            source("a.gguf", "a"),
            source("b.gguf", "b"),
            source("c.gguf", "c"),
        );
        let mut files = Vec::new();
        let fingerprint = crate::session::fingerprint::cache_path;
        for src in [&kept, &changed, &gone] {
            let file = cache_path(&cache, src, WeightType::F32).expect("path");
            store(&file, b"converted", src).expect("store");
            // As a session saved on the conversion leaves it.
            std::fs::write(fingerprint(&file), "v2 size=9 mtime=0.0 sha256:0").expect("fp");
            files.push(file);
        }
        // Made by an older weft: no record of its source.
        let unrecorded = cache.join("old-0123456789abcdef-f16-0123456789abcdef.gguf");
        std::fs::write(&unrecorded, b"old").expect("old");
        std::fs::write(&changed, "b, edited").expect("edit");
        std::fs::remove_file(&gone).expect("remove");
        let listed = conversions(&home);
        assert_eq!(listed.len(), 4);
        assert_eq!(listed.iter().filter(|c| c.current).count(), 1);
        let removed = prune_conversions(&home).expect("prune");
        let mut removed: Vec<PathBuf> = removed.into_iter().map(|c| c.file).collect();
        removed.sort();
        let mut want = vec![files[1].clone(), files[2].clone(), unrecorded];
        want.sort();
        assert_eq!(removed, want);
        assert!(files[0].is_file() && sidecar(&files[0]).is_file());
        assert!(fingerprint(&files[0]).is_file());
        assert!(!sidecar(&files[1]).exists() && !fingerprint(&files[1]).exists());
        assert!(!fingerprint(&files[2]).exists());
        assert_eq!(conversions(&home).len(), 1);
        let _ = std::fs::remove_dir_all(&home);
    }
}
