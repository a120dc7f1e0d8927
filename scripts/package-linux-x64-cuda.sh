#!/usr/bin/env bash
# Release artifacts of Linux x64, CUDA backend (the mlx-cuda-13 wheel):
#
#   scripts/package-linux-x64-cuda.sh [--no-build] [--debug] [--out DIR]   (default DIR: target/dist)
#
#   DIR/mlex-linux-x64-gnu-cuda-<version>.tgz        the npm package npm/linux-x64-gnu-cuda
#   DIR/mlex-<version>-linux-x64-gnu-cuda.tar.gz     the CLI: mlex + the CUDA mlx/lib/libmlx.so +
#   DIR/mlex-<version>-linux-x64-gnu-cuda.tar.gz.sha256          mlx_cuda_13.libs/
#
# The addon and the CLI are the CPU build's (DESIGN.md §2: built against the wheels' identical
# headers, one binary runs on either libmlx); what differs is the libmlx.so beside them. The
# NVIDIA libraries the CUDA libmlx.so needs (CUDA 13 runtime, cuBLAS, cuDNN 9, NCCL, cuFFT,
# cuSOLVER, NVRTC and the driver's libcuda) are not bundled: they come from the system, or from
# the nvidia-* pip packages in an `nvidia/` folder beside mlx/ (libmlx.so's own RPATH looks in
# $ORIGIN/../../nvidia/*/lib). No GPU is needed here: the self-check below proves that everything
# but those NVIDIA libraries resolves inside the archive.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/package-common.sh
parse_package_args "$@"

build_linux

bash scripts/build-npm.sh --no-build cuda
platform_tgz=$(pack_npm npm/linux-x64-gnu-cuda)
echo "package-linux-x64-cuda: $platform_tgz" >&2

stage_linux_cli linux-x64-gnu-cuda cuda mlx_cuda_13.libs

# Self-check without a GPU: with no LD_LIBRARY_PATH, libmlx.so and the BLAS it bundles resolve
# inside the archive, and the only libraries not found are NVIDIA's (or, on a machine that has
# them, none).
check_deps() {
  local file=$1 deps bad
  deps=$(cd / && LD_LIBRARY_PATH= ldd "$file")
  bad=$(echo "$deps" | grep -E '^\s*(libmlx\.so|lib(blas|lapack|gfortran|quadmath)-)' | grep -v "=> $stage/" || true)
  [ -z "$bad" ] || { echo "package-linux-x64-cuda: $file: MLX libraries resolved outside the package:"$'\n'"$bad" >&2; exit 1; }
  bad=$(echo "$deps" | grep 'not found' | grep -vE '^\s*lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|cufft|cusolver|cusparse|nvrtc|nvJitLink|curand)\.so' || true)
  [ -z "$bad" ] || { echo "package-linux-x64-cuda: $file: missing libraries other than NVIDIA's:"$'\n'"$bad" >&2; exit 1; }
}
check_deps "$stage/mlex"
check_deps "$stage/mlx/lib/libmlx.so"
[ "$(python3 scripts/elf-runpath.py "$stage/mlex")" = '$ORIGIN/mlx/lib' ]
# The npm package: the same layout under node_modules/mlex-linux-x64-gnu-cuda.
stage_npm=$stage
stage=$root/npm/linux-x64-gnu-cuda
check_deps "$stage/mlex.linux-x64-gnu.node"
stage=$stage_npm
make_archive "$stage"
rm -rf "$out/stage"
