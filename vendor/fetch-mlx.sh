#!/usr/bin/env bash
# Fetch the pinned MLX wheel for one backend with pip and unpack it outside git.
#
#   vendor/fetch-mlx.sh [cpu|cuda|metal]     prints the unpacked prefix (holding mlx/include, mlx/lib)
#
# The wheel is hash-checked against vendor/mlx.lock; the download and the unpacked prefix are cached
# under ${MLEX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mlex}, so rebuilds never download again.
# The wheel's folder layout is kept as it is: libmlx.so finds its BLAS/LAPACK in mlx_cpu.libs/
# through its own RPATH ($ORIGIN/../../mlx_cpu.libs), and mlx.metallib must sit beside libmlx.dylib.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
backend=${1:-${MLEX_BACKEND:-}}
if [ -z "$backend" ]; then
  case "$(uname -s)" in Darwin) backend=metal ;; *) backend=cpu ;; esac
fi
line=$(awk -v b="$backend" '$1 == b { print }' "$here/mlx.lock")
[ -n "$line" ] || { echo "fetch-mlx: unknown backend '$backend' (cpu, cuda or metal)" >&2; exit 2; }
read -r _ pkg version platform sha <<<"$line"

cache=${MLEX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mlex}
prefix="$cache/mlx-$version-$backend"
if [ -f "$prefix/.complete" ]; then echo "$prefix"; exit 0; fi

mkdir -p "$cache/wheels"
req=$(mktemp)
trap 'rm -f "$req"' EXIT
echo "$pkg==$version --hash=sha256:$sha" > "$req"
# --python-version only picks a tag; these wheels are py3-none (no Python ABI inside).
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes --platform "$platform" --python-version 3.11 -d "$cache/wheels" -r "$req" >&2
wheel=$(ls "$cache/wheels/${pkg//-/_}-$version-"*"$platform"*.whl | head -n 1)
echo "$sha  $wheel" | sha256sum -c --quiet - >&2 2>/dev/null || \
  { echo "$sha  $wheel" | shasum -a 256 -c --quiet - >&2; }

tmp="$prefix.tmp.$$"
rm -rf "$tmp" && mkdir -p "$tmp"
python3 -m zipfile -e "$wheel" "$tmp"
rm -rf "$prefix" && mv "$tmp" "$prefix"
touch "$prefix/.complete"
echo "$prefix"
