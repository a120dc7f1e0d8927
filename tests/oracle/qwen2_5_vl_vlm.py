"""The oracle for mlex's Qwen2.5-VL: mlx-vlm 0.7.10's window-attention tower and greedy decode on tiny weights.

Builds mlx-vlm's whole qwen2_5_vl `Model` (`qwen2_5_vl/vision.py`: RMSNorm blocks, SwiGLU MLPs,
window attention with full attention in `fullatt_block_indexes`; `language.py`: the Qwen2
decoder with chunked multimodal rope) on a tiny config with random float32 weights. The window
is 16 pixels (2 x 2 merge blocks), so the images' 3 x 5 and 6 x 2 merged grids fall into
partial windows. Writes into OUT_DIR, as tests/oracle/qwen3_5_vlm.py does:

    config.json, preprocessor_config.json, model.safetensors, image.png, image2.png
    io.safetensors   tower_a / tower_b (with pixels_a / pixels_b, grid_a / grid_b), input_ids,
                     position_ids, logits0, tokens (32 greedy tokens)

    python tests/oracle/qwen2_5_vl_vlm.py OUT_DIR [--seed N] [--two-images] [--video]

With --video the prompt holds qwen3_5_vlm.py's video instead (the same frames, the same numpy
Qwen3VLVideoProcessor, which mlx-vlm's Qwen2_5_VLProcessor uses too, video_grid_thw (2, 6, 10)):
"look: " <|vision_start|> <|video_pad|> x 30 <|vision_end|> " what happens?", as
Qwen2_5_VLProcessor writes it (one block, no timestamps); io.safetensors gets video_pixels,
video_grid, video_tower, and position_ids are mlx-vlm's get_rope_index with the video grid (the
temporal index 0, 1 per group: mlx-vlm reads no second_per_grid_ts).

config.json is flat, as Qwen2.5-VL checkpoints are (the text fields at the top, model_type
"qwen2_5_vl", vision_config nested). The decode drives the model as qwen3_5_vlm.py does
(get_input_embeddings → position ids and rope delta; prompt, then one token at a time).
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import types

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from qwen3_5_vlm import PROCESSOR, VIDEO_PROCESSOR, make_image, random_parameters, video_frames, video_processing  # noqa: E402

IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD, EOS = 300, 301, 302, 303, 304
STEPS = 32

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 320,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    # head_dim 16: 8 frequencies, t t h h h w w w.
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "tie_word_embeddings": False,
}

VISION_CONFIG = {
    "model_type": "qwen2_5_vl",
    "depth": 3,
    "hidden_size": 32,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "in_channels": 3,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 16,
    "fullatt_block_indexes": [1],
}


def import_mlx_vlm_qwen2_5_vl():
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen2_5_vl_vlm: mlx-vlm is not installed (run scripts/setup-oracle.sh)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in [("mlx_vlm", root), ("mlx_vlm.models", os.path.join(root, "models"))]:
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [path]
            mod.__package__ = name
            mod.__file__ = os.path.join(path, "__init__.py")
            sys.modules[name] = mod
    mods = {m: importlib.import_module("mlx_vlm.models.qwen2_5_vl." + m) for m in ["config", "vision", "language", "qwen2_5_vl"]}
    mods["processing"] = importlib.import_module("mlx_vlm.models.qwen3_vl.processing_qwen3_vl")
    mods["cache"] = importlib.import_module("mlx_vlm.models.cache")
    return mods


def greedy(mods, model, input_ids, mm, split=None):
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm = model.language_model
    lm._position_ids = None
    lm._rope_deltas = None
    cache = [mods["cache"].KVCache() for _ in lm.layers]
    pos = emb.position_ids
    if split is None:
        out = lm(input_ids, inputs_embeds=emb.inputs_embeds, cache=cache, position_ids=pos, rope_deltas=emb.rope_deltas)
    else:
        lm(input_ids[:, :split], inputs_embeds=emb.inputs_embeds[:, :split], cache=cache,
           position_ids=pos[..., :split], rope_deltas=emb.rope_deltas)
        out = lm(input_ids[:, split:], inputs_embeds=emb.inputs_embeds[:, split:], cache=cache,
                 position_ids=pos[..., split:], rope_deltas=emb.rope_deltas)
    logits0 = out.logits[0, -1]
    y = mx.argmax(logits0)
    tokens = [y.item()]
    while len(tokens) < STEPS:
        out = lm(y.reshape(1, 1), cache=cache)
        y = mx.argmax(out.logits[0, -1])
        tokens.append(y.item())
    return logits0, tokens, emb.position_ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--two-images", action="store_true")
    ap.add_argument("--video", action="store_true")
    args = ap.parse_args()

    mods = import_mlx_vlm_qwen2_5_vl()
    cfg = mods["config"]
    ids_cfg = {"image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD, "vision_start_token_id": VISION_START,
               "vision_end_token_id": VISION_END}
    model_config = cfg.ModelConfig(
        text_config=cfg.TextConfig(model_type="qwen2_5_vl", **json.loads(json.dumps(TEXT))),
        vision_config=cfg.VisionConfig(**VISION_CONFIG),
        model_type="qwen2_5_vl",
        vocab_size=320,
        eos_token_id=[EOS],
        **ids_cfg,
    )
    mx.random.seed(args.seed)
    model = mods["qwen2_5_vl"].Model(model_config)
    weights = random_parameters(model)
    # The merger's RMSNorm weight near 1 too (random_parameters keys norms on "norm").
    weights["vision_tower.merger.ln_q.weight"] = 1.0 + weights["vision_tower.merger.ln_q.weight"]
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())

    from PIL import Image

    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    proc = mods["processing"].Qwen3VLImageProcessor(**PROCESSOR)
    io = {}

    def processed(path):
        out = proc([Image.open(path).convert("RGB")])
        return mx.array(np.asarray(out["pixel_values"], dtype=np.float32)), mx.array(np.asarray(out["image_grid_thw"], dtype=np.int32))

    paths = []
    for k, (h, w) in enumerate([(23, 37), (50, 16)]):
        path = os.path.join(args.out_dir, "image.png" if k == 0 else "image2.png")
        Image.fromarray(make_image(rng, h, w, k)).save(path)
        paths.append(path)
    (pa, ga), (pb, gb) = processed(paths[0]), processed(paths[1])
    assert ga.tolist() == [[1, 6, 10]] and gb.tolist() == [[1, 12, 4]], (ga.tolist(), gb.tolist())
    for tag, p, g in [("a", pa, ga), ("b", pb, gb)]:
        feats = model.vision_tower(p, g)
        io[f"pixels_{tag}"], io[f"grid_{tag}"], io[f"tower_{tag}"] = p, g, feats.astype(mx.float32)
    # The windows matter: all-full attention gives other rows.
    full = mods["qwen2_5_vl"].Model(model_config).vision_tower
    full.update(model.vision_tower.parameters())
    full.fullatt_block_indexes = list(range(VISION_CONFIG["depth"]))
    window_effect = mx.abs(full(pa, ga) - io["tower_a"]).max().item()
    assert window_effect > 1e-2, f"window attention changes little ({window_effect})"

    ids = list(b"look: ") + [VISION_START] + [IMAGE_PAD] * 15 + [VISION_END]
    pixel_values, grid = pa, ga
    if args.two_images:
        ids += list(b" and ") + [VISION_START] + [IMAGE_PAD] * 12 + [VISION_END]
        pixel_values, grid = mx.concatenate([pa, pb]), mx.concatenate([ga, gb])
    ids += list(b" what is it?")
    mm = {"pixel_values": pixel_values, "image_grid_thw": grid}
    if args.video:
        frames = video_frames(rng, args.out_dir)
        vpixels, vgrid = video_processing(mods["processing"], rng, io, frames)
        assert vgrid.tolist() == [[2, 6, 10]], vgrid.tolist()
        io["video_pixels"], io["video_grid"] = vpixels, vgrid
        io["video_tower"] = model.vision_tower(vpixels, vgrid).astype(mx.float32)
        ids = list(b"look: ") + [VISION_START] + [VIDEO_PAD] * 30 + [VISION_END] + list(b" what happens?")
        mm = {"pixel_values_videos": vpixels, "video_grid_thw": vgrid}
    input_ids = mx.array([ids], dtype=mx.int32)

    logits0, tokens, position_ids = greedy(mods, model, input_ids, mm)
    _, chunked, _ = greedy(mods, model, input_ids, mm, split=len(ids) - 1)
    assert chunked == tokens, (chunked, tokens)
    assert len(set(tokens)) > 4, f"greedy decoding repeats: {tokens}"
    flat = mx.broadcast_to(mx.arange(len(ids))[None, None], (3, 1, len(ids)))
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm = model.language_model
    lm._position_ids = None
    lm._rope_deltas = None
    plain = lm(input_ids, inputs_embeds=emb.inputs_embeds, cache=[mods["cache"].KVCache() for _ in lm.layers], position_ids=flat)
    assert mx.abs(plain.logits[0, -1] - logits0).max().item() > 1e-3, "the 3-D positions change nothing"

    config = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **ids_cfg,
              "eos_token_id": EOS, **TEXT, "vision_config": VISION_CONFIG}
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(dict(PROCESSOR, image_processor_type="Qwen2VLImageProcessor"), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump(dict(VIDEO_PROCESSOR, video_processor_type="Qwen2VLVideoProcessor"), f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    io.update({
        "input_ids": input_ids,
        "position_ids": position_ids.reshape(3, -1).astype(mx.int32),
        "logits0": logits0.astype(mx.float32),
        "tokens": mx.array(tokens, dtype=mx.int32),
    })
    mx.save_safetensors(os.path.join(args.out_dir, "io.safetensors"), io)
    print(f"qwen2_5_vl_vlm: seed {args.seed}: {len(ids)} prompt ids, tokens {tokens} in {args.out_dir}")


if __name__ == "__main__":
    main()
