#!/usr/bin/env python3
"""How far `--int8-activations` greedy output follows the float32 path (LoadOptions::int8_activations),
or, with `--variant`, any other flags (`--variant "--dtype float16"`: float16 compute, for scale).

For each prompt: both runs' greedy tokens (`mlex generate --json --top-logprobs 2`), the position
of the first token where they part, and the float run's margin there (log p of its top token minus
its second's): a parting at a small margin is a near-tie that any change of summation order can
flip; a large one would mean the 8-bit activations changed what the model says.

    scripts/int8-agreement.py --mlex BIN --model DIR [--max-tokens 128] [--variant "--int8-activations"]
"""
import argparse, json, subprocess

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "What are the three primary colors? Answer briefly.",
    "Give me a recipe for pancakes.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "List five uses of a paperclip.",
]

def run(a, prompt, variant):
    cmd = [a.mlex, "generate", "--model", a.model, "--device", "cpu", "--prompt", prompt,
           "--max-tokens", str(a.max_tokens), "--ignore-eos", "--json", "--top-logprobs", "2"]
    cmd += variant.split()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mlex", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--variant", default="--int8-activations", help="the flags compared with the plain run")
    a = p.parse_args()
    print(f"plain against {a.variant}")
    print("| prompt | tokens equal before parting | float run's margin there (nats) |")
    print("|---|---:|---:|")
    for prompt in PROMPTS:
        f, q = run(a, prompt, ""), run(a, prompt, a.variant)
        ft, qt = f["tokens"], q["tokens"]
        n = next((i for i, (x, y) in enumerate(zip(ft, qt)) if x != y), min(len(ft), len(qt)))
        if n < min(len(ft), len(qt)):
            top = f["top_logprobs"][n]
            margin = f"{top[0]['logprob'] - top[1]['logprob']:.3f}"
        else:
            margin = "– (no parting)"
        print(f"| {prompt[:40]} | {n} of {len(ft)} | {margin} |")

main()
