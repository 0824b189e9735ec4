//! Files the CLI writes whole and puts in place only when written: a session (`run
//! --save-session`) and a conversation (`chat`'s `/save`). A failed or interrupted write (a
//! full disk, a Ctrl-C) leaves the previous file as it was.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A temp file beside the target, renamed over it once the whole content is written. Made
/// before the work whose result it keeps, so that an unwritable place is an error before
/// any work. Dropped unwritten, it is removed; one a killed process left (a Ctrl-C ends the
/// process without dropping it) is removed by the next write to the same target: its name
/// holds the writer's process id.
pub struct ReplacingFile {
    target: PathBuf,
    tmp: tempfile::NamedTempFile,
    /// What the write is, for errors: "save the session".
    what: &'static str,
}

impl ReplacingFile {
    /// A temp file for `f`; errors begin "cannot {what} to {f}".
    pub fn create(f: &Path, what: &'static str) -> anyhow::Result<Self> {
        let fail = |why: &str| anyhow::anyhow!("cannot {what} to {}: {why}", f.display());
        // A symbolic link is written through, as a plain write would.
        let target = match f.is_symlink() {
            true => std::fs::canonicalize(f).map_err(|e| fail(&e.to_string()))?,
            false => f.to_path_buf(),
        };
        match std::fs::metadata(&target) {
            Ok(m) if m.is_dir() => return Err(fail("it is a directory (name a file in it)")),
            Ok(m) if !m.is_file() => return Err(fail("it is not a regular file")),
            _ => {}
        }
        let dir = target
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        anyhow::ensure!(dir.is_dir(), fail("no such directory"));
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        remove_left_temp_files(dir, &format!(".{name}."));
        let prefix = format!(".{name}.{}.", std::process::id());
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            // As a file `File::create` makes (the umask applies), not a temp file's 0600.
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let tmp = builder.tempfile_in(dir).map_err(|e| fail(&e.to_string()))?;
        Ok(ReplacingFile { target, tmp, what })
    }

    /// Writes the content with `write` (through a buffer), then puts the file in place.
    pub fn write<E>(
        self,
        write: impl FnOnce(&mut std::io::BufWriter<&mut std::fs::File>) -> Result<(), E>,
    ) -> anyhow::Result<()>
    where
        anyhow::Error: From<E>,
    {
        let (what, target) = (self.what, self.target.display().to_string());
        let fail = |e: anyhow::Error| e.context(format!("cannot {what} to {target}"));
        let mut tmp = self.tmp;
        {
            let mut out = std::io::BufWriter::new(tmp.as_file_mut());
            write(&mut out).map_err(|e| fail(e.into()))?;
            out.flush().map_err(|e| fail(e.into()))?;
        }
        tmp.as_file().sync_all().map_err(|e| fail(e.into()))?;
        tmp.persist(&self.target)
            .map_err(|e| anyhow::anyhow!("cannot {what} to {target}: {}", e.error))?;
        Ok(())
    }
}

/// Removes the temp files `.NAME.PID.*.tmp` in `dir` (`start` is `.NAME.`) whose writer
/// process is gone. Where there is no /proc to ask, every writer counts as alive.
fn remove_left_temp_files(dir: &Path, start: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(start)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.split('.').next())
            .and_then(|p| p.parse::<u32>().ok());
        let gone =
            |p: u32| Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{p}")).exists();
        if pid.is_some_and(gone) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
