#!/usr/bin/env bash
# Create the oracle venv: mlx-lm (the reference implementation the conformance suite compares
# against), pinned exactly to the MLX version mlex links; and Pillow with transformers for the image
# preprocessing oracle (tests/oracle/image_preprocess.py: transformers' Gemma 3 image processor,
# PIL backend, no torch). Pillow stays on 12.x: 13 runs the vertical resize pass first for many
# more shapes (results one level of rounding apart); mlex follows 12.x (src/media/image.rs).
# And mlx-vlm's model files for the Gemma 3 vision oracle (tests/oracle/gemma3_vision.py), installed
# with --no-deps in a pip call of its own: its declared dependencies (datasets, opencv, fastapi,
# mlx-audio, ...) are not needed by those files, which import only mlx, numpy, PIL and transformers,
# all pinned here. Nothing may import mlx_vlm/__init__.py, which pulls those heavy dependencies in.
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
MLX_VLM_VERSION=0.7.10
venv=${MLEX_ORACLE_VENV:-$PWD/.venv-oracle}
py="$venv/bin/python"

pins=("mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" "pillow==$PILLOW_VERSION" "transformers==$TRANSFORMERS_VERSION")
case "$(uname -s)" in
  # Linux wheels of mlx carry no backend; the CPU one is its own distribution.
  Linux) pins+=("mlx-cpu==$MLX_VERSION") ;;
esac

have_pins() {
  [ -x "$py" ] || return 1
  "$py" - "$MLX_VERSION" "$MLX_LM_VERSION" "$PILLOW_VERSION" "$TRANSFORMERS_VERSION" "$MLX_VLM_VERSION" <<'PY' >/dev/null 2>&1
import os, sys
from importlib.metadata import version
from importlib.util import find_spec
want_mlx, want_lm, want_pil, want_tf, want_vlm = sys.argv[1:6]
assert version("mlx") == want_mlx, version("mlx")
assert version("mlx-lm") == want_lm, version("mlx-lm")
assert version("pillow") == want_pil, version("pillow")
assert version("transformers") == want_tf, version("transformers")
assert version("mlx-vlm") == want_vlm, version("mlx-vlm")
# find_spec on a top-level package does not run its __init__.py (mlx_vlm's imports heavy deps).
(vlm_dir,) = find_spec("mlx_vlm").submodule_search_locations
assert os.path.isfile(os.path.join(vlm_dir, "models", "gemma3", "vision.py")), vlm_dir
import mlx.core, mlx_lm  # the backend library must load, too
import PIL.Image
PY
}

if have_pins; then
  echo "setup-oracle: $venv already holds mlx==$MLX_VERSION mlx-lm==$MLX_LM_VERSION pillow==$PILLOW_VERSION transformers==$TRANSFORMERS_VERSION mlx-vlm==$MLX_VLM_VERSION" >&2
else
  if [ ! -x "$py" ]; then
    python3 -m venv "$venv" >&2
  fi
  "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
  # Its model files only: see the header for why not its dependencies.
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps "mlx-vlm==$MLX_VLM_VERSION" >&2
  have_pins || { echo "setup-oracle: $venv does not import the pinned mlx / mlx-lm / pillow / transformers / mlx-vlm" >&2; exit 1; }
fi
echo "$py"
