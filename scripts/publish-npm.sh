#!/usr/bin/env bash
# Publishes the npm tarballs the package scripts made (the release workflow's last job):
#
#   scripts/publish-npm.sh DIST [--dry-run]
#
# Platform packages first (mlex-darwin-arm64, mlex-linux-x64-gnu, mlex-linux-x64-gnu-cuda), the
# main package `mlex` last, so that its optionalDependencies exist when it appears. Each with
# provenance (`npm publish --provenance`: a signed statement of the workflow run that built it;
# needs the job's `id-token: write`) and public access; a version with a pre-release part
# (0.2.0-rc.1) goes to the `next` dist-tag instead of `latest`. A version already published is
# skipped, so a failed run can be re-run. Authentication: NPM_TOKEN when set (written to a
# temporary user config for the default registry), else npm's trusted publishing (OIDC, npm 11.5+).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=${1:?usage: scripts/publish-npm.sh DIST [--dry-run]}
dry=()
[ "${2:-}" = --dry-run ] && dry=(--dry-run)
version=$(bash "$root/scripts/version.sh")
bash "$root/scripts/version.sh" --check ${GITHUB_REF_NAME:+"$GITHUB_REF_NAME"}

tag=latest
case "$version" in *-*) tag=next ;; esac

if [ -n "${NPM_TOKEN:-}" ]; then
  registry=$(npm config get registry)
  userconfig=$(mktemp)
  trap 'rm -f "$userconfig"' EXIT
  # "//host/path/:_authToken=…" for the default registry, the token read from the environment.
  echo "${registry#*:}:_authToken=\${NPM_TOKEN}" | sed 's|/*:_authToken|/:_authToken|' > "$userconfig"
  export npm_config_userconfig=$userconfig
fi

for pkg in mlex-darwin-arm64 mlex-linux-x64-gnu mlex-linux-x64-gnu-cuda mlex; do
  tgz="$dist/$pkg-$version.tgz"
  [ -f "$tgz" ] || { echo "publish-npm: $tgz is missing" >&2; exit 1; }
  if [ "$(npm view "$pkg@$version" version 2>/dev/null || true)" = "$version" ]; then
    echo "publish-npm: $pkg@$version is published already; skipped" >&2
    continue
  fi
  npm publish "$tgz" --provenance --access public --tag "$tag" "${dry[@]}"
done
