#!/usr/bin/env python3
"""mlx-lm's greedy continuation of given token ids on a real checkpoint (the oracle side of
tests/real_models.rs).

    python tests/oracle/real_model.py MODEL_DIR --tokens 1,2,3 --max-tokens 16 [--dtype float32]

Prints one JSON object: {"tokens", "logprobs", "margins", "model_type"}. The model is cast to
--dtype before running (mlex computes in float32 on the CPU; comparing in the same dtype keeps
rounding from deciding near-ties), so quantized weights keep their packing and only scales and
activations change dtype — as mlex's loader does.
"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    model, config = load_model(args.model)
    model.set_dtype(getattr(mx, args.dtype))
    prompt = mx.array([int(t) for t in args.tokens.split(",")], dtype=mx.uint32)
    tokens, logprobs, margins = [], [], []
    for tok, lp in generate_step(prompt, model, max_tokens=args.max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)):
        lp = lp.astype(mx.float32)
        hi, lo = sorted(mx.topk(lp, 2).tolist(), reverse=True)
        tokens.append(int(tok))
        logprobs.append(float(lp[tok].item()))
        margins.append(float(hi - lo))
    json.dump({"tokens": tokens, "logprobs": logprobs, "margins": margins,
               "model_type": config.get("model_type")}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
