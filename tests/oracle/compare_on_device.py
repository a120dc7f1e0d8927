"""Conformance on whatever device MLX runs on here (e.g. the CUDA GPU): for every oracle fixture
case, greedy tokens and logprobs of mlx-lm's generate_step and of `mlex generate --json`, both on
this machine's default device, side by side.

  python tests/oracle/compare_on_device.py FIXTURES_DIR MLEX_BINARY

Prints a markdown table; exits 1 when a case diverges where mlx-lm's top-2 margin exceeds 1e-3 or
logprobs differ beyond the tolerance (1e-3 float32, 2e-2 otherwise). GPU kernels round
differently from the CPU ones the fixtures were recorded with, so both sides are recomputed here."""
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model


def mlxlm_greedy(case_dir, prompt, n):
    model, _ = load_model(Path(case_dir))
    toks, lps, margins = [], [], []
    for tok, lp in generate_step(mx.array(prompt), model, max_tokens=n):
        top2 = mx.sort(lp)[-2:].tolist()
        toks.append(int(tok))
        lps.append(float(lp[tok].item()))
        margins.append(top2[1] - top2[0])
    return toks, lps, margins


def main():
    fixtures, binary = Path(sys.argv[1]), sys.argv[2]
    index = json.loads((fixtures / "index.json").read_text())
    ok = True
    print(f"device: {mx.default_device()}")
    print("| case | dtype | steps agreeing | max Δlogprob | result |\n|---|---|---|---|---|")
    for name in sorted(c["name"] for c in index["cases"]):
        d = fixtures / name
        exp = json.loads((d / "expected.json").read_text())
        prompt, n, dtype = exp["prompt"], len(exp["tokens"]), exp["dtype"]
        try:
            toks, lps, margins = mlxlm_greedy(d, prompt, n)
        except Exception as e:  # an op MLX lacks on this device for mlx-lm's graph: say so, run ours
            toks, oracle_error = None, str(e).splitlines()[0][:120]
        out = subprocess.run([binary, "generate", "--model", str(d), "--prompt-tokens", ",".join(map(str, prompt)),
                              "--max-tokens", str(n), "--ignore-eos", "--json", "--dtype", dtype],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"| {name} | {dtype} | – | – | error: {out.stderr.strip()} |")
            ok = False
            continue
        ours = json.loads(out.stdout)
        if toks is None:
            print(f"| {name} | {dtype} | – | – | mlx-lm fails here ({oracle_error}); mlex ran {len(ours['tokens'])} tokens |")
            continue
        tol = 1e-3 if dtype == "float32" else 2e-2
        agree, worst, verdict = 0, 0.0, "pass"
        for i, (a, b) in enumerate(zip(toks, ours["tokens"])):
            if a != b:
                if margins[i] > 1e-3:
                    verdict = f"FAIL: token differs at step {i} (margin {margins[i]:.2e})"
                    ok = False
                break
            agree += 1
            theirs_lp, ours_lp = lps[i], ours["logprobs"][i]
            if ours_lp is None:  # NaN serialises as null
                verdict = f"FAIL: our logprob is NaN at step {i}"
                ok = False
                break
            worst = max(worst, abs(theirs_lp - ours_lp))
        if verdict == "pass" and worst > tol:
            verdict = f"FAIL: |Δlogprob| {worst:.2e} > {tol}"
            ok = False
        print(f"| {name} | {dtype} | {agree}/{n} | {worst:.2e} | {verdict} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
