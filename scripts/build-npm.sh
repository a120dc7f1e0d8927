#!/usr/bin/env bash
# Builds the Linux x64 npm platform packages: the addon (.node) beside the MLX shared library
# it links, in the wheel's own folder layout, so `npm i mlex` needs no compiler, Python or MLX.
#
#   scripts/build-npm.sh [--debug] [--no-build] [cpu] [cuda]      (default: cpu)
#
#   --debug     build without --release (quicker; debug info is stripped from the packaged copy)
#   --no-build  package the mlex.linux-x64-gnu.node already in the repository root
#   cpu         npm/linux-x64-gnu:       .node + mlx/lib/libmlx.so + mlx_cpu.libs/ (BLAS, LAPACK, gfortran)
#   cuda        npm/linux-x64-gnu-cuda:  the same .node + the CUDA wheel's mlx/lib/libmlx.so and
#               mlx_cuda_13.libs/ (DESIGN.md §2: one binary, built against the CPU wheel's headers,
#               runs on the CUDA libmlx). The NVIDIA libraries (cuBLAS, cuDNN, NCCL, cuFFT, cuSOLVER,
#               NVRTC; libmlx.so looks in $ORIGIN/../../nvidia/*/lib, then the system) are not bundled.
#
# Layout: the .node's RUNPATH starts with $ORIGIN/mlx/lib (build.rs), and libmlx.so finds
# mlx_cpu.libs/ through its own RPATH $ORIGIN/../../mlx_cpu.libs. The MLX wheels come from
# vendor/fetch-mlx.sh (hash-pinned, cached). macOS (npm/darwin-arm64) is built on a Mac the same way
# with libmlx.dylib, mlx.metallib and libjaccl.dylib in mlx/lib.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

release=1
build=1
backends=()
for arg in "$@"; do
  case "$arg" in
    --debug) release=0 ;;
    --no-build) build=0 ;;
    cpu | cuda) backends+=("$arg") ;;
    *) echo "build-npm: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[ ${#backends[@]} -gt 0 ] || backends=(cpu)

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "build-npm: this script builds the linux-x64 packages (this is $(uname -s)-$(uname -m))" >&2; exit 2 ;;
esac

node_file="$root/mlex.linux-x64-gnu.node"
if [ "$build" = 1 ]; then
  flags=(--platform --no-default-features --features node)
  [ "$release" = 1 ] && flags+=(--release)
  MLEX_BACKEND=cpu npx napi build "${flags[@]}" -- --lib
fi
[ -f "$node_file" ] || { echo "build-npm: $node_file is missing (run npm run build, or drop --no-build)" >&2; exit 1; }

version=$(node -p "require('./package.json').version")
for backend in "${backends[@]}"; do
  case "$backend" in
    cpu) dir=npm/linux-x64-gnu ;;
    cuda) dir=npm/linux-x64-gnu-cuda ;;
  esac
  prefix=$(bash vendor/fetch-mlx.sh "$backend")
  rm -rf "$dir/mlx" "$dir"/*.libs "$dir"/*.node
  mkdir -p "$dir/mlx/lib"
  # Debug info is for us, not for users: strip it from the packaged copy.
  objcopy --strip-debug "$node_file" "$dir/mlex.linux-x64-gnu.node" 2>/dev/null || cp "$node_file" "$dir/"
  # Its RUNPATH keeps only $ORIGIN/mlx/lib: the build machine's MLX prefix does not ship.
  python3 scripts/elf-runpath.py --origin-only "$dir/mlex.linux-x64-gnu.node" 2>/dev/null
  cp "$prefix/mlx/lib/libmlx.so" "$dir/mlx/lib/"
  cp "$prefix"/*.dist-info/licenses/LICENSE "$dir/mlx/LICENSE"
  # The wheel's bundled BLAS/LAPACK (mlx_cpu.libs/ or mlx_cuda_13.libs/), found by libmlx.so's
  # own RPATH $ORIGIN/../../<wheel>.libs.
  for libs in "$prefix"/*.libs; do
    [ -d "$libs" ] && cp -r "$libs" "$dir/"
  done
  # Platform packages carry the main package's version (the loader expects them to match).
  node -e '
    const fs = require("fs"); const f = process.argv[1]; const p = JSON.parse(fs.readFileSync(f, "utf8"))
    p.version = process.argv[2]; fs.writeFileSync(f, JSON.stringify(p, null, 2) + "\n")
  ' "$dir/package.json" "$version"
  if [ "$backend" = cpu ]; then
    # The packaged addon must load from its own folder alone (no build-tree paths).
    (cd /tmp && LD_LIBRARY_PATH= node -e 'require(process.argv[1])' "$root/$dir/mlex.linux-x64-gnu.node")
  fi
  echo "build-npm: $dir ($(du -sh "$dir" | cut -f1))" >&2
done
