#!/usr/bin/env bash
# Release artifacts of Linux x64, CPU backend (the mlx-cpu wheel):
#
#   scripts/package-linux-x64.sh [--no-build] [--debug] [--out DIR]      (default DIR: target/dist)
#
#   DIR/mlex-<version>.tgz                      the main npm package (JS loader, types, adapters)
#   DIR/mlex-linux-x64-gnu-<version>.tgz        the npm platform package (npm/linux-x64-gnu)
#   DIR/mlex-<version>-linux-x64-gnu.tar.gz     the CLI: mlex + mlx/lib/libmlx.so + mlx_cpu.libs/
#   DIR/mlex-<version>-linux-x64-gnu.tar.gz.sha256
#
#   --no-build  package what is built already (the root mlex.linux-x64-gnu.node, target/.../mlex)
#   --debug     package the debug builds (what scripts/test.sh builds; the install test uses them)
#
# The archive keeps the npm package's (and the wheel's) layout: the binary's RUNPATH is
# $ORIGIN/mlx/lib (build.rs), and libmlx.so finds its BLAS/LAPACK through its own RPATH
# $ORIGIN/../../mlx_cpu.libs, so nothing of MLX is patched. The packaged binaries' RUNPATH is
# trimmed to its $ORIGIN entry (scripts/elf-runpath.py): no path of the build machine ships.
# Version: Cargo.toml's (scripts/version.sh). Build on glibc 2.35 (Ubuntu 22.04, the wheel's
# manylinux_2_35 floor) for a binary that runs wherever the wheel does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/package-common.sh
parse_package_args "$@"

build_linux

# npm: the platform package (build-npm.sh assembles and checks it), then both tarballs.
bash scripts/build-npm.sh --no-build cpu
main_tgz=$(pack_npm .)
platform_tgz=$(pack_npm npm/linux-x64-gnu)
echo "package-linux-x64: $main_tgz, $platform_tgz" >&2

# The CLI archive.
stage_linux_cli linux-x64-gnu cpu mlx_cpu.libs
# Self-check: every library resolves inside the folder, from another directory, with no
# LD_LIBRARY_PATH, and the binary runs.
missing=$(cd / && LD_LIBRARY_PATH= ldd "$stage/mlex" | grep -E 'not found|^\s*(libmlx\.so|lib(blas|lapack|gfortran|quadmath)-)' | grep -v "=> $stage/" || true)
[ -z "$missing" ] || { echo "package-linux-x64: libraries resolved outside the archive:"$'\n'"$missing" >&2; exit 1; }
(cd / && LD_LIBRARY_PATH= "$stage/mlex" --version) | grep -qx "mlex $version" ||
  { echo "package-linux-x64: the packaged mlex does not report version $version" >&2; exit 1; }
make_archive "$stage"
rm -rf "$out/stage"
