#!/usr/bin/env bash
# Every side-by-side table of BENCHMARKS.md for the machine it runs on, in one command.
#
#   scripts/bench-all.sh            # GPU machine: six 4-bit shapes (incl. Gemma 3 and a MoE) + op census; CPU: SmolLM2 shape
#
# Same environment as scripts/bench-side-by-side.sh (MLEX, PYTHON; on the GPU machine also
# LD_LIBRARY_PATH/PYTHONPATH pointing at the staged CUDA wheel, see BENCHMARKS.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
MLEX=${MLEX:-$here/../target/release/mlex}
PYTHON=${PYTHON:-${MLEX_ORACLE_VENV:-$here/../.venv-oracle}/bin/python}
export MLEX PYTHON
device=$("$PYTHON" -c "import mlx.core as mx; print('gpu' if mx.is_available(mx.gpu) else 'cpu')")
echo "device: $device, $(date -u +%Y-%m-%dT%H:%MZ), MLX $("$PYTHON" -c 'import mlx.core as mx; print(mx.__version__)')"
if [ "$device" = gpu ]; then
  for s in qwen3-0.6b qwen2.5-7b; do   # operations one decode step builds
    "$MLEX" bench --shape "$s" --bits 4 --graph
    "$PYTHON" "$here/mlxlm_bench.py" --shape "$s" --bits 4 --graph
  done
  for s in qwen3-0.6b smollm2-135m; do
    "$here/bench-side-by-side.sh" --shape "$s" --bits 4 --prompt-len 512 --gen 256 --rounds 5
  done
  for s in llama-3.2-3b qwen2.5-7b gemma3-1b qwen3-30b-a3b; do
    "$here/bench-side-by-side.sh" --shape "$s" --bits 4 --prompt-len 512 --gen 256 --rounds 3
  done
else
  "$here/bench-side-by-side.sh" --shape smollm2-135m --bits 4 --prompt-len 64 --gen 16 --rounds 1 --warmup 0
fi
