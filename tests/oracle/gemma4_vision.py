"""The oracle for mlex's Gemma 4 vision tower, its embedder and its image preprocessing: mlx-vlm's own.

Builds mlx-vlm 0.7.10's gemma4 VisionModel (patch embedder with 2-D position table, transformer
with 2-D multidimensional RoPE, position-wise average pooler) and MultimodalEmbedder
(`embed_vision`) on a tiny config, gives every parameter random float32 values, runs them on
random pixels of two different sizes (Gemma 4 takes images at their own aspect ratio: a
variable number of soft tokens per image), and runs mlx-vlm's Gemma4ImageProcessor (PIL BICUBIC
resize to the patch budget, rescale by 1/255) on random 8-bit images of odd sizes. Writes into
OUT_DIR:

    config.json        a gemma4 checkpoint's config.json (nested text_config / vision_config); the
                       vision config uses clipped linears and standardization, so both paths run
    model.safetensors  the parameters, named as mlx-vlm's gemma4 Model holds them after sanitize:
                       "vision_tower.patch_embedder.…", "vision_tower.encoder.layers.N.…"
                       (clippable linears as "….q_proj.linear.weight" plus scalar "….q_proj.input_min"
                       etc.), "vision_tower.std_bias" / "std_scale", "embed_vision.embedding_projection.weight"
    io.safetensors     pixels_a [1, 3, 24, 40] and pixels_b [1, 3, 32, 16] f32 (NCHW, in [0, 1] as the
                       processor gives them), tower_a [1, 15, 32] / tower_b [1, 8, 32] (VisionModel's
                       output: pooled, scaled by sqrt(hidden), standardized), features_a [1, 15, 48] /
                       features_b [1, 8, 48] (embed_vision's output: the rows that replace the image
                       tokens); image_K [h, w, 3] uint8 and processed_K [1, 3, H, W] f32 for each
                       preprocessing case K (the processor's pixel_values for that image), and for
                       the one case with normalisation normalize_K [6] (mean then std)

    python tests/oracle/gemma4_vision.py OUT_DIR [--seed N]

mlx-vlm is installed without its dependencies (scripts/setup-oracle.sh): its packages are stubbed
in sys.modules (import_mlx_vlm_gemma4), and gemma4/speculative_verifier.py, which pulls in
mlx_vlm.utils (requests, …), is replaced by a stub class the language model never calls here.

What mlx-vlm 0.7.10 does that a port might not:
- Pixels come in [0, 1] (the processor does not normalize) and the patch embedder maps them to
  2·(x − 0.5) before its bias-free input projection; patches are flattened (row, col, channel).
- Position embedding: a table [2, position_embedding_size, hidden]; a patch at column x, row y gets
  table[0][x] + table[1][y] (computed as a one-hot matmul: exact in float32).
- Attention: q/k RMSNorm with weight (float32 inside), v RMSNorm without weight, softmax scale 1,
  no mask when the image has no padding; RoPE is 2-D: the head is split in two halves, the first
  rotated by the column, the second by the row, each with rotate_half inside its own half and
  base rope_parameters.rope_theta (100 by default); frequencies base^(2i / (head_dim / 2)).
- Every norm of the blocks is plain RMSNorm (weight, not 1 + weight); MLP is
  down(gelu_approx(gate(x)) · up(x)); four norms per block as in the text model.
- With use_clipped_linears every linear clamps its input and output to scalar bounds stored in the
  checkpoint; without it, the sanitize drops those bounds.
- Pooler: k = pooling_kernel_size; each k×k block of patches averaged (weights 1/k² in float32),
  output ordered row-major over the pooled grid, then times sqrt(vision hidden); the image gives
  (H/p)·(W/p)/k² soft tokens. With standardize: (x − std_bias) · std_scale.
- embed_vision: RMSNorm without weight (eps vision rms_norm_eps), then a bias-free projection to
  the text width. The rows replace the image tokens in the SCALED text embeddings (they are not
  multiplied by sqrt(text hidden)).
- Preprocessing: target size from the patch budget max_soft_tokens·k² patches: factor
  sqrt(budget·p² / (h·w)), each side floored to a multiple of k·p (a side that floors to 0 becomes
  k·p and the other side floor(ratio)·k·p, capped); resized with PIL BICUBIC on the 8-bit image
  (skipped when the size already matches), then × 1/255 in float32.
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import types

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402


def import_mlx_vlm_gemma4():
    """mlx-vlm's gemma4 modules (vision, config, language, gemma4, processing_gemma4) without the
    package __init__ files and without speculative_verifier.py (stubbed)."""
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gemma4_vision: mlx-vlm is not installed (run scripts/setup-oracle.sh)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in [
        ("mlx_vlm", root),
        ("mlx_vlm.models", os.path.join(root, "models")),
        ("mlx_vlm.models.gemma4", os.path.join(root, "models", "gemma4")),
    ]:
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [path]
            mod.__package__ = name
            mod.__file__ = os.path.join(path, "__init__.py")
            sys.modules[name] = mod
    name = "mlx_vlm.models.gemma4.speculative_verifier"
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class Gemma4ExactSpeculativeVerifier:  # never called: no speculative decoding here
            def __call__(self, *a, **k):
                raise RuntimeError("speculative verification is stubbed out in the oracle")

        stub.Gemma4ExactSpeculativeVerifier = Gemma4ExactSpeculativeVerifier
        sys.modules[name] = stub
    mods = {m: importlib.import_module("mlx_vlm.models.gemma4." + m) for m in ["config", "vision", "language", "gemma4", "processing_gemma4"]}
    return mods


# 4-pixel patches, 2x2 pooling: images are multiples of 8 pixels a side.
VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "patch_size": 4,
    "position_embedding_size": 64,
    "pooling_kernel_size": 2,
    "default_output_length": 20,
    "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
    "use_clipped_linears": True,
    "standardize": True,
}

TEXT_HIDDEN = 48

# Preprocessing cases: (height, width, max_soft_tokens): upscales, downscales, elongated images,
# one already at its target size (no resize), one so narrow that a side floors to 0.
PREPROCESS_CASES = [
    (23, 37, 20),
    (144, 240, 20),
    (100, 61, 20),
    (301, 157, 20),
    (16, 200, 20),
    (333, 9, 20),
    (64, 64, 70),
    (1000, 700, 280),
    (50, 70, 20),  # with normalisation (NORMALIZED_CASE)
]

# The case processed with do_normalize (off in the checkpoints, but a processor config may turn it on).
NORMALIZED_CASE = (len(PREPROCESS_CASES) - 1, [0.4, 0.5, 0.6], [0.2, 0.3, 0.25])


def random_parameters(module, prefix):
    """A random float32 value for every parameter of `module` (sorted-name order), applied to it."""
    flat = sorted(tree_flatten(module.parameters()), key=lambda kv: kv[0])
    new = []
    for name, p in flat:
        noise = 0.1 * mx.random.normal(p.shape, dtype=mx.float32)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("input_min", "output_min"):
            value = -1.0 - mx.abs(noise) * 5  # clamps that bite now and then
        elif leaf in ("input_max", "output_max"):
            value = 1.0 + mx.abs(noise) * 5
        elif ("norm" in name and leaf == "weight") or leaf == "std_scale":
            value = 1.0 + noise
        elif leaf == "position_embedding_table":
            value = noise * 5
        else:
            value = noise
        new.append((name, value))
    module.update(tree_unflatten(new))
    mx.eval(module.parameters())
    return {prefix + n: v for n, v in new}


def build(mods, vision_config_dict, seed):
    cfg = mods["config"]
    vision_config = cfg.VisionConfig.from_dict(vision_config_dict)
    mx.random.seed(seed)
    tower = mods["vision"].VisionModel(vision_config)
    embedder = mods["gemma4"].MultimodalEmbedder(vision_config.hidden_size, TEXT_HIDDEN, eps=vision_config.rms_norm_eps)
    weights = {}
    weights.update(random_parameters(tower, "vision_tower."))
    weights.update(random_parameters(embedder, "embed_vision."))
    return tower, embedder, weights


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    mods = import_mlx_vlm_gemma4()
    tower, embedder, weights = build(mods, VISION_CONFIG, args.seed)

    io = {}
    for tag, (h, w) in {"a": (24, 40), "b": (32, 16)}.items():
        pixels = mx.random.uniform(0.0, 1.0, (1, 3, h, w), dtype=mx.float32)
        out = tower(pixels)
        feats = embedder(out)
        mx.eval(out, feats)
        n = (h // 4) * (w // 4) // 4
        assert out.shape == (1, n, 32) and feats.shape == (1, n, TEXT_HIDDEN), (out.shape, feats.shape)
        io[f"pixels_{tag}"] = pixels
        io[f"tower_{tag}"] = out
        io[f"features_{tag}"] = feats

    from PIL import Image

    rng = np.random.default_rng(args.seed)
    for k, (h, w, max_soft) in enumerate(PREPROCESS_CASES):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        # Smooth structure too (pure noise hides filter-tap errors less well than edges do).
        yy, xx = np.mgrid[0:h, 0:w]
        img[..., 0] = ((xx * 255) // max(w - 1, 1)).astype(np.uint8)
        extra = {}
        if k == NORMALIZED_CASE[0]:
            extra = {"do_normalize": True, "image_mean": NORMALIZED_CASE[1], "image_std": NORMALIZED_CASE[2]}
            io[f"normalize_{k}"] = mx.array(NORMALIZED_CASE[1] + NORMALIZED_CASE[2], dtype=mx.float32)
        proc = mods["processing_gemma4"].Gemma4ImageProcessor(patch_size=16, max_soft_tokens=max_soft, pooling_kernel_size=3, **extra)
        data, counts = proc.preprocess([Image.fromarray(img)])
        pv = np.asarray(data["pixel_values"], dtype=np.float32)
        assert pv.ndim == 4 and pv.shape[0] == 1, pv.shape
        assert counts[0] == (pv.shape[2] // 16) * (pv.shape[3] // 16) // 9
        io[f"image_{k}"] = mx.array(img)
        io[f"processed_{k}"] = mx.array(pv)
        io[f"max_soft_tokens_{k}"] = mx.array([max_soft], dtype=mx.int32)

    os.makedirs(args.out_dir, exist_ok=True)
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "image_token_id": 300,
        "boi_token_id": 301,
        "eoi_token_id": 302,
        "text_config": {"model_type": "gemma4_text", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 1,
                        "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                        "head_dim": 16, "global_head_dim": 16, "vocab_size": 320,
                        "vocab_size_per_layer_input": 320, "hidden_size_per_layer_input": 0,
                        "num_kv_shared_layers": 0},
        "vision_config": VISION_CONFIG,
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(os.path.join(args.out_dir, "io.safetensors"), io)
    print(f"gemma4_vision: seed {args.seed}: {len(weights)} tensors, {len(PREPROCESS_CASES)} preprocessing cases in {args.out_dir}")


if __name__ == "__main__":
    main()
