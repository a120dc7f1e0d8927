#!/usr/bin/env bash
# mlex against llama.cpp on the same model, alternating engines round by round in one command:
# prefill (pp) and decode (tg) tok/s of `llama-bench` on a GGUF and of `mlex bench` on the
# checkpoint `mlex convert` made from that GGUF; prints the medians and the ratios.
#
#   scripts/bench-vs-llama-cpp.sh --gguf FILE.gguf --model DIR [--prompt-len 256 --gen 32 --rounds 3 --threads N]
#                                 [--int8-activations]
# --int8-activations: mlex a second time per round with LoadOptions::int8_activations (8-bit
# activations in integer dot products, llama.cpp's own arithmetic), reported on a row of its own.
#
# llama-bench comes from the llama-cpp-python sdist (no network beyond the package registry):
#   pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d /tmp/lcpp
#   tar xzf /tmp/lcpp/llama_cpp_python-*.tar.gz -C /tmp/lcpp && cd /tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp
#   pip install cmake ninja   # if the machine has none
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && ninja -C build llama-bench
# On a VM whose CPU reports AMX but does not let processes use it (llama-bench dies with SIGILL at
# `tilezero`), configure without the native probe instead:
#   -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
#   -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
# Env: LLAMA_BENCH (path to llama-bench; required), MLEX (binary, default the release build).
# llama.cpp's threads spin while they wait: on a machine where anything else runs, its figures
# collapse (4 tok/s decode instead of 190 on the 2-core CI machine during a build). Measure on an
# idle machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${MLEX:-}" ]; then
  MLEX=$here/../target/x86_64-unknown-linux-gnu/release/mlex
  [ -x "$MLEX" ] || MLEX=$here/../target/release/mlex
fi
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary (see the header of this script)}"
gguf=""; model=""; pl=256; gen=32; rounds=3; threads=$(nproc); int8=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gguf) gguf=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --prompt-len) pl=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --int8-activations) int8=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$gguf" ] && [ -n "$model" ] || { echo "--gguf FILE and --model DIR are required" >&2; exit 2; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
for _ in $(seq 1 "$rounds"); do
  "$LLAMA_BENCH" -m "$gguf" -p "$pl" -n "$gen" -t "$threads" -r 1 -o jsonl 2>/dev/null | sed 's/^/L /' >> "$out"
  "$MLEX" bench --model "$model" --prompt-len "$pl" --gen "$gen" --runs 1 --json --device cpu 2>/dev/null | grep '^{' | sed 's/^/M /' >> "$out"
  if [ "$int8" = 1 ]; then
    "$MLEX" bench --model "$model" --prompt-len "$pl" --gen "$gen" --runs 1 --json --device cpu --int8-activations 2>/dev/null | grep '^{' | sed 's/^/I /' >> "$out"
  fi
done
python3 - "$out" "$gguf" "$model" "$pl" "$gen" "$rounds" "$threads" <<'PY'
import json, statistics, sys
path, gguf, model, pl, gen, rounds, threads = sys.argv[1:]
lpp, ltg, mpp, mtg, ipp, itg = [], [], [], [], [], []
kind = ""
for line in open(path):
    tag, body = line[:1], json.loads(line[2:])
    if tag == "L":
        kind = f"{body.get('model_type', '')}"
        (lpp if body["n_prompt"] else ltg).append(body["avg_ts"])
    elif tag == "M":
        mpp.append(body["prefill_tok_s"]); mtg.append(body["decode_tok_s"])
    else:
        ipp.append(body["prefill_tok_s"]); itg.append(body["decode_tok_s"])
med = statistics.median
print(f"mlex {model} vs llama.cpp {gguf} ({kind}), prompt {pl}, gen {gen}, {rounds} rounds alternating, {threads} threads")
print("| figure | mlex | llama.cpp | mlex vs llama.cpp |")
print("|---|---:|---:|---:|")
print(f"| prefill tok/s | {med(mpp):.1f} | {med(lpp):.1f} | {med(mpp) / med(lpp):.2f}× |")
print(f"| decode tok/s | {med(mtg):.1f} | {med(ltg):.1f} | {med(mtg) / med(ltg):.2f}× |")
if itg:
    print(f"| prefill tok/s, mlex --int8-activations | {med(ipp):.1f} | {med(lpp):.1f} | {med(ipp) / med(lpp):.2f}× |")
    print(f"| decode tok/s, mlex --int8-activations | {med(itg):.1f} | {med(ltg):.1f} | {med(itg) / med(ltg):.2f}× |")
PY
