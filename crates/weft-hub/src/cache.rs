//! The on-disk side of fetching: partial files that are hashed while written and
//! renamed into place only once verified, `.verified` markers, unique temp names.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::error::HubError;
use crate::progress::{Progress, Step};
use crate::registry::ModelSpec;

const CHUNK: usize = 1 << 20;

/// Partial files and temp dirs older than this are leftovers of a killed process.
const STALE_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// ... and so are those this old whose process is gone. Not at once: a process of another PID
/// namespace (a container sharing the cache) may still be writing one.
const DEAD_AFTER: Duration = Duration::from_secs(10 * 60);

/// A name suffix unique across processes and within this one.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:08x}-{n}", std::process::id())
}

/// The path of the `.verified` marker next to a model file.
pub(crate) fn marker_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    file.with_file_name(name)
}

/// What a marker records: the registry's sha and size, and the file's modification time when
/// it was hashed, so that a file changed in place afterwards (a copy over it, an editor, a
/// stray write) no longer matches and is hashed again (`meta`: the file's). `None` where the
/// platform keeps no modification time.
fn marker_contents(meta: &fs::Metadata, spec: &ModelSpec) -> Option<String> {
    let modified = meta.modified().ok()?;
    let since = modified.duration_since(UNIX_EPOCH).unwrap_or_default();
    Some(format!(
        "sha256 {}\nsize {}\nmodified {}.{:09}\n",
        spec.sha256,
        spec.size,
        since.as_secs(),
        since.subsec_nanos()
    ))
}

/// Whether `file` is there with `spec`'s size and a marker for its sha and its present
/// modification time.
pub(crate) fn is_verified(file: &Path, spec: &ModelSpec) -> bool {
    fs::metadata(file)
        .is_ok_and(|m| m.is_file() && m.len() == spec.size && marker_matches(file, &m, spec))
}

/// Whether `file`'s marker records exactly `spec`'s sha and size and the modification time
/// in `meta` (the file's metadata, read once by the caller).
pub(crate) fn marker_matches(file: &Path, meta: &fs::Metadata, spec: &ModelSpec) -> bool {
    let Some(expected) = marker_contents(meta, spec) else {
        return false;
    };
    fs::read_to_string(marker_path(file)).is_ok_and(|s| s == expected)
}

/// Writes `file`'s marker atomically (temp file + rename).
pub(crate) fn write_marker(file: &Path, spec: &ModelSpec) -> Result<(), HubError> {
    let meta = fs::metadata(file).map_err(|e| HubError::io("inspect", file, e))?;
    let contents = marker_contents(&meta, spec)
        .ok_or_else(|| HubError::io("inspect", file, io::ErrorKind::Unsupported.into()))?;
    let marker = marker_path(file);
    let mut tmp_name = marker.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", unique_suffix()));
    let tmp = marker.with_file_name(tmp_name);
    fs::write(&tmp, contents).map_err(|e| HubError::io("write", &tmp, e))?;
    fs::rename(&tmp, &marker).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        HubError::io("rename into place", &marker, e)
    })
}

/// Removes a model file and its marker, ignoring files that are already gone.
pub(crate) fn remove_model(file: &Path) -> Result<(), HubError> {
    for path in [marker_path(file), file.to_path_buf()] {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(HubError::io("remove", path, e)),
        }
    }
    Ok(())
}

/// Lowercase hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes an existing file with sha256, reporting progress. Returns (hex, size).
pub(crate) fn hash_file(
    path: &Path,
    progress: &mut dyn Progress,
) -> Result<(String, u64), HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io("open", path, e))?;
    let total = file.metadata().map(|m| m.len()).ok();
    let label = format!("verifying {}", path.display());
    let mut step = Step::begin(progress, &label, total);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HubError::io("read", path, e)),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
        step.advance(n as u64);
    }
    Ok((hex(&hasher.finalize()), size))
}

/// Deletes the `<prefix><pid>-...` entries of `dir` left by killed runs: those untouched for ten
/// minutes whose process is gone (where `/proc` tells), and any untouched for a day.
pub(crate) fn sweep_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_string_lossy()
            .strip_prefix(prefix)
            .map(str::to_owned)
        else {
            continue;
        };
        let dead = rest
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(process_is_gone);
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default();
        let old = age > STALE_AFTER || (dead && age > DEAD_AFTER);
        if old {
            let path = entry.path();
            tracing::info!("removing stale leftover {}", path.display());
            let _ = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
        }
    }
}

/// Whether process `pid` has exited, as far as this machine can tell: only where `/proc`
/// lists processes (Linux); elsewhere the age rule of [`sweep_stale`] alone applies.
fn process_is_gone(pid: u32) -> bool {
    pid != std::process::id()
        && Path::new("/proc/self").exists()
        && !Path::new("/proc").join(pid.to_string()).exists()
}

/// A model file being written: `<models>/<file>.partial-<unique>`, hashed as written.
///
/// Dropping it without [`commit`](PartialFile::commit) deletes it, so a failed or
/// interrupted fetch never leaves a half-written model where it could be used.
pub(crate) struct PartialFile {
    path: PathBuf,
    file: Option<BufWriter<File>>,
    hasher: Sha256,
    written: u64,
}

impl PartialFile {
    /// The prefix of partial files for `file_name` (its last path component), used to sweep
    /// stale ones in its directory.
    pub(crate) fn prefix(file_name: &str) -> String {
        let base = file_name.rsplit('/').next().unwrap_or(file_name);
        format!("{base}.partial-")
    }

    /// Creates a fresh partial file for `file_name` (a path relative to `models_dir`, whose
    /// directories are created) in the directory it will be renamed into.
    pub(crate) fn create(models_dir: &Path, file_name: &str) -> Result<Self, HubError> {
        let target = models_dir.join(file_name);
        let dir = target.parent().unwrap_or(models_dir);
        fs::create_dir_all(dir).map_err(|e| HubError::io("create directory", dir, e))?;
        let path = dir.join(format!("{}{}", Self::prefix(file_name), unique_suffix()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| HubError::io("create", &path, e))?;
        Ok(PartialFile {
            path,
            file: Some(BufWriter::with_capacity(CHUNK, file)),
            hasher: Sha256::new(),
            written: 0,
        })
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Appends bytes, hashing them.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), HubError> {
        let Some(file) = self.file.as_mut() else {
            return Err(HubError::io(
                "write",
                &self.path,
                io::ErrorKind::Other.into(),
            ));
        };
        file.write_all(bytes)
            .map_err(|e| HubError::io("write", &self.path, e))?;
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Streams all of `reader` into the file, reporting each chunk to `step`.
    /// `what` names the reader's origin in read errors.
    pub(crate) fn copy_from(
        &mut self,
        reader: &mut dyn Read,
        what: &Path,
        step: &mut Step<'_>,
    ) -> Result<u64, HubError> {
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(HubError::io("read", what, e)),
            };
            self.write(&buf[..n])?;
            total += n as u64;
            step.advance(n as u64);
        }
    }

    /// Checks size and sha256 against `spec`; on success renames the file to
    /// `<models>/<spec.file_name>` (atomically replacing any previous one) and writes
    /// its marker. On failure the partial file is deleted.
    pub(crate) fn commit(mut self, spec: &ModelSpec) -> Result<PathBuf, HubError> {
        let file = self.file.take();
        if let Some(mut file) = file {
            file.flush()
                .map_err(|e| HubError::io("write", &self.path, e))?;
            let file = file
                .into_inner()
                .map_err(|e| HubError::io("write", &self.path, e.into_error()))?;
            file.sync_all()
                .map_err(|e| HubError::io("sync", &self.path, e))?;
        }
        let actual = hex(&self.hasher.finalize_reset());
        if self.written != spec.size {
            return Err(HubError::SizeMismatch {
                expected: spec.size,
                actual: self.written,
            });
        }
        if !actual.eq_ignore_ascii_case(spec.sha256) {
            return Err(HubError::ChecksumMismatch {
                expected: spec.sha256.to_string(),
                actual,
            });
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let base = spec.file_name.rsplit('/').next().unwrap_or(spec.file_name);
        let target = dir.join(base);
        if let Err(e) = fs::rename(&self.path, &target) {
            // Another process may have put the same verified file in place meanwhile.
            if !is_verified(&target, spec) {
                return Err(HubError::io("rename into place", &target, e));
            }
            return Ok(target);
        }
        // The file is whole and checked: a marker that cannot be written (a full disk) only
        // means the next use hashes it again, not that it is fetched again.
        if let Err(e) = write_marker(&target, spec) {
            tracing::warn!(
                "{e}: {} will be checked again on its next use",
                target.display()
            );
        }
        Ok(target)
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        // Close first (Windows cannot delete open files); after a successful
        // commit the path no longer exists and removal is a harmless no-op.
        drop(self.file.take());
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;

    pub(crate) fn spec_for(data: &[u8], file_name: &'static str) -> ModelSpec {
        let sha: &'static str = Box::leak(hex(&Sha256::digest(data)).into_boxed_str());
        ModelSpec {
            name: "test-model",
            aliases: &[],
            description: "test",
            file_name,
            size: data.len() as u64,
            sha256: sha,
            pypi: None,
            hf: None,
            companions: &[],
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_renames_and_marks() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec_for(b"hello world", "m.gguf");
        let mut p = PartialFile::create(dir.path(), spec.file_name).unwrap();
        p.write(b"hello ").unwrap();
        p.write(b"world").unwrap();
        let path = p.commit(&spec).unwrap();
        assert_eq!(path, dir.path().join("m.gguf"));
        assert_eq!(fs::read(&path).unwrap(), b"hello world");
        assert!(is_verified(&path, &spec));
        assert_eq!(entries(dir.path()), ["m.gguf", "m.gguf.verified"]);
        let (sha, size) = hash_file(&path, &mut NoProgress).unwrap();
        assert_eq!((sha.as_str(), size), (spec.sha256, 11));
    }

    #[test]
    fn a_marker_that_cannot_be_written_keeps_the_download() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec_for(b"hello world", "m.gguf");
        // A folder where the marker goes: renaming the marker into place fails.
        fs::create_dir(dir.path().join("m.gguf.verified")).unwrap();
        let mut p = PartialFile::create(dir.path(), spec.file_name).unwrap();
        p.write(b"hello world").unwrap();
        let path = p.commit(&spec).expect("a checked download is kept");
        assert_eq!(fs::read(&path).unwrap(), b"hello world");
        assert!(!is_verified(&path, &spec));
        assert_eq!(entries(dir.path()), ["m.gguf", "m.gguf.verified"]);
    }

    #[test]
    fn mismatch_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec_for(b"hello world", "m.gguf");
        let mut p = PartialFile::create(dir.path(), spec.file_name).unwrap();
        p.write(b"hello WORLD").unwrap();
        match p.commit(&spec) {
            Err(HubError::ChecksumMismatch { expected, actual }) => {
                assert_eq!(expected, spec.sha256);
                assert_ne!(actual, expected);
            }
            other => panic!("expected checksum mismatch, got {other:?}"),
        }
        let mut p = PartialFile::create(dir.path(), spec.file_name).unwrap();
        p.write(b"hello").unwrap();
        assert!(matches!(
            p.commit(&spec),
            Err(HubError::SizeMismatch {
                expected: 11,
                actual: 5
            })
        ));
        // Dropped without commit: also cleaned up.
        drop(PartialFile::create(dir.path(), spec.file_name).unwrap());
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn marker_must_match_spec() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec_for(b"abc", "m.gguf");
        let file = dir.path().join("m.gguf");
        fs::write(&file, b"abc").unwrap();
        assert!(!is_verified(&file, &spec));
        write_marker(&file, &spec).unwrap();
        assert!(is_verified(&file, &spec));
        let other = spec_for(b"abd", "m.gguf");
        assert!(!is_verified(&file, &other));
        remove_model(&file).unwrap();
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn suffixes_are_unique() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
