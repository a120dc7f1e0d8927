#!/usr/bin/env bash
# CI's fuzz smoke (issue 16): every cargo-fuzz target of fuzz/ runs FUZZ_SECONDS (default 40)
# from its seed corpus (fuzz/corpus/<target>/); a crash, a hang past FUZZ_TIMEOUT seconds on one
# input (default 10) or an allocation past 2 GB fails the run. The long runs behind the counts in
# fuzz/README.md use the same targets.
#
# Needs the nightly toolchain (installed with rustup when missing) and cargo-fuzz (installed with
# `cargo install cargo-fuzz --locked` when missing: about 2 minutes). Without sanitizer (-s none):
# the fuzzed code is safe Rust, and an uninstrumented build runs several times more inputs.
# What the fuzzer finds goes to a temporary directory, never into fuzz/corpus/; a crashing input
# is kept as fuzz/artifacts/<target>/ (git-ignored) and printed in base64.
#   scripts/fuzz-smoke.sh                 # every target
#   scripts/fuzz-smoke.sh gguf config     # some
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${FUZZ_SECONDS:-40}
timeout_s=${FUZZ_TIMEOUT:-10}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "== installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  start=$SECONDS
  cargo install cargo-fuzz --locked
  echo "cargo-fuzz installed in $((SECONDS - start)) s"
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build -s none 2>&1 | tail -n 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "artifacts/$t"
  echo "== fuzz $t (${seconds} s)"
  seeds=("corpus/$t")
  # The real chat templates of the test assets, when fetched, seed chat_template as they are.
  templates=${MLEX_TEST_ASSETS:-${MLEX_CACHE_DIR:-$HOME/.cache/mlex}/test-assets}/llama.cpp-templates
  if [ "$t" = chat_template ] && [ -d "$templates" ]; then seeds+=("$templates"); fi
  # Every target, chat_template included (its renders run under the value budget of
  # src/tokenizer/template_budget.rs), fails on a crash, a hang or an allocation past 2 GB.
  if cargo +nightly fuzz run -s none "$t" "$work/$t" "${seeds[@]}" -- \
      -max_total_time="$seconds" -timeout="$timeout_s" -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
      >"$work/$t.log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|Done)|oom/timeout/crash' "$work/$t.log" | tail -n 2 || true
  else
    tail -n 40 "$work/$t.log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz smoke: crash in ${failed[*]} (inputs in fuzz/artifacts/)"
  exit 1
fi
echo "fuzz smoke: ${#targets[@]} targets, no crash"
