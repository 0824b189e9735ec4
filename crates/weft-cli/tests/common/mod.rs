//! What the CLI test binaries share.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs the `weft` binary with `args`, `stdin` written to its input, and waits for it.
pub fn weft(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weft");
    let written = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    // A command that fails before reading its input closes the pipe: its output tells.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    child.wait_with_output().expect("wait for weft")
}
