#!/usr/bin/env bash
# The test command (README): Rust tests (ops, architectures, conformance with mlx-lm, bad input,
# templates, GGUF), then the Node package's tests.
# The conformance suite needs the oracle venv (scripts/setup-oracle.sh); under CI=1 its absence fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-targets -- --test-threads=2
if [ -f package.json ] && grep -q '"test"' package.json; then
  [ -d node_modules ] || npm install --no-audit --no-fund
  npm run build:debug
  npm test
fi
