"""The oracle for mlex's whole Gemma 3 vision-language model: mlx-vlm's own greedy decode on tiny weights.

Builds mlx-vlm 0.7.10's full gemma3 `Model` (SigLIP vision tower, multimodal projector, Gemma 3
language model) on a tiny config, gives every parameter random float32 values, and greedy-decodes
32 tokens for a prompt holding one image the way mlx-vlm's generate_step (generate/ar.py) drives the
model: `Model.get_input_embeddings(input_ids, pixel_values, mask)`, the language model's own cache
(`LanguageModel.make_cache()`, which cache.make_prompt_cache defers to), the prompt prefilled with
`language_model(input_ids, inputs_embeds=…, cache=…)`, then one token at a time
`language_model(y[None], cache=…)` with argmax on the last position's logits (no stop at eos).
Writes into OUT_DIR:

    config.json        a gemma3 checkpoint's config.json (nested text_config / vision_config; the
                       text RoPE base written both as mlx-vlm's rope_global_base_freq and as
                       Hugging Face's rope_theta)
    model.safetensors  the parameters, named as mlx-vlm's Model holds them after its loader's
                       sanitize passes: "language_model.model.…", "vision_tower.vision_model.…",
                       "multi_modal_projector.…" (the patch embedding's conv weight in MLX layout
                       [out, kh, kw, in]); no "language_model.lm_head.weight": the head is tied
                       (LanguageModel.sanitize copies embed_tokens into it at load)
    io.safetensors     pixel_values [1, 3, 32, 32] f32 (NCHW), input_ids [1, 30] int32 (bos 2, four
                       text tokens, 16 image tokens 300, ten text tokens), embeds [1, 30, 48] f32
                       (get_input_embeddings' inputs_embeds, as handed to the language model, i.e.
                       before it multiplies them by sqrt(hidden)), logits0 [320] f32 (the last
                       prompt position's logits), step_logits [32, 320] f32 (the logits each greedy
                       token was taken from; row 0 is logits0), tokens [32] int32 (the greedy tokens)

    python tests/oracle/gemma3_vlm.py OUT_DIR [--seed N]

mlx-vlm is installed without its dependencies (scripts/setup-oracle.sh): its modules are imported
with gemma3_vision.py's import_mlx_vlm_gemma3 (stub packages in sys.modules, no package __init__).

What mlx-vlm 0.7.10 does that a port might not (besides the vision quirks in gemma3_vision.py):
- Image features are divided by sqrt of the TOP-LEVEL ModelConfig.hidden_size (a field real gemma3
  configs do not carry, so it is its default 2048 for them), not the text hidden size; here the
  top-level hidden_size is written as 48, the text hidden size. The division is in float32, exact
  sqrt.
- The language model then multiplies ALL input embeddings (text and image rows alike, prompt and
  decoded tokens alike) by sqrt(text hidden_size) rounded to bfloat16 and cast back
  (sqrt(48) = 6.9282… -> 6.9375), so image features are not restored exactly. That multiply is an
  in-place `h *= …` on the very array passed as inputs_embeds (this script copies embeds first).
- In the prompt, text positions hold embed_tokens rows, image-token positions (300) the scaled
  image features in order, and positions holding pad_token_id (0) zeros (decoded tokens are looked
  up normally, 0 included).
- Attention over the prompt is CAUSAL everywhere, image tokens included (Hugging Face's Gemma 3
  makes the image tokens attend bidirectionally to each other). generate passes the 4D
  attention_mask_4d that get_input_embeddings returns as an unknown keyword, which the language
  model ignores; masks come from the caches. (Model.__call__, which generate does not use, passes
  that all-ones integer mask as an ADDITIVE mask: no causality and no sliding window at all.)
- Layer i is global iff i % sliding_window_pattern == pattern - 1 (here layer 0 sliding, layer 1
  global). Sliding layers: RoPE base rope_local_base_freq, RotatingKVCache(max_size=sliding_window,
  keep=0); prompt mask key j visible to query i iff i - sliding_window < j <= i (window of
  sliding_window keys including itself); decoding attends (unmasked) to the <= sliding_window keys
  the rotating cache holds, the current one included. Global layers: RoPE base
  rope_global_base_freq (rope_scaling applies only there), KVCache, plain causal.
- RoPE is non-traditional (halves rotated; nn.RoPE), position = cache offset. q_norm / k_norm
  (RMSNorm over head_dim, eps rms_norm_eps) come before RoPE; the attention scale is
  query_pre_attn_scalar^-0.5; GQA by repeating kv heads.
- Every RMSNorm scales by (1 + weight); the MLP is down(gelu_tanh(gate(x)) * up(x)); the block is
  h = x + post_attention_layernorm(attn(input_layernorm(x))),
  out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))); float16 residual
  clipping does nothing in float32; no attention or final logit softcapping.
- The LM head is a separate Linear filled from embed_tokens by sanitize (tied). Weights here are
  0.1 N except the token embeddings, 0.03 N (see EMBED_SCALE: at 0.1 greedy decoding repeats).
- generate_step's default prefill is chunked: all but the last prompt position in one call whose
  logits are dropped, then the last position alone. This script prefills in one call (as the Rust
  side should) and checks that the chunked way gives the same tokens.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from gemma3_vision import VISION_CONFIG, import_mlx_vlm_gemma3  # noqa: E402

IMAGE_TOKEN = 300
TOKENS_PER_IMAGE = 16
STEPS = 32

TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 48,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 320,
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 16,
    "sliding_window": 8,
    "sliding_window_pattern": 2,
    # Hugging Face's Gemma3TextConfig derives layer_types from sliding_window_pattern when absent;
    # written out for readers that only know layer_types. mlx-vlm ignores it.
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_local_base_freq": 10000.0,
    # mlx-vlm's TextConfig field; Hugging Face's is rope_theta. Both, the same.
    "rope_global_base_freq": 1000000.0,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "max_position_embeddings": 512,
    "hidden_activation": "gelu_pytorch_tanh",
    "mm_tokens_per_image": TOKENS_PER_IMAGE,
}

# The vision side is gemma3_vision.py's (8x8 = 64 patches, pooled 2x2 to 16 tokens).
VISION_CONFIG = dict(VISION_CONFIG)

CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "image_token_index": IMAGE_TOKEN,
    # mlx-vlm divides the image features by sqrt(this), default 2048: set to the text hidden size.
    "hidden_size": TEXT_CONFIG["hidden_size"],
    "mm_tokens_per_image": TOKENS_PER_IMAGE,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": [1],
    "vocab_size": TEXT_CONFIG["vocab_size"],
    "text_config": TEXT_CONFIG,
    "vision_config": VISION_CONFIG,
}

# The token embeddings (tied to the LM head) are drawn at 0.03, not 0.1: at 0.1 the embedding's own
# row dominates the final hidden state's match against the tied head, and greedy decoding repeats
# one token (seed 0: 128 then 230 thirty-one times). At 0.03 seed 0 decodes 11 distinct tokens with
# every step's top-2 logit gap >= 2.8e-3.
EMBED_SCALE = 0.03

PROMPT = [2, 10, 11, 12] + [IMAGE_TOKEN] * TOKENS_PER_IMAGE + [13, 14, 15, 16, 17, 18, 19, 20, 21, 22]


def build_config(config_mod, cfg):
    """The config objects as mlx_vlm.utils.load_model builds them: ModelConfig.from_dict on the
    whole dict, then update_module_configs replaces text_config / vision_config by their own
    dataclasses' from_dict."""
    model_config = config_mod.ModelConfig.from_dict(cfg)
    model_config.text_config = config_mod.TextConfig.from_dict(cfg["text_config"])
    model_config.vision_config = config_mod.VisionConfig.from_dict(cfg["vision_config"])
    return model_config


def random_parameters(model, language):
    """A random float32 value for every parameter of `model` but the tied LM head, drawn in
    sorted-name order (so the values depend only on the seed), as a flat {name: array} dict.
    nn.LayerNorm weights 1 + 0.1 N, Gemma RMSNorm weights (used as 1 + w) 0.1 N, the token
    embeddings EMBED_SCALE N, everything else (linear / conv weights, biases, the vision position
    embedding, the projector matrix) 0.1 N."""
    kinds = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            kinds[path] = "layernorm"
        elif isinstance(module, language.RMSNorm):
            kinds[path] = "rmsnorm"
    flat = sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0])
    new = {}
    for name, p in flat:
        if name == "language_model.lm_head.weight":
            continue
        scale = EMBED_SCALE if name == "language_model.model.embed_tokens.weight" else 0.1
        noise = scale * mx.random.normal(p.shape, dtype=mx.float32)
        parent, leaf = name.rsplit(".", 1)
        if kinds.get(parent) == "layernorm" and leaf == "weight":
            new[name] = 1.0 + noise
        else:
            new[name] = noise
    return new


def greedy(model, input_ids, inputs_embeds, chunked):
    """generate_step's greedy loop. chunked: its default prefill (all but the last prompt position
    first, logits dropped), else the whole prompt in one call."""
    lm = model.language_model
    cache = lm.make_cache()
    if chunked:
        n = input_ids.shape[1] - 1
        lm(input_ids[:, :n], inputs_embeds=inputs_embeds[:, :n], cache=cache)
        mx.eval([c.state for c in cache])
        input_ids, inputs_embeds = input_ids[:, n:], inputs_embeds[:, n:]
    out = lm(input_ids, inputs_embeds=inputs_embeds, cache=cache)
    logits = out.logits[:, -1, :]
    y = mx.argmax(logits, axis=-1)
    tokens, step_logits = [y], [logits]
    for _ in range(STEPS - 1):
        logits = lm(y[None], cache=cache).logits[:, -1, :]
        y = mx.argmax(logits, axis=-1)
        mx.eval(y)
        tokens.append(y)
        step_logits.append(logits)
    tokens = mx.concatenate(tokens).astype(mx.int32)
    step_logits = mx.concatenate(step_logits, axis=0)
    mx.eval(tokens, step_logits)
    return tokens, step_logits, cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    _, config_mod, gemma3 = import_mlx_vlm_gemma3()
    import mlx_vlm.models.gemma3.language as language
    from mlx_vlm.models.cache import KVCache, RotatingKVCache

    cfg = json.loads(json.dumps(CONFIG))
    model_config = build_config(config_mod, cfg)
    assert model_config.hidden_size == 48 and model_config.image_token_index == IMAGE_TOKEN
    tc = model_config.text_config
    assert (tc.rope_global_base_freq, tc.rope_local_base_freq, tc.sliding_window_pattern) == (1e6, 1e4, 2)

    mx.random.seed(args.seed)
    model = gemma3.Model(model_config)
    weights = random_parameters(model, language)

    # mlx_vlm.utils.load_model's sanitize passes: Model has none; VisionModel's keeps an MLX-layout
    # conv weight as is; LanguageModel's adds the tied head.
    assert not hasattr(model, "sanitize")
    loaded = gemma3.VisionModel(model_config.vision_config).sanitize(dict(weights))
    loaded = gemma3.LanguageModel(model_config.text_config).sanitize(loaded)
    assert set(loaded) == set(weights) | {"language_model.lm_head.weight"}
    assert all(mx.array_equal(loaded[k], weights[k]).item() for k in weights)
    model.load_weights(list(loaded.items()), strict=True)
    mx.eval(model.parameters())
    params = dict(tree_flatten(model.parameters()))
    assert set(params) == set(loaded) and all(v.dtype == mx.float32 for v in params.values())

    pixel_values = mx.random.uniform(-1.0, 1.0, (1, 3, 32, 32), dtype=mx.float32)
    input_ids = mx.array([PROMPT], dtype=mx.int32)
    assert input_ids.shape == (1, 30)

    emb = model.get_input_embeddings(input_ids, pixel_values, mask=mx.ones_like(input_ids))
    mx.eval(emb.inputs_embeds)
    # The language model scales inputs_embeds in place (h *= …): keep a copy of what it is given.
    embeds = mx.array(np.array(emb.inputs_embeds))
    assert embeds.shape == (1, 30, 48) and embeds.dtype == mx.float32, embeds

    tokens, step_logits, cache = greedy(model, input_ids, mx.array(np.array(embeds)), chunked=False)
    assert [type(c) for c in cache] == [RotatingKVCache, KVCache], cache
    logits0 = step_logits[0]
    chunked_tokens, chunked_logits, _ = greedy(model, input_ids, mx.array(np.array(embeds)), chunked=True)
    assert mx.array_equal(tokens, chunked_tokens).item(), (tokens, chunked_tokens)
    chunked_diff = mx.abs(chunked_logits - step_logits).max().item()

    ids = tokens.tolist()
    if len(set(ids)) < 4:
        sys.exit(f"gemma3_vlm: seed {args.seed}: greedy tokens {ids} barely vary: the weights need rescaling")
    top2 = mx.sort(step_logits, axis=-1)[:, -2:]
    min_gap = (top2[:, 1] - top2[:, 0]).min().item()

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(
        os.path.join(args.out_dir, "io.safetensors"),
        {
            "pixel_values": pixel_values,
            "input_ids": input_ids,
            "embeds": embeds,
            "logits0": logits0,
            "step_logits": step_logits,
            "tokens": tokens,
        },
    )
    print(
        f"gemma3_vlm: seed {args.seed}: {len(weights)} tensors; tokens {ids} ({len(set(ids))} distinct, "
        f"top-2 logit gap >= {min_gap:.3g}; chunked prefill: same tokens, logits within {chunked_diff:.3g}) "
        f"in {args.out_dir}"
    )


if __name__ == "__main__":
    main()
