#!/usr/bin/env bash
# The test command (README): Rust tests (ops, architectures, conformance with mlx-lm, bad input,
# templates, GGUF), then the Node package's tests.
# The conformance suite needs the oracle venv (scripts/setup-oracle.sh); under CI=1 its absence fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# Build for the explicit host triple: `napi build` (the Node addon below) does, and sharing
# target/<triple>/ with it means the dependencies are compiled once, not twice.
host=$(rustc -vV | sed -n 's/^host: //p')
cargo test --target "$host" --all-targets -- --test-threads=2
if [ -f package.json ] && grep -q '"test"' package.json; then
  [ -d node_modules ] || npm install --no-audit --no-fund
  npm run build:debug
  npm test
fi
