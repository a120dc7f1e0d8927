#!/usr/bin/env python3
"""Build the conformance fixtures with mlx-lm (the oracle).

    python tests/oracle/make_fixtures.py OUT_DIR [--family NAME] [--only CASE,CASE...]

Families: "core" (llama, qwen2, qwen3: the cases below) and one module per architecture family
in tests/oracle/archs/<name>.py, whose `cases()` returns case dicts {"name", "config" (a full
mlx-lm config dict), "variant" (a key of VARIANTS), optional "dtype", "prompt_len",
"prefill_step_size", "max_tokens", "generate" (more keyword arguments of generate_step, e.g. the
KV cache options: recorded as "generate_options")} and may define `peaky(path, param, profile, key)` for weights the
shared rules below do not cover (routers, sinks), `before_save` and `after_save` (see build_case). Each family is generated into its own folder.

For every case: a tiny random model built by mlx-lm itself from a config dict, cast to its dtype,
quantized with mlx-lm's own `quantize_model` (so config.json carries the `quantization` block
exactly as mlx-lm writes it, per-layer overrides included), saved with `save_model`/`save_config`,
then *reloaded from disk* with mlx-lm's loader and run greedily through `generate_step`. The
expected output therefore describes the files, not the in-memory model that wrote them.

Writes
    OUT_DIR/<case>/                 the MLX checkpoint + tokenizer.json + tokenizer_config.json
    OUT_DIR/<case>/expected.json    {"prompt", "tokens", "logprobs", "margins", "dtype", ...}
    OUT_DIR/index.json              the case list, with a few facts about each case
    OUT_DIR/tokenizer_checks.json   encode/decode/chat-template vectors for the shared tokenizer

Deterministic: every random draw comes from a per-case seed; no wall-clock, no environment.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

# ---------------------------------------------------------------------------------------------
# Shared constants

MAX_TOKENS = 32
# Ids of the special tokens at the top of the vocabulary (see build_tokenizer).
VOCAB_SIZE = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = VOCAB_SIZE - 3, VOCAB_SIZE - 2, VOCAB_SIZE - 1
# A fixed 12-token prompt of ordinary (non-special) ids.
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
# Scales that make the random models' next-token distributions peaky (clear top-2 margins)
# while keeping logit magnitudes moderate, so bf16's rounding of the logprobs stays small.
# Weight gains per base dtype: (QK: q/k projection gain -> sharper, position-dependent attention;
# HEAD: target logit std over the vocabulary; RESID: o_proj/down_proj gain -> layers outweigh the
# embedding, so the model does not just echo its input token).
# f32 models can be sensitive (rich, context-dependent outputs): f32 rounding stays far below the
# tolerance. bf16 models are made peaky but gentle: the chosen token's logprob stays near 0 where
# bf16 represents it finely, and rounding differences are not amplified much.
PROFILES = {
    "float32": {"qk": 6.0, "head": 1.5, "resid": 3.0},
    "bfloat16": {"qk": 2.0, "head": 3.0, "resid": 2.0},
}
NORM_JITTER = 0.1

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ---------------------------------------------------------------------------------------------
# Tokenizer: a byte-level BPE whose vocabulary is exactly VOCAB_SIZE
# (256 byte tokens, merges learnt here from a fixed corpus, 3 special tokens at the top).

CORPUS = """
The capital of France is Paris. The quick brown fox jumps over the lazy dog.
Hello, world! Hello there, how are you today? I am fine, thank you.
def main():
    print("hello world")
    return 0
In the beginning there was the word, and the word was with the machine.
<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>
The model answers questions, writes code and calls tools when it is asked to.
"""


def bytes_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable-character map of byte-level BPE (GPT-2 convention)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def learn_merges(n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training on CORPUS; ties broken by the pair's text, so the result is fixed."""
    b2u = bytes_to_unicode()
    # Roughly the GPT-2 pre-tokenizer split: words keep their leading space.
    pieces = re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", CORPUS)
    words: dict[tuple[str, ...], int] = {}
    for p in pieces:
        w = tuple(b2u[b] for b in p.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        joined = best[0] + best[1]
        new_words: dict[tuple[str, ...], int] = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def build_tokenizer() -> tuple[dict, dict]:
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    n_merges = VOCAB_SIZE - 256 - len(SPECIALS)
    merges = learn_merges(n_merges)
    assert len(merges) == n_merges, "corpus too small for the merges wanted"
    for a, b in merges:
        vocab[a + b] = len(vocab)
    assert len(vocab) == VOCAB_SIZE - len(SPECIALS)
    added = []
    for i, tok in enumerate(SPECIALS):
        tid = VOCAB_SIZE - len(SPECIALS) + i
        vocab[tok] = tid
        added.append(
            {
                "id": tid,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added
        },
        "bos_token": None,
        "chat_template": CHATML,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 256,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    return tokenizer, tokenizer_config


# ---------------------------------------------------------------------------------------------
# Models

def base_config(arch: str, wide: bool) -> dict:
    """Tiny configs of real shape conventions. `wide` doubles the width for group size 128."""
    hidden = 128 if wide else 64
    common = {
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 256,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
    }
    if arch == "llama":
        return {
            **common,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "head_dim": hidden // 4,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        }
    if arch == "qwen2":
        # qwen2 always has q/k/v biases (built into the architecture).
        return {
            **common,
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        }
    if arch == "qwen3":
        # head_dim deliberately != hidden / heads, as in the real Qwen3 family.
        return {
            **common,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "head_dim": hidden // 2,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        }
    raise ValueError(arch)


# Quantization variants: (group_size, bits) or None, plus the float dtype the model is cast to
# before quantizing (the dtype of scales/biases and of the activations).
VARIANTS = {
    "f32": {"dtype": "float32", "quant": None},
    "bf16": {"dtype": "bfloat16", "quant": None},
    "q4g64": {"dtype": "bfloat16", "quant": (64, 4)},
    "q8g32": {"dtype": "float32", "quant": (32, 8)},
    "q3g128": {"dtype": "bfloat16", "quant": (128, 3)},
    "mixed": {"dtype": "float32", "quant": (64, 4), "mixed": True},
    # MLX's float formats (scales are E8M0/E4M3 bytes; activations in the given dtype).
    "mxfp4": {"dtype": "bfloat16", "quant": (32, 4), "mode": "mxfp4"},
    "mxfp8": {"dtype": "float32", "quant": (32, 8), "mode": "mxfp8"},
    "nvfp4": {"dtype": "bfloat16", "quant": (16, 4), "mode": "nvfp4"},
}


def long_prompt(n: int) -> list[int]:
    """A fixed prompt of n ordinary ids (PROMPT repeated with a drift, so it is not periodic)."""
    return [(PROMPT[i % len(PROMPT)] + 7 * (i // len(PROMPT))) % (VOCAB_SIZE - len(SPECIALS)) for i in range(n)]


def mixed_predicate(arch: str, cfg: dict):
    """Per-layer overrides in mlx-lm's convention: a dict for a layer quantized differently from
    the default, `False` for a layer kept float."""
    def predicate(path: str, module: nn.Module):
        if path == "model.embed_tokens":
            return {"group_size": 32, "bits": 8, "mode": "affine"}
        if path == "lm_head":
            return False
        if path == "model.layers.0.self_attn.v_proj":
            return {"group_size": 32, "bits": 6, "mode": "affine"}
        if path == "model.layers.1.mlp.down_proj":
            return {"group_size": 64, "bits": 2, "mode": "affine"} if arch == "llama" else False
        if path == "model.layers.1.mlp.up_proj" and arch != "llama":
            return {"group_size": 32, "bits": 5, "mode": "affine"}
        return True
    return predicate


def case_list() -> list[dict]:
    cases = []
    for arch in ("llama", "qwen2", "qwen3"):
        for variant in VARIANTS:
            cases.append({"name": f"{arch}_{variant}", "arch": arch, "variant": variant, "overrides": {}})
    extra = [
        ("llama_rope_llama3_f32", "llama", "f32", {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        }),
        ("llama_rope_linear_f32", "llama", "f32", {"rope_scaling": {"type": "linear", "factor": 4.0}}),
        # Dynamic NTK changes the base once the sequence passes max_position_embeddings (12 + 32 > 16).
        ("llama_rope_dynamic_f32", "llama", "f32", {
            "rope_scaling": {"type": "dynamic", "factor": 2.0},
            "max_position_embeddings": 16,
        }),
        ("llama_rope_yarn_f32", "llama", "f32", {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 32,
                "beta_slow": 1,
            },
        }),
        ("llama_tied_f32", "llama", "f32", {"tie_word_embeddings": True}),
        ("llama_tied_q4g64", "llama", "q4g64", {"tie_word_embeddings": True}),
        ("mistral_f32", "llama", "f32", {
            "model_type": "mistral",
            "architectures": ["MistralForCausalLM"],
            "rope_theta": 1000000.0,
            "sliding_window": None,
        }),
        ("qwen2_q4g64_f32", "qwen2", "q4g64", {}, "float32"),
    ]
    for name, arch, variant, overrides, *dtype in extra:
        c = {"name": name, "arch": arch, "variant": variant, "overrides": overrides}
        if dtype:
            c["dtype"] = dtype[0]
        cases.append(c)
    return cases


def model_module(model_type: str):
    from mlx_lm.utils import MODEL_REMAPPING
    return importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")


def make_peaky(model: nn.Module, seed: int, prof: dict, family_hook=None) -> None:
    """Rescale the random init: a larger output projection for clear top-2 margins, and norm
    weights jittered around 1 so an engine that ignores them cannot pass."""
    key = mx.random.key(seed)

    def fix(path: str, p: mx.array) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        if family_hook is not None:
            special = family_hook(path, p, prof, sub)
            if special is not None:
                return special
        if path.endswith(("q_norm.weight", "k_norm.weight")):
            return prof["qk"] * (1.0 + NORM_JITTER * mx.random.normal(p.shape, key=sub))
        if path.endswith("norm.weight"):
            return 1.0 + NORM_JITTER * mx.random.normal(p.shape, key=sub)
        if path.endswith(("q_proj.weight", "k_proj.weight")):
            return p * prof["qk"]
        if path.endswith(("o_proj.weight", "down_proj.weight")):
            # Tied models feed the (scaled) output matrix in as the embedding: keep the layers'
            # share of the residual stream the same by scaling their outputs along with it.
            return p * prof["resid"] * (prof["head"] if tied else 1.0)
        if path == "lm_head.weight" or (path == "model.embed_tokens.weight" and tied):
            # After the final norm the hidden state has unit RMS: rows of norm prof["head"] give
            # logits of std ~prof["head"].
            return p * (prof["head"] / mx.sqrt(mx.mean(p * p) * p.shape[-1]))
        return p

    tied = "lm_head" not in model and "lm_head" not in model.get("language_model", {})
    model.update(tree_map_with_path(fix, model.parameters()))
    mx.eval(model.parameters())


def build_case(case: dict, out: Path, seed: int, family=None) -> dict:
    """Builds, saves and returns facts of one case. `family` (the case's module of archs/, None
    for the core cases) may define `peaky` (weight rescaling), `before_save(name, model)` (changes
    to the model's tensors before they are written: towers to discard, a dropped tied head) and
    `after_save(case, out)` (rewrites of the saved files: another checkpoint layout). A case with
    `"keep_nulls": True` builds and writes its config's `null` values as they are; otherwise nulls
    are dropped so mlx-lm's defaults apply."""
    hook = lambda name: getattr(family, name, None)
    variant = VARIANTS[case["variant"]]
    dtype_name = case.get("dtype", variant["dtype"])
    quant = variant["quant"]
    wide = quant is not None and quant[0] == 128
    if "config" in case:
        cfg = dict(case["config"])
    else:
        cfg = base_config(case["arch"], wide)
        cfg.update(case["overrides"])
    if not case.get("keep_nulls"):
        cfg = {k: v for k, v in cfg.items() if v is not None}

    mod = model_module(cfg["model_type"])
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    make_peaky(model, seed + 1, PROFILES[dtype_name], hook("peaky"))
    model.set_dtype(getattr(mx, dtype_name))

    config = dict(cfg)
    if quant is not None:
        group_size, bits = quant
        pred = mixed_predicate(case["arch"], cfg) if variant.get("mixed") else None
        model, config = quantize_model(model, config, group_size, bits, mode=variant.get("mode", "affine"),
                                       quant_predicate=pred)
        if variant.get("mixed"):
            # mlx-lm's quantize_model records dict overrides only; layers kept float get an
            # explicit `false` (the convention mlx-lm's loader honours, as mixed checkpoints use).
            for path, module in model.named_modules():
                if path and pred(path, module) is False and hasattr(module, "to_quantized"):
                    config["quantization"][path] = False
            config["quantization_config"] = config["quantization"]

    if out.exists():
        shutil.rmtree(out)
    if hook("before_save"):
        hook("before_save")(case["name"], model)
    save_model(out, model)
    save_config(config, config_path=out / "config.json")
    if hook("after_save"):
        hook("after_save")(case, out)
    return {"dtype": dtype_name, "quantization": config.get("quantization")}


def teacher_forced(path: Path, prompt: list[int], tokens: list[int], logprobs: list[float]) -> tuple[float, list[float]]:
    """One cache-free forward pass over prompt + generated tokens, in the model's own dtype.

    Returns (max |Δ logprob| against generate_step's cached token-by-token decode, and the chosen
    tokens' logprobs computed from the same logits but with the log-softmax in float32). mlx-lm
    takes the log-softmax in the model dtype: for bf16 its logsumexp is rounded to a bf16 step at
    the magnitude of the largest logit (0.03-0.06 here). An engine that upcasts the logits first
    is just as right, so the conformance test accepts either value."""
    model, _ = load_model(path)
    seq = mx.array(prompt + tokens, dtype=mx.uint32)[None]
    logits = model(seq)[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    idx = mx.array(tokens)[:, None]
    lp_native = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32)
    logits32 = logits.astype(mx.float32)
    lp_f32 = logits32 - mx.logsumexp(logits32, axis=-1, keepdims=True)
    native = mx.take_along_axis(lp_native, idx, axis=-1)[:, 0].tolist()
    upcast = mx.take_along_axis(lp_f32, idx, axis=-1)[:, 0].tolist()
    return max(abs(a - b) for a, b in zip(native, logprobs)), upcast


def run_oracle(path: Path, prompt_ids: list[int], max_tokens: int, prefill_step_size: int,
               dtype_override=None, gen_opts=None) -> dict:
    model, _ = load_model(path)
    if dtype_override is not None:
        model.set_dtype(dtype_override)
    prompt = mx.array(prompt_ids, dtype=mx.uint32)
    tokens, logprobs, margins, stats = [], [], [], []
    for tok, lp in generate_step(prompt, model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1),
                                 prefill_step_size=prefill_step_size, **(gen_opts or {})):
        lp = lp.astype(mx.float32)
        top2 = mx.topk(lp, 2)
        mx.eval(top2)
        hi, lo = sorted(top2.tolist(), reverse=True)
        tokens.append(int(tok))
        logprobs.append(float(lp[tok].item()))
        stats.append(float(mx.sqrt(mx.var(lp)).item()))
        margins.append(float(hi - lo))
    return {"tokens": tokens, "logprobs": logprobs, "margins": margins,
            "logit_std": sum(stats) / len(stats)}


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tokenizer_checks(out: Path, case_dir: Path) -> dict:
    """Reference encodings of the shared tokenizer, from the `tokenizers` library and from
    transformers' chat template rendering (what mlx-lm itself uses)."""
    checks = {"encode": [], "chat": []}
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return checks
    tok = Tokenizer.from_file(str(case_dir / "tokenizer.json"))
    for text in ["Hello, world!", "The capital of France is Paris.", "  two  spaces\nnewline\ttab",
                 "naïve café – 日本", "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == text, (text, back)
        checks["encode"].append({"text": text, "ids": ids})
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(case_dir))
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Hello, world!"}]
        rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(rendered, add_special_tokens=False).ids
        checks["chat"].append({"messages": messages, "add_generation_prompt": True,
                               "rendered": rendered, "ids": ids})
    except Exception as e:  # transformers is optional for the fixtures' purpose
        print(f"make_fixtures: chat-template check skipped: {e}", file=sys.stderr)
    return checks


def family_cases(family: str):
    """The cases of `family` and its module (None for the core family: no hooks)."""
    if family == "core":
        return case_list(), None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    mod = importlib.import_module(f"archs.{family}")
    return mod.cases(), mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--family", default="core", help="core, or a module name under tests/oracle/archs/")
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)

    tokenizer, tokenizer_config = build_tokenizer()
    only = {s for s in args.only.split(",") if s}
    all_cases, family = family_cases(args.family)
    cases = [c for c in all_cases if not only or c["name"] in only]
    index = {"generator": "tests/oracle/make_fixtures.py", "family": args.family, "max_tokens": MAX_TOKENS, "cases": []}
    for case in cases:
        t0 = time.time()
        name = case["name"]
        # A per-case seed derived from the name: adding a case never changes the others.
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
        case_dir = out / name
        facts = build_case(case, case_dir, seed, family)
        (case_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1))
        (case_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False, indent=2))

        prompt = long_prompt(case["prompt_len"]) if "prompt_len" in case else PROMPT
        max_tokens = case.get("max_tokens", MAX_TOKENS)
        # mlx-lm's default prefill chunk is 2048; a case may make it small to cross chunk borders.
        step = case.get("prefill_step_size", 2048)
        gen_opts = case.get("generate") or {}
        ref = run_oracle(case_dir, prompt, max_tokens, step, gen_opts=gen_opts)
        logit_std = ref.pop("logit_std")
        # How far the oracle's own low-precision logprobs sit from the same files run in f32:
        # a sanity check that the tolerance used for this case is realistic.
        precision_noise = 0.0
        if facts["dtype"] != "float32":
            hi = run_oracle(case_dir, prompt, max_tokens, step, mx.float32, gen_opts=gen_opts)
            hi.pop("logit_std")
            for a, b, la, lb in zip(ref["tokens"], hi["tokens"], ref["logprobs"], hi["logprobs"]):
                if a != b:
                    break
                precision_noise = max(precision_noise, abs(la - lb))
        if gen_opts:
            # The cache options change what each step attends to: there is no cache-free reference.
            impl_noise, lp_f32_head = 0.0, list(ref["logprobs"])
        else:
            impl_noise, lp_f32_head = teacher_forced(case_dir, prompt, ref["tokens"], ref["logprobs"])
        head_rounding = max(abs(a - b) for a, b in zip(lp_f32_head, ref["logprobs"]))
        quant = facts["quantization"]
        expected = {
            "prompt": prompt,
            **ref,
            "dtype": facts["dtype"],
            # Same logits, log-softmax taken in float32 (equal to "logprobs" up to f32 rounding
            # for float32 models).
            "logprobs_f32_head": lp_f32_head,
            "quantized": quant is not None,
            "quant_mode": (quant or {}).get("mode", "affine") if quant is not None else None,
            "model_type": json.loads((case_dir / "config.json").read_text())["model_type"],
            "max_tokens": max_tokens,
            "prefill_step_size": step,
            "generate_options": gen_opts,
            "oracle": "mlx-lm generate_step, greedy (argmax), reloaded from these files",
        }
        (case_dir / "expected.json").write_text(json.dumps(expected, indent=1))
        clear = sum(m > 1e-3 for m in ref["margins"]) / len(ref["margins"])
        entry = {
            "name": name,
            "model_type": expected["model_type"],
            "dtype": facts["dtype"],
            "quantized": expected["quantized"],
            "min_margin": min(ref["margins"]),
            "clear_margin_fraction": clear,
            "distinct_tokens": len(set(ref["tokens"])),
            "logit_std": logit_std,
            "min_chosen_logprob": min(ref["logprobs"]),
            "lowp_vs_f32_max_dlogprob": precision_noise,
            "cached_vs_full_max_dlogprob": impl_noise,
            "head_rounding_max_dlogprob": head_rounding,
            "bytes": dir_size(case_dir),
        }
        index["cases"].append(entry)
        print(f"{name:24s} {facts['dtype']:9s} clear={clear:.2f} min_margin={entry['min_margin']:.4f} "
              f"distinct={entry['distinct_tokens']:2d} vs_f32={precision_noise:.4f} "
              f"cached_vs_full={impl_noise:.1e} head_rounding={head_rounding:.4f} "
              f"{entry['bytes'] / 1024:.0f}KiB {time.time() - t0:.1f}s", file=sys.stderr)

    if cases:
        (out / "tokenizer_checks.json").write_text(
            json.dumps(tokenizer_checks(out, out / cases[0]["name"]), ensure_ascii=False, indent=1))
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
