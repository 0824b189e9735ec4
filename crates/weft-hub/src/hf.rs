//! The Hugging Face source: one HTTPS GET of the `resolve/main` URL, streamed
//! through the same hash-while-writing partial file as the PyPI source.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::PartialFile;
use crate::error::HubError;
use crate::progress::{Progress, Step};
use crate::registry::{HfSource, ModelSpec};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A download that receives nothing for this long has stalled, and fails.
const STALL: Duration = Duration::from_secs(60);

/// The download URL of `source`; `$HF_ENDPOINT` replaces the default host (mirrors).
pub(crate) fn url(source: &HfSource) -> String {
    let endpoint = std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
    format!(
        "{}/{}/resolve/main/{}",
        endpoint.trim_end_matches('/'),
        source.repo,
        source.file
    )
}

/// The bearer token from `$HF_TOKEN`, if set and non-empty.
fn token() -> Option<String> {
    std::env::var("HF_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Downloads `spec` from Hugging Face into `models_dir`, verifying it.
pub(crate) fn fetch(
    spec: &ModelSpec,
    source: &HfSource,
    models_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, HubError> {
    download(
        spec,
        &url(source),
        token().as_deref(),
        models_dir,
        STALL,
        progress,
    )
}

/// GETs `url` (with `token` as a bearer token) and streams the body through a
/// verified partial file in `models_dir`; fails when the server sends nothing for `stall`.
fn download(
    spec: &ModelSpec,
    url: &str,
    token: Option<&str>,
    models_dir: &Path,
    stall: Duration,
    progress: &mut dyn Progress,
) -> Result<PathBuf, HubError> {
    tracing::info!("downloading {url}");
    let http_err = |message: String| HubError::Http {
        url: url.to_string(),
        message,
    };
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(stall))
        // Each read of the body too: a server that stops sending mid-file would otherwise
        // hold the download (and a `weft serve` loading in the background) forever.
        .timeout_per_read(Some(stall))
        .user_agent(concat!("weft/", env!("CARGO_PKG_VERSION")))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut request = agent.get(url);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let response = request.call().map_err(|e| {
        http_err(match e {
            ureq::Error::StatusCode(code @ (401 | 403)) => format!(
                "HTTP {code}: access denied; if the repository is gated or private, \
                 set HF_TOKEN to a Hugging Face access token"
            ),
            ureq::Error::StatusCode(404) => "HTTP 404: file not found".to_string(),
            ureq::Error::StatusCode(code) => format!("HTTP {code}"),
            other => other.to_string(),
        })
    })?;
    let length = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = length.filter(|&l| l != spec.size) {
        return Err(HubError::SizeMismatch {
            expected: spec.size,
            actual: length,
        });
    }
    let mut partial = PartialFile::create(models_dir, spec.file_name)?;
    {
        let label = format!("downloading {}", spec.file_name);
        let mut step = Step::begin(progress, &label, Some(spec.size));
        // A server that gives no length is read one byte past the file's size at most: enough
        // to tell it sent too much, without filling the disk first.
        let mut reader = response.into_body().into_reader().take(spec.size + 1);
        partial
            .copy_from(&mut reader, Path::new(url), &mut step)
            .map_err(|e| match e {
                HubError::Io {
                    action: "read",
                    source,
                    ..
                } => http_err(source.to_string()),
                other => other,
            })?;
    }
    partial.commit(spec)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::thread;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::cache::hex;
    use crate::progress::NoProgress;

    #[test]
    fn url_uses_resolve_main() {
        let source = HfSource {
            repo: "owner/repo",
            file: "m.gguf",
        };
        if std::env::var_os("HF_ENDPOINT").is_none() {
            assert_eq!(
                url(&source),
                "https://huggingface.co/owner/repo/resolve/main/m.gguf"
            );
        }
    }

    /// Serves one HTTP response on loopback; returns the URL and a handle yielding
    /// the request's header lines.
    fn serve_once(status: &str, body: Vec<u8>) -> (String, thread::JoinHandle<Vec<String>>) {
        serve_once_then_stall(status, body, 0)
    }

    /// [`serve_once`], announcing `missing` bytes more than it sends, then holding the
    /// connection open for a minute without sending them.
    fn serve_once_then_stall(
        status: &str,
        body: Vec<u8>,
        missing: usize,
    ) -> (String, thread::JoinHandle<Vec<String>>) {
        serve(status, body, Some(missing))
    }

    /// Serves one response: with a Content-Length `missing` bytes more than `body` (and then
    /// a stall, if more), or with none (the body ends when the connection closes).
    fn serve(
        status: &str,
        body: Vec<u8>,
        missing: Option<usize>,
    ) -> (String, thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let status = status.to_string();
        let handle = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
                    break;
                }
                headers.push(line.trim().to_string());
            }
            let mut stream = stream;
            let length = match missing {
                Some(m) => format!("Content-Length: {}\r\n", body.len() + m),
                None => String::new(),
            };
            let head = format!("HTTP/1.1 {status}\r\n{length}Connection: close\r\n\r\n");
            stream.write_all(head.as_bytes()).unwrap();
            // The client may hang up on an unsized body it has read enough of.
            let _ = stream.write_all(&body);
            if missing.is_some_and(|m| m > 0) {
                stream.flush().unwrap();
                thread::sleep(Duration::from_secs(60));
            }
            headers
        });
        (format!("http://{addr}/o/r/resolve/main/m.gguf"), handle)
    }

    fn spec_for(data: &[u8]) -> ModelSpec {
        ModelSpec {
            name: "fake",
            aliases: &[],
            description: "fake",
            file_name: "m.gguf",
            size: data.len() as u64,
            sha256: Box::leak(hex(&Sha256::digest(data)).into_boxed_str()),
            pypi: None,
            hf: None,
            companions: &[],
        }
    }

    #[test]
    fn streams_verifies_and_sends_token() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let spec = spec_for(&data);
        let dir = tempfile::tempdir().unwrap();
        let (url, server) = serve_once("200 OK", data.clone());
        let path = download(
            &spec,
            &url,
            Some("secret"),
            dir.path(),
            STALL,
            &mut NoProgress,
        );
        let path = path.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        let headers = server.join().unwrap();
        assert!(
            headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case("authorization: Bearer secret")),
            "{headers:?}"
        );
    }

    #[test]
    fn denied_mentions_hf_token() {
        let spec = spec_for(b"abc");
        let dir = tempfile::tempdir().unwrap();
        let (url, server) = serve_once("401 Unauthorized", b"no".to_vec());
        let err = download(&spec, &url, None, dir.path(), STALL, &mut NoProgress).unwrap_err();
        assert!(err.to_string().contains("HF_TOKEN"), "{err}");
        server.join().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_unsized_body_longer_than_the_file_stops_past_its_size() {
        let spec = spec_for(&[7u8; 1000]);
        let dir = tempfile::tempdir().unwrap();
        let (url, server) = serve("200 OK", vec![7u8; 8 << 20], None);
        let err = download(&spec, &url, None, dir.path(), STALL, &mut NoProgress).unwrap_err();
        assert!(
            matches!(
                err,
                HubError::SizeMismatch {
                    expected: 1000,
                    actual: 1001
                }
            ),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        server.join().unwrap();
    }

    #[test]
    fn a_stalled_body_fails_and_leaves_nothing() {
        let data: Vec<u8> = (0..2048u32).map(|i| i as u8).collect();
        let spec = spec_for(&data);
        let dir = tempfile::tempdir().unwrap();
        let (url, server) = serve_once_then_stall("200 OK", data[..1024].to_vec(), 1024);
        let stall = Duration::from_millis(500);
        let start = std::time::Instant::now();
        let err = download(&spec, &url, None, dir.path(), stall, &mut NoProgress).unwrap_err();
        assert!(matches!(err, HubError::Http { .. }), "{err:?}");
        // The server still holds the connection (for a minute): the stall ended the download.
        assert!(start.elapsed() < Duration::from_secs(30), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(server); // still sleeping; not joined
    }
}
