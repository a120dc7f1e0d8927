#!/usr/bin/env bash
# Create the oracle venv: mlx-lm (the reference implementation the conformance suite compares
# against), pinned exactly to the MLX version mlex links; and Pillow with transformers for the image
# preprocessing oracle (tests/oracle/image_preprocess.py: transformers' Gemma 3 image processor,
# PIL backend, no torch). Pillow stays on 12.x: 13 runs the vertical resize pass first for many
# more shapes (results one level of rounding apart); mlex follows 12.x (src/media/image.rs).
#
#   scripts/setup-oracle.sh        prints the venv's python path on stdout (the last line)
#
# Venv location: ${MLEX_ORACLE_VENV:-$PWD/.venv-oracle}. Idempotent: when the venv already holds
# the pinned versions nothing is installed. Only pip talks to the package index.
set -euo pipefail

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
PILLOW_VERSION=12.3.0
TRANSFORMERS_VERSION=5.24.0
venv=${MLEX_ORACLE_VENV:-$PWD/.venv-oracle}
py="$venv/bin/python"

pins=("mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" "pillow==$PILLOW_VERSION" "transformers==$TRANSFORMERS_VERSION")
case "$(uname -s)" in
  # Linux wheels of mlx carry no backend; the CPU one is its own distribution.
  Linux) pins+=("mlx-cpu==$MLX_VERSION") ;;
esac

have_pins() {
  [ -x "$py" ] || return 1
  "$py" - "$MLX_VERSION" "$MLX_LM_VERSION" "$PILLOW_VERSION" "$TRANSFORMERS_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
want_mlx, want_lm, want_pil, want_tf = sys.argv[1:5]
assert version("mlx") == want_mlx, version("mlx")
assert version("mlx-lm") == want_lm, version("mlx-lm")
assert version("pillow") == want_pil, version("pillow")
assert version("transformers") == want_tf, version("transformers")
import mlx.core, mlx_lm  # the backend library must load, too
import PIL.Image
PY
}

if have_pins; then
  echo "setup-oracle: $venv already holds mlx==$MLX_VERSION mlx-lm==$MLX_LM_VERSION pillow==$PILLOW_VERSION transformers==$TRANSFORMERS_VERSION" >&2
else
  if [ ! -x "$py" ]; then
    python3 -m venv "$venv" >&2
  fi
  "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
  have_pins || { echo "setup-oracle: $venv does not import the pinned mlx / mlx-lm / pillow / transformers" >&2; exit 1; }
fi
echo "$py"
