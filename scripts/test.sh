#!/usr/bin/env bash
# The test command (README): Rust tests (ops, architectures, conformance with mlx-lm, bad input,
# templates, GGUF), then the Node package's tests.
# The conformance suite needs the oracle venv (scripts/setup-oracle.sh); under CI=1 its absence fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# Build for the explicit host triple: `napi build` (the Node addon below) does, and sharing
# target/<triple>/ with it means the dependencies are compiled once, not twice.
host=$(rustc -vV | sed -n 's/^host: //p')
# Rust has no runtime skip: a test that cannot run what it is for (assets or a venv absent)
# appends a `SKIPPED: <test>: <reason>` line here (tests/common: skip), printed after the run;
# under CI=1 the skips of what CI sets up are failures instead.
export MLEX_SKIP_LOG="$PWD/target/skipped-tests.log"
mkdir -p target && rm -f "$MLEX_SKIP_LOG"
report_skips() {
  if [ -s "$MLEX_SKIP_LOG" ]; then
    echo "== $(sort -u "$MLEX_SKIP_LOG" | wc -l) Rust test(s) skipped (they passed without running what they are for):"
    sort -u "$MLEX_SKIP_LOG"
  fi
}
trap report_skips EXIT
cargo test --target "$host" --all-targets -- --test-threads=2
if [ -f package.json ] && grep -q '"test"' package.json; then
  [ -d node_modules ] || npm install --no-audit --no-fund
  npm run build:debug
  npm test
fi
