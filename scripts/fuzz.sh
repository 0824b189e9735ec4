#!/usr/bin/env bash
# Fuzzes the GGUF reader (and the tokenizer built from what it reads), then the safetensors
# reader and the tokenizer.json loader, with cargo-fuzz.
#   scripts/fuzz.sh [SECONDS]   (per target; default 600)
# Installs cargo-fuzz if missing. cargo-fuzz needs nightly-only flags; on a stable toolchain
# RUSTC_BOOTSTRAP=1 lets rustc accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-600}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo run --quiet --bin make_seeds
for target in gguf_parse safetensors_parse; do
  mkdir -p "corpus/$target"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 2>&1 | tee "fuzz-$target.log" | grep -E "^#[0-9]+.*(pulse|DONE)|Done|ERROR|panicked" || true
  tail -n 3 "fuzz-$target.log"
done
