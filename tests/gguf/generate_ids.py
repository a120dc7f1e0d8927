#!/usr/bin/env python3
"""Greedy-generate from token ids with mlx-lm on a converted checkpoint directory.

Usage: python generate_ids.py DIR IDS N   (IDS comma-separated)
Prints one JSON object: {"tokens": [...], "logprobs": [...]} (the chosen tokens' log probabilities).
"""
import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step


def main():
    out_dir, ids, n = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
    model, _ = load(out_dir)
    tokens, logprobs = [], []
    for (tok, lp), _ in zip(generate_step(mx.array(ids), model, max_tokens=n), range(n)):
        tokens.append(int(tok))
        logprobs.append(float(lp[int(tok)].item()))
    print(json.dumps({"tokens": tokens, "logprobs": logprobs}))


if __name__ == "__main__":
    main()
