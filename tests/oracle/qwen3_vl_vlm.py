"""The oracle for mlex's Qwen3-VL vision-language model: mlx-vlm 0.7.10's tower (with deepstack), processor and greedy decode on tiny weights.

Builds mlx-vlm's whole qwen3_vl `Model` (`qwen3_vl/vision.py`: the Qwen3-VL tower with two
deepstack mergers, after blocks 0 and 2 of 3; `qwen3_vl/language.py`: the Qwen3 decoder with q/k
norms and interleaved multimodal rope, the deepstack features added at the image positions after
text layers 0 and 1) on a tiny config, gives every parameter random float32 values and writes
into OUT_DIR what tests/oracle/qwen3_5_vlm.py writes (same names, same images, prompts, video and
options: --two-images, --quantize, --video; see its docstring), with a qwen3_vl config.json, plus:

    io.safetensors  deep_a / deep_b [2, rows, 64] f32: the tower's deepstack features for the two
                    images (tower_a / tower_b stay the merger's rows); with --video, video_deep.

The decode drives mlx-vlm's model as generate does, deepstack included:
`Model.get_input_embeddings(input_ids, pixel_values, image_grid_thw=…)` gives the merged rows, the
visual position mask, the deepstack features, the 3-D position ids and the rope delta; the prompt
goes through `language_model(input_ids, inputs_embeds=…, position_ids=…, rope_deltas=…,
visual_pos_masks=…, deepstack_visual_embeds=…, cache=…)` (whole, and again in two chunks: the
same tokens), then one token at a time `language_model(y[None], cache=…)`, argmax, no stop at eos.

    python tests/oracle/qwen3_vl_vlm.py OUT_DIR [--seed N] [--two-images] [--quantize] [--video]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import qwen3_5_vlm as q  # noqa: E402  (the shared helpers: images, video, processor, weights)

TEXT_CONFIG = {
    "model_type": "qwen3_vl_text",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": 320,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    # 16 rotary dims: 8 frequencies, interleaved t h w t h w t h (sections 3, 3, 2).
    "rope_scaling": {"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True},
}

VISION_CONFIG = dict(q.VISION_CONFIG, model_type="qwen3_vl", depth=3, deepstack_visual_indexes=[0, 2])


def make_cache(lm):
    """mlx-vlm's prompt cache for a model without make_cache: a KVCache per layer."""
    from mlx_vlm.models.cache import KVCache

    return [KVCache() for _ in lm.layers]


def greedy(model, input_ids, mm, split=None, deepstack=True):
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm = model.language_model
    lm._position_ids = None
    lm._rope_deltas = None
    cache = make_cache(lm)
    pos = emb.position_ids
    extra = {"visual_pos_masks": emb.visual_pos_masks, "deepstack_visual_embeds": emb.deepstack_visual_embeds} if deepstack else {}
    if split is None:
        out = lm(input_ids, inputs_embeds=emb.inputs_embeds, cache=cache, position_ids=pos, rope_deltas=emb.rope_deltas, **extra)
    else:
        lm(input_ids[:, :split], inputs_embeds=emb.inputs_embeds[:, :split], cache=cache,
           position_ids=pos[..., :split], rope_deltas=emb.rope_deltas, **extra)
        out = lm(input_ids[:, split:], inputs_embeds=emb.inputs_embeds[:, split:], cache=cache,
                 position_ids=pos[..., split:], rope_deltas=emb.rope_deltas, **extra)
    logits0 = out.logits[0, -1]
    y = mx.argmax(logits0)
    tokens = [y.item()]
    while len(tokens) < q.STEPS:
        out = lm(y.reshape(1, 1), cache=cache)
        y = mx.argmax(out.logits[0, -1])
        tokens.append(y.item())
    return logits0, tokens, emb.position_ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--two-images", action="store_true")
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--video", action="store_true")
    args = ap.parse_args()

    mods = q.import_mlx_vlm_qwen3_5("qwen3_vl")
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": q.IMAGE_PAD,
        "video_token_id": q.VIDEO_PAD,
        "vision_start_token_id": q.VISION_START,
        "vision_end_token_id": q.VISION_END,
        "eos_token_id": q.EOS,
        "vocab_size": 320,
        "tie_word_embeddings": False,
        "text_config": dict(TEXT_CONFIG),
        "vision_config": dict(VISION_CONFIG),
    }
    model_config = mods["config"].ModelConfig.from_dict(json.loads(json.dumps(config)))
    mx.random.seed(args.seed)
    model = mods["qwen3_vl"].Model(model_config)
    weights = q.random_parameters(model)
    assert set(model.sanitize(dict(weights))) == set(weights), "sanitize renames the saved names"
    assert sum(k.startswith("vision_tower.deepstack_merger_list.") for k in weights) == 2 * 6
    if args.quantize:
        import mlx.nn as nn

        def quantizable(path, module):
            return hasattr(module, "to_quantized") and module.weight.shape[-1] % 32 == 0

        nn.quantize(model, group_size=32, bits=4, class_predicate=quantizable)
        mx.eval(model.parameters())
        weights = dict(tree_flatten(model.parameters()))
        assert any(k.endswith("pos_embed.scales") for k in weights), "the position table is not quantized"
        assert any(k.endswith("deepstack_merger_list.0.linear_fc1.scales") for k in weights)
        config["quantization"] = {"group_size": 32, "bits": 4}

    from PIL import Image

    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    proc = mods["processing"].Qwen3VLImageProcessor(**q.PROCESSOR)
    io = {}

    def processed(path):
        out = proc([Image.open(path).convert("RGB")])
        return mx.array(np.asarray(out["pixel_values"], dtype=np.float32)), mx.array(np.asarray(out["image_grid_thw"], dtype=np.int32))

    paths = []
    for k, (h, w) in enumerate([(23, 37), (50, 16)]):
        path = os.path.join(args.out_dir, "image.png" if k == 0 else "image2.png")
        Image.fromarray(q.make_image(rng, h, w, k)).save(path)
        paths.append(path)
    (pa, ga), (pb, gb) = processed(paths[0]), processed(paths[1])
    assert ga.tolist() == [[1, 6, 10]] and gb.tolist() == [[1, 12, 4]], (ga.tolist(), gb.tolist())
    for tag, p, g in [("a", pa, ga), ("b", pb, gb)]:
        feats, deep = model.vision_tower(p, g)
        assert len(deep) == 2
        io[f"pixels_{tag}"], io[f"grid_{tag}"], io[f"tower_{tag}"] = p, g, feats.astype(mx.float32)
        io[f"deep_{tag}"] = mx.stack(deep).astype(mx.float32)

    n = 15
    ids = list(b"look: ") + [q.VISION_START] + [q.IMAGE_PAD] * n + [q.VISION_END]
    pixel_values, grid = pa, ga
    if args.two_images:
        ids += list(b" and ") + [q.VISION_START] + [q.IMAGE_PAD] * 12 + [q.VISION_END]
        pixel_values, grid = mx.concatenate([pa, pb]), mx.concatenate([ga, gb])
    ids += list(b" what is it?")
    mm = {"pixel_values": pixel_values, "image_grid_thw": grid}
    if args.video:
        frames = q.video_frames(rng, args.out_dir)
        vpixels, vgrid = q.video_processing(mods["processing"], rng, io, frames)
        assert vgrid.tolist() == [[2, 6, 10]], vgrid.tolist()
        feats, deep = model.vision_tower(vpixels, vgrid)
        io["video_pixels"], io["video_grid"], io["video_tower"] = vpixels, vgrid, feats.astype(mx.float32)
        io["video_deep"] = mx.stack(deep).astype(mx.float32)
        p = mods["processing"]
        t, frame_seqlen = vgrid[0, 0].item(), vgrid[0, 1].item() * vgrid[0, 2].item() // 4
        block = p._timestamped_video_placeholder(p._video_group_timestamps(t, 2, q.VIDEO_PROCESSOR["fps"]), frame_seqlen,
                                                 "<|vision_start|>", "<|vision_end|>").replace("<|placeholder|>", "<|video_pad|>")
        ids = q.text_ids("look: " + block + " what happens?")
        mm = {"pixel_values_videos": vpixels, "video_grid_thw": vgrid}
    input_ids = mx.array([ids], dtype=mx.int32)

    logits0, tokens, position_ids = greedy(model, input_ids, mm)
    _, chunked, _ = greedy(model, input_ids, mm, split=len(ids) - 1)
    assert chunked == tokens, (chunked, tokens)
    assert len(set(tokens)) > 4, f"greedy decoding repeats: {tokens}"
    # Deepstack matters.
    no_deep, _, _ = greedy(model, input_ids, mm, deepstack=False)
    assert mx.abs(no_deep - logits0).max().item() > 1e-3, "the deepstack features change nothing"
    # The 3-D positions matter.
    flat = mx.broadcast_to(mx.arange(len(ids))[None, None], (3, 1, len(ids)))
    lm = model.language_model
    emb = model.get_input_embeddings(input_ids=input_ids, **mm)
    lm._position_ids = None
    lm._rope_deltas = None
    plain = lm(input_ids, inputs_embeds=emb.inputs_embeds, cache=make_cache(lm), position_ids=flat,
               visual_pos_masks=emb.visual_pos_masks, deepstack_visual_embeds=emb.deepstack_visual_embeds)
    assert mx.abs(plain.logits[0, -1] - logits0).max().item() > 1e-3, "the 3-D positions change nothing"

    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(dict(q.PROCESSOR, image_processor_type="Qwen2VLImageProcessor"), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump(dict(q.VIDEO_PROCESSOR, video_processor_type="Qwen3VLVideoProcessor"), f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    io.update({
        "input_ids": input_ids,
        "position_ids": position_ids.reshape(3, -1).astype(mx.int32),
        "logits0": logits0.astype(mx.float32),
        "tokens": mx.array(tokens, dtype=mx.int32),
    })
    mx.save_safetensors(os.path.join(args.out_dir, "io.safetensors"), io)
    print(f"qwen3_vl_vlm: seed {args.seed}: {len(ids)} prompt ids, tokens {tokens} in {args.out_dir}")


if __name__ == "__main__":
    main()
