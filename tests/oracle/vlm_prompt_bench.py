"""mlx-vlm's side of the whole-prompt image speed comparison (tests/vlm_prompt_bench.rs): time to
first token and decode speed of one image prompt through mlx-vlm 0.7.10's whole model.

Why: issue 15 asks for image-prompt TTFT and decode side by side with mlx-vlm; the tower benches
(*_vision_bench.py) time only the vision part.

Builds mlx-vlm's whole model for --arch gemma3 | gemma4 | qwen3_5 (imported with the stubs of the
*_vlm.py oracles) at a CPU-sized shape (text: hidden 1024, 8 layers, MLP 2048, vocab 2048; tower: the
real model's widths, patch size and pooling, 2 blocks, and a smaller image than the real one;
BENCHMARKS.md tabulates them),
random float32 weights, and one 320 x 240 PNG. One run, timed as mlx-vlm's generate does the work:
  TTFT    PIL open + convert, the arch's image processor (Gemma 3: transformers'
          Gemma3ImageProcessorPil, which mlx-vlm's processor wraps; Gemma 4 / Qwen: mlx-vlm's own),
          `Model.get_input_embeddings`, the language model over the whole prompt with its own
          cache, argmax of the last logits read back;
  decode  --steps - 1 more greedy tokens, `language_model(y[None], cache=…)` each, pipelined as
          generate_step does it (the next step is async_eval'd before the current token is read).
mlx-vlm's generate/ar.py itself is not imported (its package pulls optional dependencies); the
calls above are the ones its generate_step makes. The prompt ids are built here as the byte-level
test tokenizer gives them (the processor's text expansion is string work, not timed).
One untimed warm-up run, then --runs timed runs. Writes into OUT_DIR config.json, the processor
config, model.safetensors, image.png and bench.json
({"arch", "bits", "dtype", "prompt_tokens", "image_tokens", "ttft_ms": [...], "decode_tps": [...],
"tokens": [...]}).

--dtype bfloat16 (default float32) casts the random weights as mlx-vlm's convert --dtype does (its
model's cast_predicate: Qwen3.5's A_log stays float32) before any quantization; the model then runs
in that dtype. So does mlex on a GPU, where its compute dtype follows the checkpoint's; on the CPU
mlex computes in float32, so bfloat16 is for GPU machines.
--bits 4 quantizes the model as `mlx_vlm.convert --quantize --q-bits 4` does by default, calling
mlx-vlm's own code: quant_utils.quantize_model (affine, groups of 64, every module with
`to_quantized` whose input width is a multiple of 64) with convert's base predicate
(utils.skip_multimodal_module: the vision tower and projector stay float; then the model's
quant_predicate, if any). So the language model's linears and embeddings (Gemma 4's per-layer
embedding too) are 4-bit. The checkpoint is then written with utils.save_weights and config.json
with utils.save_config, the "quantization" and "quantization_config" blocks as quantize_model
returns them. mlx_vlm.utils imports `requests` at its top (only for images at URLs); where the
venv lacks it an empty module stands in.

    python tests/oracle/vlm_prompt_bench.py OUT_DIR --arch gemma4 [--runs 3] [--steps 33] [--bits 4] [--dtype bfloat16]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

VOCAB = 2048
TEXT = b"look: ", b" what is it?"


def tame(weights, gemma=False):
    """The *_vlm.py oracles draw linear weights at 0.1 N for widths near 48; at width 1024 that
    makes every layer grow the residual ~3x and greedy decoding repeats one token. Every 2-D
    non-embedding weight wider than 64 is scaled by sqrt(64 / fan_in), in place in the dict; with
    `gemma` (whose text rows are multiplied by sqrt(hidden)) the token embeddings by
    sqrt(48 / hidden), else each token's own row dominates its tied logits and decoding repeats."""
    for name, w in weights.items():
        if gemma and name.endswith("model.embed_tokens.weight"):
            weights[name] = w * (48 / w.shape[-1]) ** 0.5
        elif w.ndim == 2 and w.shape[-1] > 64 and "norm" not in name and not any(
                k in name for k in ("embed_tokens", "position_embedding", "pos_embed")):
            weights[name] = w * (64 / w.shape[-1]) ** 0.5
    return weights


def gemma3():
    import gemma3_vlm as g3
    from gemma3_vision import import_mlx_vlm_gemma3
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    _, config_mod, gemma3 = import_mlx_vlm_gemma3()
    import mlx_vlm.models.gemma3.language as language

    text = {"model_type": "gemma3_text", "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": VOCAB,
            "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 2,  # sharp attention (real: 256): at 128 greedy decoding repeats
            "sliding_window": 512, "sliding_window_pattern": 6,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2,
            "rope_local_base_freq": 10000.0, "rope_global_base_freq": 1000000.0, "rope_theta": 1000000.0,
            "rope_scaling": None, "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh",
            "mm_tokens_per_image": 16}
    # SigLIP as gemma-3 has it (width 1152, MLP 4304, 16 heads, patch 14), 2 of 27 blocks, 224 px
    # (real: 896): 16 x 16 patches pooled 4 x 4 to 16 tokens (real: 256).
    vision = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
              "num_hidden_layers": 2, "num_attention_heads": 16, "patch_size": 14, "image_size": 224,
              "num_channels": 3, "layer_norm_eps": 1e-6, "vision_use_head": False}
    cfg = dict(g3.CONFIG, hidden_size=1024, mm_tokens_per_image=16, vocab_size=VOCAB, text_config=text, vision_config=vision)
    mc = g3.build_config(config_mod, json.loads(json.dumps(cfg)))
    model = gemma3.Model(mc)
    weights = tame(g3.random_parameters(model, language), gemma=True)
    loaded = gemma3.LanguageModel(mc.text_config).sanitize(dict(weights))
    model.load_weights(list(loaded.items()), strict=True)
    mx.eval(model.parameters())
    pp = {"do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
          "resample": 2, "rescale_factor": 1 / 255, "size": {"height": 224, "width": 224}}
    proc = Gemma3ImageProcessorPil(**pp)
    ids = [305] + list(TEXT[0]) + [10, 10, 301] + [300] * 16 + [302, 10, 10] + list(TEXT[1])

    def embed(path, input_ids):
        from PIL import Image

        with Image.open(path) as im:
            px = proc(images=im.convert("RGB"), return_tensors="np")["pixel_values"]
        emb = model.get_input_embeddings(input_ids, mx.array(px), mask=mx.ones_like(input_ids))
        return {"inputs_embeds": emb.inputs_embeds}

    return model, cfg, {"preprocessor_config.json": pp}, weights, ids, 16, embed


def gemma4():
    import gemma4_vlm as g4
    from gemma4_vision import import_mlx_vlm_gemma4

    mods = import_mlx_vlm_gemma4()
    cfg_mod = mods["config"]
    text = dict(g4.TEXT_CONFIG, hidden_size=1024, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=4,
                num_key_value_heads=1, head_dim=256, global_head_dim=512, vocab_size=VOCAB,
                vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=256, num_kv_shared_layers=4,
                sliding_window=512, max_position_embeddings=4096,
                layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2)
    # mlx-vlm's VisionConfig defaults (the E-series tower: width 768, MLP 3072, 12 heads of 64,
    # patch 16, 3 x 3 pooling), 2 of 16 blocks; the processor at 70 soft tokens (real: 280).
    vision = {"model_type": "gemma4_vision", "num_hidden_layers": 2}
    proc_cfg = {"patch_size": 16, "max_soft_tokens": 70, "pooling_kernel_size": 3}
    mc = cfg_mod.ModelConfig(text_config=cfg_mod.TextConfig.from_dict(text), vision_config=cfg_mod.VisionConfig.from_dict(vision),
                             image_token_id=g4.IMAGE_TOKEN, boi_token_id=g4.BOI, eoi_token_id=g4.EOI,
                             audio_token_id=g4.AUDIO_TOKEN, video_token_id=None, vocab_size=VOCAB, hidden_size=1024)
    model = mods["gemma4"].Model(mc)
    weights = tame(g4.random_parameters(model), gemma=True)
    model.load_weights(list(weights.items()))
    proc = mods["processing_gemma4"].Gemma4ImageProcessor(**proc_cfg)
    cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "image_token_id": g4.IMAGE_TOKEN,
           "boi_token_id": g4.BOI, "eoi_token_id": g4.EOI, "audio_token_id": g4.AUDIO_TOKEN, "vocab_size": VOCAB,
           "hidden_size": 1024, "tie_word_embeddings": True, "text_config": text, "vision_config": vision}
    from PIL import Image

    with Image.open(IMAGE) as im:
        n = proc.preprocess([im.convert("RGB")])[1][0]
    ids = [g4.BOS] + list(TEXT[0]) + [g4.BOI] + [g4.IMAGE_TOKEN] * n + [g4.EOI] + list(TEXT[1])

    def embed(path, input_ids):
        with Image.open(path) as im:
            data, _ = proc.preprocess([im.convert("RGB")])
        emb = model.get_input_embeddings(input_ids=input_ids, pixel_values=mx.array(np.asarray(data["pixel_values"], dtype=np.float32)))
        return {"inputs_embeds": emb.inputs_embeds, "per_layer_inputs": emb.per_layer_inputs}

    files = {"processor_config.json": {"image_processor": dict(proc_cfg, image_processor_type="Gemma4ImageProcessor")}}
    return model, cfg, files, weights, ids, n, embed


def qwen3_5():
    import qwen3_5_vlm as q

    mods = q.import_mlx_vlm_qwen3_5()
    text = dict(q.TEXT_CONFIG, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=2, head_dim=256, linear_num_value_heads=16, linear_num_key_heads=16,
                linear_key_head_dim=128, linear_value_head_dim=128, full_attention_interval=4, vocab_size=VOCAB,
                max_position_embeddings=4096,
                rope_parameters={"type": "default", "mrope_section": [11, 11, 10], "rope_theta": 10000000.0,
                                 "partial_rotary_factor": 0.25, "mrope_interleaved": True})
    # The Qwen3.5 tower's geometry (width 1024, MLP 4096, 16 heads, patch 16, 2 x 2 merge, 48 x 48
    # position table), 2 of its blocks; the processor's real min/max pixels.
    vision = dict(q.VISION_CONFIG, depth=2, hidden_size=1024, intermediate_size=4096, out_hidden_size=1024, num_heads=16,
                  patch_size=16, num_position_embeddings=2304)
    pp = dict(q.PROCESSOR, patch_size=16, min_pixels=65536, max_pixels=16777216)
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "image_token_id": q.IMAGE_PAD,
           "video_token_id": q.VIDEO_PAD, "vision_start_token_id": q.VISION_START, "vision_end_token_id": q.VISION_END,
           "eos_token_id": q.EOS, "vocab_size": VOCAB, "tie_word_embeddings": False, "text_config": text, "vision_config": vision}
    model = mods["qwen3_5"].Model(mods["config"].ModelConfig.from_dict(json.loads(json.dumps(cfg))))
    weights = tame(q.random_parameters(model))
    model.load_weights(list(weights.items()))
    proc = mods["processing"].Qwen3VLImageProcessor(**pp)
    from PIL import Image

    def process(path):
        with Image.open(path) as im:
            out = proc([im.convert("RGB")])
        return mx.array(np.asarray(out["pixel_values"], dtype=np.float32)), mx.array(np.asarray(out["image_grid_thw"], dtype=np.int32))

    _, grid = process(IMAGE)
    n = int(np.prod(grid.tolist()[0])) // 4
    ids = list(TEXT[0]) + [q.VISION_START] + [q.IMAGE_PAD] * n + [q.VISION_END] + list(TEXT[1])

    def embed(path, input_ids):
        px, g = process(path)
        emb = model.get_input_embeddings(input_ids=input_ids, pixel_values=px, image_grid_thw=g)
        model.language_model._position_ids = None
        model.language_model._rope_deltas = None
        return {"inputs_embeds": emb.inputs_embeds, "position_ids": emb.position_ids, "rope_deltas": emb.rope_deltas}

    files = {"preprocessor_config.json": dict(pp, image_processor_type="Qwen2VLImageProcessor")}
    return model, cfg, files, weights, ids, n, embed


def convert(model, cfg, out_dir, bits, dtype):
    """What `mlx_vlm.convert` does after loading (its dtype cast, then quantize_model with its base
    predicate) and how it writes (save_weights, save_config), through mlx-vlm's own functions."""
    import importlib
    import importlib.util
    import types

    if importlib.util.find_spec("requests") is None:
        sys.modules.setdefault("requests", types.ModuleType("requests"))
    from mlx.utils import tree_flatten, tree_map_with_path

    utils = importlib.import_module("mlx_vlm.utils")  # the arch's import set up the mlx_vlm stub package
    quant_utils = importlib.import_module("mlx_vlm.quant_utils")
    config = json.loads(json.dumps(cfg))
    if dtype != "float32":
        cast = getattr(model, "cast_predicate", lambda _: True)
        to = getattr(mx, dtype)
        model.update(tree_map_with_path(
            lambda k, v: v.astype(to) if cast(k) and mx.issubdtype(v.dtype, mx.floating) else v, model.parameters()))
    if bits is not None:
        model_predicate = getattr(model, "quant_predicate", None)

        def base_quant_predicate(path, module):  # convert's, verbatim in behaviour
            if utils.skip_multimodal_module(path):
                return False
            if model_predicate is not None:
                return model_predicate(path, module)
            return True

        config.setdefault("vision_config", {})
        model, config = quant_utils.quantize_model(model, config, 64, bits, mode="affine",
                                                   quant_predicate=base_quant_predicate)
        names = [k for k, _ in tree_flatten(model.parameters()) if k.endswith(".scales")]
        assert names and not any(utils.skip_multimodal_module(k) for k in names), names
    mx.eval(model.parameters())
    utils.save_weights(out_dir, model)
    utils.save_config(config, config_path=os.path.join(out_dir, "config.json"))


def run(model, embed, ids, steps):
    """One image prompt: (ttft seconds, decode tok/s over the tokens after the first, tokens)."""
    t0 = time.perf_counter()
    input_ids = mx.array([ids], dtype=mx.int32)
    kw = embed(IMAGE, input_ids)
    lm = model.language_model
    cache = lm.make_cache()
    y = mx.argmax(lm(input_ids, cache=cache, **kw).logits[0, -1])
    tokens = [y.item()]
    t1 = time.perf_counter()
    nxt = mx.argmax(lm(y.reshape(1, 1), cache=cache).logits[0, -1])
    mx.async_eval(nxt)
    while len(tokens) < steps:
        y = nxt
        if len(tokens) + 1 < steps:
            nxt = mx.argmax(lm(y.reshape(1, 1), cache=cache).logits[0, -1])
            mx.async_eval(nxt)
        tokens.append(y.item())
    t2 = time.perf_counter()
    return t1 - t0, (steps - 1) / (t2 - t1), tokens


def main():
    global IMAGE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=["gemma3", "gemma4", "qwen3_5"], required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=33)
    ap.add_argument("--bits", type=int, choices=[4], default=None, help="quantize as mlx-vlm's convert does")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    from PIL import Image

    os.makedirs(args.out_dir, exist_ok=True)
    IMAGE = os.path.join(args.out_dir, "image.png")
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320]
    img = np.stack([(xx * 3) % 256, (yy * 5 + xx) % 256, rng.integers(0, 256, (240, 320))], axis=-1).astype(np.uint8)
    Image.fromarray(img).save(IMAGE)

    mx.random.seed(0)
    model, cfg, files, weights, ids, n, embed = {"gemma3": gemma3, "gemma4": gemma4, "qwen3_5": qwen3_5}[args.arch]()
    for name, value in files.items():
        with open(os.path.join(args.out_dir, name), "w") as f:
            json.dump(value, f, indent=2)
    if args.bits is None and args.dtype == "float32":
        with open(os.path.join(args.out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    else:
        del weights
        convert(model, cfg, args.out_dir, args.bits, args.dtype)

    _, _, tokens = run(model, embed, ids, args.steps)  # warm-up
    ttft, tps = [], []
    for _ in range(args.runs):
        t, d, again = run(model, embed, ids, args.steps)
        assert again == tokens, (again, tokens)
        ttft.append(t * 1e3)
        tps.append(d)
    with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
        json.dump({"arch": args.arch, "bits": args.bits, "dtype": args.dtype, "prompt_tokens": len(ids), "image_tokens": n, "ttft_ms": ttft, "decode_tps": tps,
                   "tokens": tokens}, f)
    print(f"mlx-vlm {args.arch} ({args.dtype}{f', {args.bits}-bit' if args.bits else ''}): {len(ids)} prompt tokens ({n} image), TTFT " + ", ".join(f"{t:.0f}" for t in ttft)
          + " ms, decode " + ", ".join(f"{d:.1f}" for d in tps) + f" tok/s; tokens {tokens}")


if __name__ == "__main__":
    main()
