#!/usr/bin/env bash
# Side-by-side speed of mlex and mlx-lm on the same model, alternating engines run by run in one
# command so both see the same machine state; prints a table with mlex/mlx-lm ratios.
#
#   scripts/bench-side-by-side.sh --shape qwen3-0.6b --bits 4 [--prompt-len 512 --gen 256 --rounds 3]
#   scripts/bench-side-by-side.sh --model DIR [...]
#   ... --concurrency N: N requests at once (mlx-lm through its BatchGenerator)
#   --warmup N: untimed runs of each engine first (default 1; 0 on a CPU where every run is slow)
#
# Env: MLEX (binary, default target/release/mlex), PYTHON (with mlx + mlx-lm; default the oracle
# venv), MLEX_ARGS / MLXLM_ARGS (extra flags for one side only, e.g. MLXLM_ARGS="--dtype f32"),
# BENCH_RAW (a file the per-run JSON lines of both engines are appended to).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
MLEX=${MLEX:-$here/../target/release/mlex}
PYTHON=${PYTHON:-${MLEX_ORACLE_VENV:-$here/../.venv-oracle}/bin/python}
rounds=3; warmup=1; args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
out=$(mktemp); trap 'rm -f "$out"' EXIT
# Untimed first runs: on a fresh GPU machine MLX JIT-compiles kernels for each new shape on first
# use (and caches them on disk), which would otherwise land in whichever engine runs first.
for _ in $(seq 1 "$warmup"); do
  "$MLEX" bench "${args[@]}" ${MLEX_ARGS:-} --runs 1 --json > /dev/null
  "$PYTHON" "$here/mlxlm_bench.py" "${args[@]}" ${MLXLM_ARGS:-} --runs 1 > /dev/null
done
for r in $(seq 1 "$rounds"); do
  "$MLEX" bench "${args[@]}" ${MLEX_ARGS:-} --runs 1 --json >> "$out"
  "$PYTHON" "$here/mlxlm_bench.py" "${args[@]}" ${MLXLM_ARGS:-} --runs 1 >> "$out"
done
if [ -n "${BENCH_RAW:-}" ]; then cat "$out" >> "$BENCH_RAW"; fi
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["engine"], []).append(r)
keys = [("prefill_tok_s", "prefill tok/s", True), ("ttft_ms", "TTFT ms", False),
        ("decode_tok_s", "decode tok/s", True), ("peak_gib", "peak GiB", False)]
if "aggregate_tok_s" in rows[0]:  # --concurrency N
    keys = [("aggregate_tok_s", "aggregate tok/s", True), ("per_stream_decode_tok_s", "per-stream decode tok/s", True),
            ("ttft_p50_ms", "TTFT p50 ms", False), ("ttft_p95_ms", "TTFT p95 ms", False)]
med = {e: {k: statistics.median(r[k] for r in rs) for k, _, _ in keys} for e, rs in by.items()}
m, o = med.get("mlex"), med.get("mlx-lm")
print(f"model: {rows[0]['model']}  bits: {rows[0]['bits']}  device: mlex={by['mlex'][0]['device']} mlx-lm={by['mlx-lm'][0]['device']}"
      f"  rounds: {len(by['mlex'])} (medians)")
print("| figure | mlex | mlx-lm | mlex vs mlx-lm |")
print("|---|---|---|---|")
for k, name, higher_better in keys:
    ratio = (m[k] / o[k]) if higher_better else (o[k] / m[k] if m[k] else float("nan"))
    print(f"| {name} | {m[k]:g} | {o[k]:g} | {ratio:.2f}× {'less' if k == 'peak_gib' else 'faster'} |")
PY
