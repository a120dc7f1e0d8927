"""mlx-vlm's side of the Gemma 3 vision speed comparison (tests/vision.rs, ignored test
`bench_gemma3_tower_against_mlx_vlm`): the tower and projector at google/gemma-3-4b-it's widths.

Builds mlx-vlm 0.7.10's gemma3 VisionModel and Gemma3MultiModalProjector with gemma-3-4b's vision
config (27 layers, width 1152, MLP 4304, 16 heads, patch 14) at --size pixels a side (896 is the
real one; smaller sizes keep a CPU run short), random float32 weights, and times the vision part of
`Model.get_input_embeddings` on one image: --runs timed passes after one warm-up, each evaluated.
Writes config.json and model.safetensors (for mlex to load the same weights) and bench.json
({"size", "tokens", "ms": [...]}) into OUT_DIR.

    python tests/oracle/gemma3_vision_bench.py OUT_DIR [--size 224] [--runs 3]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402

from gemma3_vision import import_mlx_vlm_gemma3, random_parameters  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.size % 14 or (args.size // 14) % 4:
        sys.exit("--size must be a multiple of 56 (14-pixel patches pooled 4 x 4 ... to 16 a side at 896)")

    patches = args.size // 14
    tokens_side = patches // 4  # gemma-3's pooling kernel: 64 patches a side -> 16 tokens a side
    vision_cfg = {
        "model_type": "siglip_vision_model",
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "patch_size": 14,
        "image_size": args.size,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "vision_use_head": False,
    }
    text_cfg = {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 1, "intermediate_size": 64,
                "vocab_size": 64, "mm_tokens_per_image": tokens_side * tokens_side}

    vision, config, gemma3 = import_mlx_vlm_gemma3()
    vc = config.VisionConfig.from_dict(vision_cfg)
    tc = config.TextConfig.from_dict(text_cfg)
    mc = config.ModelConfig(text_config=tc, vision_config=vc, model_type="gemma3")
    mx.random.seed(0)
    tower = vision.VisionModel(vc)
    projector = gemma3.Gemma3MultiModalProjector(mc)
    weights = {}
    weights.update(random_parameters(tower, "vision_tower."))
    weights.update(random_parameters(projector, "multi_modal_projector."))

    pixels = mx.random.uniform(-1.0, 1.0, (1, 3, args.size, args.size), dtype=mx.float32)

    def encode():
        hidden, _, _ = tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
        out = projector(hidden)
        mx.eval(out)
        return out

    encode()
    ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        encode()
        ms.append((time.perf_counter() - t0) * 1e3)

    os.makedirs(args.out_dir, exist_ok=True)
    cfg = {"model_type": "gemma3", "mm_tokens_per_image": text_cfg["mm_tokens_per_image"],
           "text_config": text_cfg, "vision_config": vision_cfg}
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(os.path.join(args.out_dir, "pixels.safetensors"), {"pixel_values": pixels})
    with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
        json.dump({"size": args.size, "tokens": text_cfg["mm_tokens_per_image"], "ms": ms}, f)
    print(f"mlx-vlm gemma3 tower+projector, {args.size} px: " + ", ".join(f"{m:.1f}" for m in ms) + " ms")


if __name__ == "__main__":
    main()
