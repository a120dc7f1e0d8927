# Shared by scripts/package-*.sh (sourced, not run): argument parsing, npm pack, the CLI archive
# and its checksum file. Expects $root (the repository) to be set by the caller.

version=$(bash "$root/scripts/version.sh")
bash "$root/scripts/version.sh" --check

build=1
profile=release
out="$root/target/dist"
parse_package_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-build) build=0 ;;
      --debug) profile=debug ;;
      --out) out=$2; shift ;;
      -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) echo "$(basename "$0"): unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
  done
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
}

# npm pack DIR into $out; prints the tarball's path. (An absolute path: npm reads `a/b` as a
# repository shorthand.)
#   MLEX_REPOSITORY_URL (the release workflow sets it): written into package.json's repository
#   first; `npm publish --provenance` refuses a package whose repository is not the one that built it.
pack_npm() {
  local dir name
  dir=$(cd "$root/$1" && pwd)
  if [ -n "${MLEX_REPOSITORY_URL:-}" ]; then
    (cd "$dir" && npm pkg set repository.type=git "repository.url=$MLEX_REPOSITORY_URL")
  fi
  name=$(cd "$root" && npm pack --silent --pack-destination "$out" "$dir" | tail -n 1)
  [ -f "$out/$name" ] || { echo "$(basename "$0"): npm pack $dir made no tarball" >&2; exit 1; }
  echo "$out/$name"
}

sha256_of() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# make_archive STAGE: tars the folder STAGE (named mlex-<version>-<platform>) into
# $out/<name>.tar.gz and writes <name>.tar.gz.sha256 beside it (`sha256sum -c` / `shasum -a 256 -c`).
make_archive() {
  local stage=$1 name tarball
  name=$(basename "$stage")
  tarball="$out/$name.tar.gz"
  rm -f "$tarball" "$tarball.sha256"
  if tar --version 2>/dev/null | grep -q 'GNU tar'; then
    tar -C "$(dirname "$stage")" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -n -6 > "$tarball"
  else
    tar -C "$(dirname "$stage")" --uid 0 --gid 0 -cf - "$name" | gzip -n -6 > "$tarball"
  fi
  echo "$(sha256_of "$tarball")  $name.tar.gz" > "$tarball.sha256"
  echo "$(basename "$0"): $tarball ($(du -h "$tarball" | cut -f1))" >&2
}

# A fresh staging folder for the CLI archive of PLATFORM; prints its path.
new_stage() {
  local stage="$out/stage/mlex-$version-$1"
  rm -rf "$stage"
  mkdir -p "$stage"
  echo "$stage"
}

# Linux: builds the addon and the CLI against BACKEND's MLX unless --no-build (both link the
# same headers; the backend only picks which libmlx.so ships), then sets $cli to the binary.
build_linux() {
  local triple=x86_64-unknown-linux-gnu flags=()
  [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || { echo "$(basename "$0"): run on Linux x86_64" >&2; exit 2; }
  if [ "$build" = 1 ]; then
    [ "$profile" = release ] && flags=(--release)
    MLEX_BACKEND=cpu npx napi build --platform "${flags[@]}" --no-default-features --features node -- --lib
    MLEX_BACKEND=cpu cargo build "${flags[@]}" --target "$triple" --bin mlex
  fi
  cli="$root/target/$triple/$profile/mlex"
  [ -x "$cli" ] || { echo "$(basename "$0"): $cli is missing (build it, or drop --no-build)" >&2; exit 1; }
}

# Linux: stages the CLI archive of PLATFORM with BACKEND's MLX (cpu | cuda) and the wheel's
# bundled libraries folder LIBS: the stripped binary (RUNPATH $ORIGIN/mlx/lib only), libmlx.so,
# LIBS beside mlx/, MLX's licence and the README. Sets $stage.
stage_linux_cli() {
  local platform=$1 backend=$2 libs=$3 prefix
  prefix=$(bash "$root/vendor/fetch-mlx.sh" "$backend")
  stage=$(new_stage "$platform")
  objcopy --strip-debug "$cli" "$stage/mlex"
  python3 "$root/scripts/elf-runpath.py" --origin-only "$stage/mlex" 2>/dev/null
  mkdir -p "$stage/mlx/lib"
  cp "$prefix/mlx/lib/libmlx.so" "$stage/mlx/lib/"
  cp -r "$prefix/$libs" "$stage/"
  cp "$prefix"/*.dist-info/licenses/LICENSE "$stage/mlx/LICENSE"
  cp "$root/README.md" "$stage/"
}
