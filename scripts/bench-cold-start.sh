#!/usr/bin/env bash
# Cold start, launch to first token: `mlex generate --max-tokens 1` against
# `python -m mlx_lm generate --max-tokens 1` on the same model and prompt, a new process each run,
# engines alternating run by run so both see the same machine state; prints the medians, the
# ratio, and mlex's phases (MLEX_TRACE_STARTUP=1) as medians.
#
#   scripts/bench-cold-start.sh --model DIR [--prompt TEXT] [--rounds 5] [--device cpu|gpu]
#
# "Cold" is a new process: the model's files stay in the OS page cache and MLX's kernel caches stay
# warm, as on any second launch (one untimed run of each engine first fills them).
# Env: MLEX (binary, default target/<host triple>/release/mlex, else target/release/mlex),
# MLEX_BASE (a second mlex binary, e.g. a build from before a change: timed too, alternating),
# PYTHON (with mlx + mlx-lm; default the oracle venv), BENCH_RAW (a file the per-run JSON lines
# are appended to). --device cpu runs mlx-lm with MLX's default device set to the CPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${MLEX:-}" ]; then
  MLEX=$here/../target/x86_64-unknown-linux-gnu/release/mlex
  [ -x "$MLEX" ] || MLEX=$here/../target/release/mlex
fi
PYTHON=${PYTHON:-${MLEX_ORACLE_VENV:-$here/../.venv-oracle}/bin/python}
model=""; prompt="What is the capital of France?"; rounds=5; device=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "--model DIR is required" >&2; exit 2; }
python3 - "$MLEX" "${MLEX_BASE:-}" "$PYTHON" "$model" "$prompt" "$rounds" "$device" "${BENCH_RAW:-}" <<'PY'
import json, os, re, statistics, subprocess, sys, time

mlex, base, python, model, prompt, rounds, device, raw = sys.argv[1:]
rounds = int(rounds)
# mlx-lm's CLI has no device flag: set MLX's default device, then run its module as `-m` would.
mlxlm_main = (
    "import sys, runpy, mlx.core as mx\n"
    f"mx.set_default_device(mx.{device})\n"
    "sys.argv = ['mlx_lm.generate'] + sys.argv[1:]\n"
    "runpy.run_module('mlx_lm', run_name='__main__')\n"
)
engines = {"mlex": [mlex, "generate", "--model", model, "--prompt", prompt, "--max-tokens", "1", "--device", device]}
if base:
    engines["mlex (base)"] = [base] + engines["mlex"][1:]
engines["mlx-lm"] = [python, "-c", mlxlm_main, "generate", "--model", model, "--prompt", prompt, "--max-tokens", "1"]

def run(name, argv):
    env = dict(os.environ, MLEX_TRACE_STARTUP="1")
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.read(1)  # mlex streams the token as it comes; mlx-lm prints a header first
    t1 = time.perf_counter()
    out, err = p.communicate()
    t2 = time.perf_counter()
    if p.returncode != 0:
        sys.exit(f"{name} failed ({p.returncode}):\n{err.decode(errors='replace')[-2000:]}")
    text = (first + out).decode(errors="replace")
    phases = {m.group(2): float(m.group(1)) for m in re.finditer(r"^\[startup\]\s+([\d.]+) ms\s+\+\s*[\d.]+ ms\s+(.*?) \([^()]*\)$", err.decode(errors="replace"), re.M)}
    return {"engine": name, "exit_ms": 1e3 * (t2 - t0), "first_byte_ms": 1e3 * (t1 - t0), "phases": phases, "text": text.strip()[:80]}

for name, argv in engines.items():  # untimed: page cache, MLX's kernel caches
    run(name, argv)
results = []
for r in range(rounds):
    for name, argv in engines.items():
        res = run(name, argv)
        res["round"] = r + 1
        results.append(res)
        print(f"round {r + 1} {name}: {res['exit_ms']:.0f} ms", file=sys.stderr)
if raw:
    with open(raw, "a") as f:
        for res in results:
            f.write(json.dumps(res) + "\n")

med = lambda xs: statistics.median(xs) if xs else float("nan")
load = os.getloadavg()
print(f"cold start, {rounds} rounds alternating, device {device}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
print(f"model {model}, prompt {prompt!r}, --max-tokens 1")
print()
print("| engine | launch → exit, median (min–max) | launch → first stdout byte, median |")
print("|---|---|---|")
for name in engines:
    rs = [x for x in results if x["engine"] == name]
    ex = [x["exit_ms"] for x in rs]
    print(f"| {name} | {med(ex):.0f} ms ({min(ex):.0f}–{max(ex):.0f}) | {med([x['first_byte_ms'] for x in rs]):.0f} ms |")
mlxlm = med([x["exit_ms"] for x in results if x["engine"] == "mlx-lm"])
for name in engines:
    if name != "mlx-lm":
        print(f"\nmlx-lm / {name}: {mlxlm / med([x['exit_ms'] for x in results if x['engine'] == name]):.1f}x")
for name in engines:
    if name == "mlx-lm":
        continue
    rs = [x for x in results if x["engine"] == name]
    names = list(dict.fromkeys(n for x in rs for n in x["phases"]))
    print(f"\n{name} phases (MLEX_TRACE_STARTUP=1; ms since main, medians):")
    for n in names:
        print(f"  {med([x['phases'][n] for x in rs if n in x['phases']]):7.1f}  {n}")
PY
