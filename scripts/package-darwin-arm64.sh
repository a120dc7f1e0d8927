#!/usr/bin/env bash
# Release artifacts of macOS arm64 (Apple silicon, macOS 14+), Metal backend (the mlx-metal wheel).
# Runs on a Mac (CI: the macos-14 runner); nothing here can run on Linux.
#
#   scripts/package-darwin-arm64.sh [--no-build] [--debug] [--out DIR]    (default DIR: target/dist)
#
#   DIR/mlex-darwin-arm64-<version>.tgz         the npm platform package (npm/darwin-arm64):
#                                               mlex.darwin-arm64.node, mlx/lib/libmlx.dylib,
#                                               mlx/lib/mlx.metallib, mlx/LICENSE
#   DIR/mlex-<version>-darwin-arm64.tar.gz      the CLI: mlex + mlx/lib/{libmlx.dylib,mlx.metallib}
#   DIR/mlex-<version>-darwin-arm64.tar.gz.sha256
#
#   --no-build  package what is built already (the root mlex.darwin-arm64.node, target/.../mlex)
#   --debug     package the debug builds (what scripts/test.sh builds; the install test uses them)
#
# What each step is for (docs/release.md, "macOS"):
# - MACOSX_DEPLOYMENT_TARGET=14.0: libmlx.dylib is built for macOS 14 (LC_BUILD_VERSION minos
#   14.0); the shim and the Rust code are compiled and linked for the same floor.
# - build.rs links with LC_RPATH @loader_path/mlx/lib (the .node's or the binary's own folder) and
#   the build machine's MLX prefix; the packaged copies keep only the @loader_path entry
#   (install_name_tool -delete_rpath), and the addon's install name becomes @rpath/<file> instead
#   of the build folder's path. libmlx.dylib's own install name is @rpath/libmlx.dylib already.
# - mlx.metallib sits beside libmlx.dylib: MLX looks for it next to the library that holds its
#   code (dladdr), so it loads from wherever the package is unpacked.
# - install_name_tool invalidates the linker's ad-hoc signature, and arm64 macOS kills unsigned
#   code: every edited file is signed again (ad hoc; with MLEX_CODESIGN_IDENTITY, a Developer ID
#   with the hardened runtime and a secure timestamp, for notarization of the CLI archive).
# - libjaccl.dylib (MLX's Thunderbolt-RDMA distributed backend, not linked by libmlx.dylib) is
#   left out.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/package-common.sh
parse_package_args "$@"

[ "$(uname -s)-$(uname -m)" = Darwin-arm64 ] || { echo "package-darwin-arm64: run on macOS arm64 (this is $(uname -s)-$(uname -m))" >&2; exit 2; }
export MACOSX_DEPLOYMENT_TARGET=${MACOSX_DEPLOYMENT_TARGET:-14.0}
export MLEX_BACKEND=metal
triple=aarch64-apple-darwin
if [ "$build" = 1 ]; then
  flags=(); [ "$profile" = release ] && flags=(--release)
  npx napi build --platform --target "$triple" "${flags[@]}" --no-default-features --features node -- --lib
  cargo build "${flags[@]}" --target "$triple" --bin mlex
fi
node_file="$root/mlex.darwin-arm64.node"
cli="$root/target/$triple/$profile/mlex"
for f in "$node_file" "$cli"; do
  [ -f "$f" ] || { echo "package-darwin-arm64: $f is missing (build it, or drop --no-build)" >&2; exit 1; }
done
prefix=$(bash vendor/fetch-mlx.sh metal)

rpaths() { otool -l "$1" | awk '$1 == "cmd" { cmd = $2 } cmd == "LC_RPATH" && $1 == "path" { print $2 }'; }

# Keeps only @loader_path rpaths, optionally sets the install name, signs again, checks.
fix_macho() {
  local file=$1 id=${2:-} r list
  list=$(rpaths "$file")
  while read -r r; do
    case "$r" in '' | @loader_path/*) ;; *) install_name_tool -delete_rpath "$r" "$file" ;; esac
  done <<<"$list"
  [ -n "$id" ] && install_name_tool -id "$id" "$file"
  if [ -n "${MLEX_CODESIGN_IDENTITY:-}" ]; then
    codesign --force --options runtime --timestamp --sign "$MLEX_CODESIGN_IDENTITY" "$file"
  else
    codesign --force --sign - "$file"
  fi
  codesign --verify --strict "$file"
}

# A packaged binary: its only rpath is @loader_path/mlx/lib, it loads @rpath/libmlx.dylib, it was
# built for macOS 14, and nothing else outside the system is linked.
check_macho() {
  local file=$1 want_minos=${MACOSX_DEPLOYMENT_TARGET}
  [ "$(rpaths "$file")" = "@loader_path/mlx/lib" ] ||
    { echo "package-darwin-arm64: $file: rpaths are '$(rpaths "$file" | tr '\n' ' ')'" >&2; exit 1; }
  otool -L "$file" | tail -n +2 | awk '{ print $1 }' | grep -vE '^(/usr/lib/|/System/Library/|@rpath/libmlx\.dylib$)' |
    grep -v "^@rpath/$(basename "$file")$" && { echo "package-darwin-arm64: $file links a library that does not ship" >&2; exit 1; }
  otool -L "$file" | grep -q '@rpath/libmlx.dylib' || { echo "package-darwin-arm64: $file does not link @rpath/libmlx.dylib" >&2; exit 1; }
  otool -l "$file" | awk '$1 == "minos" { print $2 }' | grep -qx "$want_minos" ||
    echo "package-darwin-arm64: warning: $file minos is $(otool -l "$file" | awk '$1 == "minos" { print $2 }'), not $want_minos" >&2
  lipo -archs "$file" | grep -qx arm64 || { echo "package-darwin-arm64: $file is not arm64-only" >&2; exit 1; }
}

copy_mlx() {
  mkdir -p "$1/mlx/lib"
  cp "$prefix/mlx/lib/libmlx.dylib" "$prefix/mlx/lib/mlx.metallib" "$1/mlx/lib/"
  cp "$prefix"/*.dist-info/licenses/LICENSE "$1/mlx/LICENSE"
  if [ -n "${MLEX_CODESIGN_IDENTITY:-}" ]; then
    codesign --force --options runtime --timestamp --sign "$MLEX_CODESIGN_IDENTITY" "$1/mlx/lib/libmlx.dylib"
  fi
}

# npm platform package.
dir=npm/darwin-arm64
rm -rf "$dir/mlx" "$dir"/*.node
cp "$node_file" "$dir/mlex.darwin-arm64.node"
strip -S "$dir/mlex.darwin-arm64.node" 2>/dev/null || true
fix_macho "$dir/mlex.darwin-arm64.node" "@rpath/mlex.darwin-arm64.node"
check_macho "$dir/mlex.darwin-arm64.node"
copy_mlx "$dir"
# It loads from its own folder alone, from another directory, with no library path set.
(cd / && env -u DYLD_LIBRARY_PATH -u DYLD_FALLBACK_LIBRARY_PATH node -e '
  const m = require(process.argv[1]); if (typeof m.NativeSession !== "function") throw new Error("no NativeSession export")
  const lib = process.report.getReport().sharedObjects.find((p) => p.endsWith("/libmlx.dylib"))
  if (!require("fs").realpathSync(lib).startsWith(require("fs").realpathSync(process.argv[2]))) throw new Error("libmlx.dylib from " + lib)
' "$root/$dir/mlex.darwin-arm64.node" "$root/$dir")
platform_tgz=$(pack_npm "$dir")
echo "package-darwin-arm64: $platform_tgz" >&2

# CLI archive.
stage=$(new_stage darwin-arm64)
cp "$cli" "$stage/mlex"
strip -S "$stage/mlex" 2>/dev/null || true
fix_macho "$stage/mlex"
check_macho "$stage/mlex"
copy_mlx "$stage"
cp README.md "$stage/"
(cd / && env -u DYLD_LIBRARY_PATH -u DYLD_FALLBACK_LIBRARY_PATH "$stage/mlex" --version) | grep -qx "mlex $version" ||
  { echo "package-darwin-arm64: the packaged mlex does not run or does not report version $version" >&2; exit 1; }
make_archive "$stage"
rm -rf "$out/stage"
