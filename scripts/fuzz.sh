#!/usr/bin/env bash
# Fuzzes the GGUF reader (and the tokenizer built from what it reads) with cargo-fuzz.
#   scripts/fuzz.sh [SECONDS]   (default 600)
# Installs cargo-fuzz if missing. cargo-fuzz needs nightly-only flags; on a stable toolchain
# RUSTC_BOOTSTRAP=1 lets rustc accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-600}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo run --quiet --bin make_seeds
RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_parse corpus/gguf_parse -- -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 2>&1 | tee fuzz.log | grep -E "^#[0-9]+.*(pulse|DONE)|Done|ERROR|panicked" || true
tail -n 3 fuzz.log
