"""mlx-vlm's side of the Gemma 4 vision speed comparison (tests/vision_gemma4.rs, ignored test
`bench_gemma4_tower_against_mlx_vlm`): the vision encoder and embedder at mlx-vlm's default widths
(its VisionConfig defaults: 16 layers, width 768, MLP 3072, 12 heads of 64, 16-pixel patches,
3 x 3 pooling, as the E-series Gemma 4 checkpoints have them; text width 1536).

Builds mlx-vlm 0.7.10's gemma4 VisionModel and MultimodalEmbedder with random float32 weights and
times `Model.encode_image`'s work (tower, then embed_vision) on one --size x --size image (a
multiple of 48; 336 gives 441 patches, 49 soft tokens): --runs timed passes after one warm-up,
each evaluated. Writes config.json and model.safetensors (for mlex to load the same weights),
pixels.safetensors and bench.json ({"size", "tokens", "ms": [...]}) into OUT_DIR.

    python tests/oracle/gemma4_vision_bench.py OUT_DIR [--size 336] [--runs 3]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402

from gemma4_vision import import_mlx_vlm_gemma4, random_parameters  # noqa: E402

TEXT_HIDDEN = 1536


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", type=int, default=336)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.size % 48:
        sys.exit("--size must be a multiple of 48 (16-pixel patches pooled 3 x 3)")

    mods = import_mlx_vlm_gemma4()
    vision_cfg = {"model_type": "gemma4_vision"}  # mlx-vlm's defaults
    vc = mods["config"].VisionConfig.from_dict(vision_cfg)
    mx.random.seed(0)
    tower = mods["vision"].VisionModel(vc)
    embedder = mods["gemma4"].MultimodalEmbedder(vc.hidden_size, TEXT_HIDDEN, eps=vc.rms_norm_eps)
    weights = {}
    weights.update(random_parameters(tower, "vision_tower."))
    weights.update(random_parameters(embedder, "embed_vision."))
    pixels = mx.random.uniform(0.0, 1.0, (1, 3, args.size, args.size), dtype=mx.float32)

    def encode():
        out = embedder(tower(pixels))
        mx.eval(out)
        return out

    tokens = encode().shape[1]
    ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        encode()
        ms.append((time.perf_counter() - t0) * 1e3)

    os.makedirs(args.out_dir, exist_ok=True)
    text_cfg = {"model_type": "gemma4_text", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 1, "vocab_size": 64}
    cfg = {"model_type": "gemma4", "text_config": text_cfg,
           "vision_config": vision_cfg}
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(os.path.join(args.out_dir, "pixels.safetensors"), {"pixel_values": pixels})
    with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
        json.dump({"size": args.size, "tokens": tokens, "ms": ms}, f)
    print(f"mlx-vlm gemma4 tower+embedder, {args.size} px ({tokens} tokens): " + ", ".join(f"{m:.1f}" for m in ms) + " ms")


if __name__ == "__main__":
    main()
