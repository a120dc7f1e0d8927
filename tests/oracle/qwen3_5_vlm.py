"""The oracle for mlex's Qwen3.5 vision-language model: mlx-vlm 0.7.10's tower, processor and greedy decode on tiny weights.

Builds mlx-vlm's whole qwen3_5 `Model` (the Qwen3-VL vision tower `qwen3_vl/vision.py`, no
deepstack, and the Qwen3.5 hybrid language model with interleaved multimodal rope) on a tiny
config, gives every parameter random float32 values and writes into OUT_DIR:

    config.json            a qwen3_5 checkpoint's config.json (nested text_config / vision_config)
    preprocessor_config.json  the image processor's settings (patch 4, merge 2, min/max pixels)
    model.safetensors      the parameters as mlx-vlm's Model holds them ("language_model.…",
                           "vision_tower.…")
    image.png, image2.png  two images (37 x 23 and 16 x 50 pixels RGB)
    io.safetensors         - tower_a / tower_b: the tower's output (merger rows, f32) for the two
                             images' pixel_values (pixels_a / pixels_b, the processor's, with
                             grid_a / grid_b (t, h, w) int32);
                           - image_K (uint8 H x W x 3), processed_K (f32), grid_K: the processor
                             on random images of odd sizes (downscaled by max_pixels, upscaled
                             by min_pixels, kept);
                           - input_ids [1, L] int32: "look: " <|vision_start|> <|image_pad|> x 15
                             <|vision_end|> " what is it?" (with --two-images also " and " and
                             the second image's 12), position_ids [3, L] (get_rope_index's),
                             logits0 [320] f32 (the last prompt position's), tokens [32] int32.

    python tests/oracle/qwen3_5_vlm.py OUT_DIR [--seed N] [--two-images] [--quantize] [--moe] [--video]

With --video the prompt holds a video instead of the image: three frames of 45 x 29 pixels
(frame_0.png … frame_2.png), through mlx-vlm's numpy Qwen3VLVideoProcessor with its own settings
(VIDEO_PROCESSOR, also written as video_preprocessor_config.json: min/max pixels of the whole
video 512 / 4096, so the frames are resized to 40 x 24, the third repeated to fill the second
temporal group: video_grid_thw (2, 6, 10)). io.safetensors then also holds video_pixels,
video_grid, video_tower (the tower on the video's patches, two groups of 15 rows), and, for the
processor alone on videos of odd sizes and frame counts, video_K (uint8 T x H x W x 3),
vprocessed_K, vgrid_K. The prompt is "look: " then, per temporal group, the text mlx-vlm's
Qwen3VLProcessor writes for a frames list (`_video_group_timestamps` at the processor's fps,
2: "<0.2 seconds>", "<1.2 seconds>") before <|vision_start|> <|video_pad|> x 15 <|vision_end|>,
then " what happens?"; position_ids are get_rope_index's with the video grid.

With --moe the model is mlx-vlm's qwen3_5_moe (the same tower; every text layer's MLP a mixture
of 4 experts, 2 per token, with a gated shared expert).

With --quantize the random model is quantized as mlx-vlm's convert does it (affine, 4 bits,
groups of 32, every Linear and Embedding whose input width is a multiple of 32: the tower's
linears and position table included; the Conv3d and conv1d stay float), config.json gets its
"quantization" block, and everything (tower, decode) runs quantized.

The decode drives mlx-vlm's model as generate does: `Model.get_input_embeddings(input_ids,
pixel_values, image_grid_thw=…)` gives the merged rows, the 3-D position ids and the rope delta;
the prompt goes through `language_model(input_ids, inputs_embeds=…, position_ids=…,
rope_deltas=…, cache=…)`, then one token at a time `language_model(y[None], cache=…)` (positions
offset + delta on all three axes), argmax of the last logits, no stop at eos.

Preprocessing (mlx-vlm's numpy Qwen3VLImageProcessor): smart_resize to multiples of
patch·merge within [min_pixels, max_pixels] (round, then floor/ceil by sqrt of the ratio), PIL
BICUBIC on the 8-bit image (none when the size is kept), ×1/255, (x − 0.5)/0.5, duplicated to the
temporal patch, patches ordered (merge-block row, merge-block col, row in block, col in block) and
each flattened (channel, t, y, x).
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

IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD, EOS = 300, 301, 302, 303, 304
STEPS = 32

TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 320,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    # 16 · 1.0 = 16 rotary dims: 8 frequencies, interleaved t h w t h w t h (sections 3, 3, 2).
    "rope_parameters": {"type": "default", "mrope_section": [3, 3, 2], "rope_theta": 10000.0,
                        "partial_rotary_factor": 1.0, "mrope_interleaved": True},
}

VISION_CONFIG = {
    "model_type": "qwen3_5",
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "in_channels": 3,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [],
}

PROCESSOR = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
             "min_pixels": 256, "max_pixels": 1920,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}

# The video processor's own settings (another pixel budget than the images', over the whole video).
VIDEO_PROCESSOR = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
                   "min_pixels": 512, "max_pixels": 4096, "fps": 2.0,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
VIDEO_FRAMES, VIDEO_H, VIDEO_W = 3, 29, 45
# The processor alone: (frames, height, width): downscaled, upscaled, kept, one frame, odd counts.
VIDEO_SIZES = [(3, 29, 45), (2, 101, 67), (5, 9, 13), (4, 40, 40), (1, 17, 90), (2, 300, 257), (6, 12, 20), (3, 24, 40)]


def import_mlx_vlm_qwen3_5(package="qwen3_5"):
    """mlx-vlm's qwen3_5 modules without the package __init__ files of mlx_vlm, its models and
    speculative packages (they import optional dependencies), speculative_verifier.py stubbed."""
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen3_5_vlm: mlx-vlm is not installed (run scripts/setup-oracle.sh)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in [("mlx_vlm", root), ("mlx_vlm.models", os.path.join(root, "models")),
                       ("mlx_vlm.speculative", os.path.join(root, "speculative"))]:
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [path]
            mod.__package__ = name
            mod.__file__ = os.path.join(path, "__init__.py")
            sys.modules[name] = mod
    name = "mlx_vlm.models.qwen3_5.speculative_verifier"  # qwen3_5_moe imports qwen3_5's
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class Qwen3_5ExactSpeculativeVerifier:  # never called: no speculative decoding here
            def verify(self, *a, **k):
                raise RuntimeError("speculative verification is stubbed out in the oracle")

        stub.Qwen3_5ExactSpeculativeVerifier = Qwen3_5ExactSpeculativeVerifier
        sys.modules[name] = stub
    mods = {m: importlib.import_module(f"mlx_vlm.models.{package}." + m) for m in ["config", "vision", "language", package]}
    mods["qwen3_5"] = mods[package]
    mods["processing"] = importlib.import_module("mlx_vlm.models.qwen3_vl.processing_qwen3_vl")
    return mods


def random_parameters(model):
    flat = sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0])
    new = []
    for name, p in flat:
        noise = 0.1 * mx.random.normal(p.shape, dtype=mx.float32)
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight":
            value = 1.0 + noise  # the tower's LayerNorms, the text model's RMSNorms (weight as is)
        elif any(name.endswith(f"self_attn.{p}.weight") for p in ("q_proj", "k_proj")):
            value = 5 * noise  # sharp attention: positions matter
        elif name.endswith("A_log"):
            value = mx.log(mx.random.uniform(1.0, 4.0, p.shape))
        elif name.endswith("embed_tokens.weight"):
            value = 0.5 * mx.random.normal(p.shape, dtype=mx.float32)
        elif name.endswith("pos_embed.weight"):
            value = 0.5 * mx.random.normal(p.shape, dtype=mx.float32)
        else:
            value = noise
        new.append((name, value))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())
    return dict(new)


def greedy(model, input_ids, mm, split=None):
    """`mm`: the media keywords of get_input_embeddings (pixel_values and image_grid_thw, or
    pixel_values_videos and video_grid_thw)."""
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm = model.language_model
    lm._position_ids = None
    lm._rope_deltas = None
    cache = lm.make_cache()
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


def make_image(rng, h, w, k):
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([(xx * (7 + k)) % 256, (yy * (11 + 2 * k)) % 256, rng.integers(0, 256, (h, w))], axis=-1).astype(np.uint8)


def video_frames(rng, out_dir=None):
    """The oracle video's frames (uint8 H x W x 3), written as frame_K.png into `out_dir`."""
    from PIL import Image

    frames = [make_image(rng, VIDEO_H, VIDEO_W, 20 + k) for k in range(VIDEO_FRAMES)]
    if out_dir is not None:
        for k, f in enumerate(frames):
            Image.fromarray(f).save(os.path.join(out_dir, f"frame_{k}.png"))
    return frames


def video_processing(processing, rng, io, frames):
    """The video processor on the oracle's frames and, alone, on videos of odd sizes (into io):
    returns its pixel_values_videos and video_grid_thw."""
    vproc = processing.Qwen3VLVideoProcessor(**VIDEO_PROCESSOR)
    for k, (t, h, w) in enumerate(VIDEO_SIZES):
        video = np.stack([make_image(rng, h, w, 40 + 3 * k + j) for j in range(t)])
        out = vproc(list(video))
        io[f"video_{k}"] = mx.array(video)
        io[f"vprocessed_{k}"] = mx.array(np.asarray(out["pixel_values_videos"], dtype=np.float32))
        io[f"vgrid_{k}"] = mx.array(np.asarray(out["video_grid_thw"], dtype=np.int32))
    out = vproc(list(frames))
    return (mx.array(np.asarray(out["pixel_values_videos"], dtype=np.float32)),
            mx.array(np.asarray(out["video_grid_thw"], dtype=np.int32)))


def text_ids(text):
    """A prompt's ids under the tests' byte tokenizer: bytes, and the vision tokens' ids."""
    specials = {"<|image_pad|>": IMAGE_PAD, "<|vision_start|>": VISION_START, "<|vision_end|>": VISION_END,
                "<|video_pad|>": VIDEO_PAD}
    ids, i = [], 0
    while i < len(text):
        hit = next((s for s in specials if text.startswith(s, i)), None)
        if hit:
            ids.append(specials[hit])
            i += len(hit)
        else:
            ids.extend(text[i].encode())
            i += 1
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--two-images", action="store_true")
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--video", action="store_true")
    args = ap.parse_args()

    mods = import_mlx_vlm_qwen3_5("qwen3_5_moe" if args.moe else "qwen3_5")
    text_config = dict(TEXT_CONFIG)
    vision_config = dict(VISION_CONFIG)
    if args.moe:
        text_config.update({"model_type": "qwen3_5_moe_text", "num_experts": 4, "num_experts_per_tok": 2,
                            "shared_expert_intermediate_size": 64, "moe_intermediate_size": 32, "norm_topk_prob": True})
        vision_config["model_type"] = "qwen3_5_moe"
    cfg = mods["config"]
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if args.moe else "qwen3_5",
        "image_token_id": IMAGE_PAD,
        "video_token_id": VIDEO_PAD,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        "eos_token_id": EOS,
        "vocab_size": 320,
        "tie_word_embeddings": False,
        "text_config": text_config,
        "vision_config": vision_config,
    }
    model_config = cfg.ModelConfig.from_dict(json.loads(json.dumps(config)))
    mx.random.seed(args.seed)
    model = mods["qwen3_5"].Model(model_config)
    weights = random_parameters(model)
    assert set(model.sanitize(dict(weights))) == set(weights), "sanitize renames the saved names"
    if args.quantize:
        import mlx.nn as nn

        def quantizable(path, module):
            return hasattr(module, "to_quantized") and module.weight.shape[-1] % 32 == 0

        nn.quantize(model, group_size=32, bits=4, class_predicate=quantizable)
        mx.eval(model.parameters())
        weights = dict(tree_flatten(model.parameters()))
        assert any(k.endswith("pos_embed.scales") for k in weights), "the position table is not quantized"
        config["quantization"] = {"group_size": 32, "bits": 4}

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
        feats, deep = model.vision_tower(p, g)
        assert deep == []
        io[f"pixels_{tag}"], io[f"grid_{tag}"], io[f"tower_{tag}"] = p, g, feats.astype(mx.float32)

    # The processor alone on images of odd sizes: kept, downscaled (max_pixels), upscaled (min_pixels).
    sizes = [(23, 37), (101, 67), (9, 13), (40, 40), (17, 90), (33, 8), (3, 500), (300, 257), (7, 640), (64, 48), (12, 20), (1, 150)]
    for k, (h, w) in enumerate(sizes):
        img = make_image(rng, h, w, k + 3)
        out = proc([img.transpose(2, 0, 1)])
        io[f"image_{k}"] = mx.array(img)
        io[f"processed_{k}"] = mx.array(np.asarray(out["pixel_values"], dtype=np.float32))
        io[f"grid_{k}"] = mx.array(np.asarray(out["image_grid_thw"], dtype=np.int32))

    n = 15
    ids = list(b"look: ") + [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
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
        feats, _ = model.vision_tower(vpixels, vgrid)
        io["video_pixels"], io["video_grid"], io["video_tower"] = vpixels, vgrid, feats.astype(mx.float32)
        # The text Qwen3VLProcessor writes for <|vision_start|><|video_pad|><|vision_end|>.
        p = mods["processing"]
        t, frame_seqlen = vgrid[0, 0].item(), vgrid[0, 1].item() * vgrid[0, 2].item() // 4
        block = p._timestamped_video_placeholder(p._video_group_timestamps(t, 2, VIDEO_PROCESSOR["fps"]), frame_seqlen,
                                                 "<|vision_start|>", "<|vision_end|>").replace("<|placeholder|>", "<|video_pad|>")
        ids = text_ids("look: " + block + " what happens?")
        mm = {"pixel_values_videos": vpixels, "video_grid_thw": vgrid}
    input_ids = mx.array([ids], dtype=mx.int32)

    logits0, tokens, position_ids = greedy(model, input_ids, mm)
    _, chunked, _ = greedy(model, input_ids, mm, split=len(ids) - 1)
    assert chunked == tokens, (chunked, tokens)
    assert len(set(tokens)) > 4, f"greedy decoding repeats: {tokens}"
    # The image's rows and 3-D positions matter.
    flat = mx.broadcast_to(mx.arange(len(ids))[None, None], (3, 1, len(ids)))
    lm = model.language_model
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm._position_ids = None
    lm._rope_deltas = None
    plain = lm(input_ids, inputs_embeds=emb.inputs_embeds, cache=lm.make_cache(), position_ids=flat)
    assert mx.abs(plain.logits[0, -1] - logits0).max().item() > 1e-3, "the 3-D positions change nothing"

    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(dict(PROCESSOR, image_processor_type="Qwen2VLImageProcessor"), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump(dict(VIDEO_PROCESSOR, video_processor_type="Qwen3VLVideoProcessor"), f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    io.update({
        "input_ids": input_ids,
        "position_ids": position_ids.reshape(3, -1).astype(mx.int32),
        "logits0": logits0.astype(mx.float32),
        "tokens": mx.array(tokens, dtype=mx.int32),
    })
    mx.save_safetensors(os.path.join(args.out_dir, "io.safetensors"), io)
    print(f"qwen3_5_vlm: seed {args.seed}: {len(ids)} prompt ids, tokens {tokens} in {args.out_dir}")


if __name__ == "__main__":
    main()
