#!/usr/bin/env python3
"""Speculative decoding side by side with plain decoding, in one run (BENCHMARKS.md).

Runs `mlex generate` once per mode per round, modes alternating, and prints each mode's decode
tok/s per round, the median, the ratio of medians to plain decoding, and its usage figures
(acceptance, tokens per pass, host ms per pass inside async_eval, dropped guesses). Every mode
must give the same text (greedy): a difference is reported.

  scripts/bench-speculative.py --mlex BIN --model DIR (--raw-prompt FILE | --messages FILE)
      [--draft-model DIR] [--rounds 3] [--max-tokens 200] [--mode NAME=FLAGS ...]

Default modes: plain, lookup (--prompt-lookup), lookup6 (6 drafts), lookup-nopipe (lookup with
MLEX_ABLATE_SPEC_PIPELINE=1), and with --draft-model: draft (3 drafts). Each run is a fresh
process; one warm-up run of each mode comes first (MLX compiles kernels for new shapes once per
machine).
"""
import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlex", required=True)
    ap.add_argument("--model", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw-prompt", help="a text file, sent as a raw prompt (no chat template)")
    src.add_argument("--messages", help="an OpenAI-style messages JSON file")
    ap.add_argument("--draft-model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--mode", action="append", default=[], help="NAME=FLAGS (env VAR=x allowed first)")
    a = ap.parse_args()

    modes = [m.split("=", 1) for m in a.mode] or [
        ["plain", ""],
        ["lookup", "--prompt-lookup"],
        ["lookup6", "--prompt-lookup --num-draft-tokens 6"],
        ["lookup-nopipe", "MLEX_ABLATE_SPEC_PIPELINE=1 --prompt-lookup"],
    ] + ([["draft", f"--draft-model {shlex.quote(a.draft_model)}"]] if a.draft_model else [])
    base = [a.mlex, "generate", "--model", a.model, "--json", "--ignore-eos"]
    if a.raw_prompt:
        base += ["--raw", "--prompt", open(a.raw_prompt).read()]
    else:
        base += ["--messages", a.messages]

    def run(flags, max_tokens):
        env, args = dict(os.environ), []
        for f in shlex.split(flags):
            if "=" in f and not f.startswith("-") and not args:
                k, v = f.split("=", 1)
                env[k] = v
            else:
                args.append(f)
        out = subprocess.run(base + ["--max-tokens", str(max_tokens)] + args, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"mlex failed ({flags}): {out.stderr[-2000:]}")
        return json.loads(out.stdout)

    for _, flags in modes:
        run(flags, 16)
    results = {name: [] for name, _ in modes}
    texts = {}
    for r in range(a.rounds):
        for name, flags in modes:
            d = run(flags, a.max_tokens)
            results[name].append(d["usage"])
            texts.setdefault(name, set()).add(hashlib.sha256(d["text"].encode()).hexdigest())
    plain = statistics.median(u["decode_tokens_per_second"] for u in results[modes[0][0]])
    print(f"| mode | decode tok/s per round | median | vs {modes[0][0]} | acceptance | tokens / pass | host ms / pass | dropped |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, _ in modes:
        us = results[name]
        tps = [u["decode_tokens_per_second"] for u in us]
        med = statistics.median(tps)
        print(f"| {name} | {', '.join(f'{x:.1f}' for x in tps)} | {med:.1f} | {med / plain:.2f}× | "
              f"{statistics.median(u['acceptance_rate'] for u in us):.3f} | {statistics.median(u['tokens_per_step'] for u in us):.2f} | "
              f"{statistics.median(u['submit_ms_per_step'] for u in us):.2f} | {statistics.median(u.get('dropped_passes', 0) for u in us):.0f} |")
    all_texts = set().union(*texts.values())
    print("same text in every run" if len(all_texts) == 1 else f"TEXTS DIFFER: {len(all_texts)} distinct replies")


if __name__ == "__main__":
    main()
