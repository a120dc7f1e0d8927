"""Times mlx-vlm 0.7.10's Qwen3.5 vision tower (qwen3_vl/vision.py VisionModel) on one image, for tests/vision_qwen.rs's bench.

Builds the tower at a real size (default: Qwen3-VL-2B's vision config: 24 blocks of 1024, 16
heads, 16-pixel patches, 2304 position embeddings, out 2048) with random float32 weights, runs
its processor on a SIZE x SIZE image, evaluates the tower RUNS times after one warm-up, and
writes into OUT_DIR: config.json (a qwen3_5 config holding the vision_config and the text width),
model.safetensors (the tower's parameters as "vision_tower.…"), pixels.safetensors (pixels,
grid) and bench.json ({"ms": [...], "tokens": n}).

    python tests/oracle/qwen3_5_vision_bench.py OUT_DIR [--size 448] [--runs 3] [--depth 24]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from qwen3_5_vlm import import_mlx_vlm_qwen3_5  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--depth", type=int, default=24)
    args = ap.parse_args()
    mods = import_mlx_vlm_qwen3_5()
    vision = {"model_type": "qwen3_5", "depth": args.depth, "hidden_size": 1024, "intermediate_size": 4096,
              "out_hidden_size": 2048, "num_heads": 16, "patch_size": 16, "in_channels": 3,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
              "deepstack_visual_indexes": []}
    mx.random.seed(0)
    tower = mods["vision"].VisionModel(mods["config"].VisionConfig(**vision))
    params = [(k, 0.02 * mx.random.normal(v.shape)) for k, v in tree_flatten(tower.parameters())]
    tower.load_weights(params)
    mx.eval(tower.parameters())
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
    proc = mods["processing"].Qwen3VLImageProcessor(patch_size=16, max_pixels=16 * 16 * 4 * 16384)
    out = proc([img.transpose(2, 0, 1)])
    pixels = mx.array(np.asarray(out["pixel_values"], dtype=np.float32))
    grid = mx.array(np.asarray(out["image_grid_thw"], dtype=np.int32))
    mx.eval(tower(pixels, grid)[0])
    ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        mx.eval(tower(pixels, grid)[0])
        ms.append((time.perf_counter() - t0) * 1e3)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5", "hidden_size": 2048, "num_hidden_layers": 1, "vocab_size": 1, "vision_config": vision}, f)
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), {"vision_tower." + k: v for k, v in params})
    mx.save_safetensors(os.path.join(args.out_dir, "pixels.safetensors"), {"pixels": pixels, "grid": grid})
    tokens = int(np.prod(np.asarray(out["image_grid_thw"])[0])) // 4
    with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
        json.dump({"ms": ms, "tokens": tokens}, f)
    print(f"qwen3_5 tower, {args.size} px ({tokens} tokens): mlx-vlm {[round(m, 1) for m in ms]} ms")


if __name__ == "__main__":
    main()
