//! The model fingerprint: which exact model a snapshot's keys and values belong to.
//!
//! It is the SHA-256 of the whole GGUF file (header, metadata, tensor table and tensor data),
//! so any change to the weights, the hyper-parameters or the tokenizer changes it. Hashing a
//! few hundred megabytes takes a moment, so the result is cached in a small file next to the
//! model (`<model>.weft-fingerprint`), keyed by the model file's size and modification time,
//! and reused by later processes. A read-only model directory only costs the re-hash.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};
use weft_core::gguf::GgufFile;

/// Bytes hashed between hints to the OS that the mapped pages can leave memory again.
const CHUNK: usize = 16 << 20;

/// The fingerprint of `file`, from the cache next to `path` when it is current.
pub(crate) fn fingerprint(file: &GgufFile, path: Option<&Path>) -> String {
    // Only a model file keys a cache: a converted checkpoint folder is hashed each time.
    let path = path.filter(|p| p.is_file());
    let stamp = path.and_then(stamp);
    if let (Some(path), Some(stamp)) = (path, &stamp) {
        if let Some(cached) = read_cache(&cache_path(path), stamp) {
            return cached;
        }
    }
    let fp = hash(file);
    if let (Some(path), Some(stamp)) = (path, &stamp) {
        // Best effort: a read-only directory just means hashing again next time.
        let _ = std::fs::write(cache_path(path), format!("{stamp} {fp}\n"));
    }
    fp
}

fn hash(file: &GgufFile) -> String {
    let mut h = Sha256::new();
    for chunk in file.as_bytes().chunks(CHUNK) {
        h.update(chunk);
        // The model keeps what it uses repacked in memory; the mapped pages just hashed need
        // not stay resident (they fault back in if read again).
        file.release(chunk);
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

pub(crate) fn cache_path(model: &Path) -> PathBuf {
    let mut name = model.as_os_str().to_owned();
    name.push(".weft-fingerprint");
    PathBuf::from(name)
}

/// The model file's size and modification time, as the cache's key. `v2`: a cache written
/// before the fingerprint was keyed to the file actually mapped may hold the hash of a
/// `--weights f16` widening under the GGUF file's own stamp; it is not read.
fn stamp(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!(
        "v2 size={} mtime={}.{:09}",
        meta.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    ))
}

fn read_cache(cache: &Path, stamp: &str) -> Option<String> {
    let text = std::fs::read_to_string(cache).ok()?;
    let rest = text.trim_end().strip_prefix(stamp)?.strip_prefix(' ')?;
    let hex = rest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_core::gguf::{GgufWriter, Value};

    #[test]
    fn cached_next_to_the_model_and_refreshed_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("weft-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.gguf");
        let write = |arch: &str| {
            let mut w = GgufWriter::new();
            w.metadata("general.architecture", Value::String(arch.into()));
            std::fs::write(&model, w.to_bytes()).unwrap();
            GgufFile::open(&model).unwrap()
        };
        let a = write("llama");
        let fp = fingerprint(&a, Some(&model));
        assert!(fp.starts_with("sha256:") && fp.len() == 71, "{fp}");
        assert!(cache_path(&model).exists());
        assert_eq!(fingerprint(&a, Some(&model)), fp);
        // A poisoned cache entry with a stale stamp is ignored.
        std::fs::write(
            cache_path(&model),
            format!("size=1 mtime=0.0 sha256:{}\n", "0".repeat(64)),
        )
        .unwrap();
        assert_eq!(fingerprint(&a, Some(&model)), fp);
        // So is an entry of the first version's stamp (it may hold a widened file's hash).
        let v1 = stamp(&model).unwrap().replace("v2 ", "");
        std::fs::write(
            cache_path(&model),
            format!("{v1} sha256:{}\n", "0".repeat(64)),
        )
        .unwrap();
        assert_eq!(fingerprint(&a, Some(&model)), fp);
        // Another file (longer name, so another size) gets another fingerprint.
        let b = write("gemma3");
        assert_ne!(fingerprint(&b, Some(&model)), fp);
        assert_eq!(fingerprint(&b, None), hash(&b));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
