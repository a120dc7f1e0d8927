"""The oracle for mlex's whole Gemma 4 vision-language model: mlx-vlm's own greedy decode on tiny weights.

Builds mlx-vlm 0.7.10's full gemma4 `Model` (vision encoder, embed_vision, Gemma 4 language model
with per-layer inputs) on a tiny config, gives every parameter random float32 values, writes a PNG
of odd size, runs mlx-vlm's Gemma4ImageProcessor on it (as PIL opens it) and greedy-decodes 32
tokens for a prompt holding that image the way mlx-vlm's generate_step (generate/ar.py) drives the
model: `Model.get_input_embeddings(input_ids, pixel_values)` (its inputs_embeds and
per_layer_inputs), the language model's own cache (`LanguageModel.make_cache()`), the prompt
prefilled with `language_model(input_ids, inputs_embeds=…, per_layer_inputs=…, cache=…)`, then
one token at a time `language_model(y[None], cache=…)` with argmax on the last position's logits (no
stop at eos). Writes into OUT_DIR:

    config.json        a gemma4 checkpoint's config.json (nested text_config / vision_config)
    processor_config.json  the image processor's settings (patch 4, 20 soft tokens, 2x2 pooling)
    model.safetensors  the parameters, named as mlx-vlm's Model holds them after sanitize:
                       "language_model.model.…", "vision_tower.…", "embed_vision.…" (the head is
                       tied: LanguageModel has none)
    image.png          the image, 37 x 23 pixels RGB
    io.safetensors     pixel_values [1, 3, 24, 40] f32 (the processor's), input_ids [1, L] int32
                       (bos 305, "look: ", boi 301, the image token 300 once per soft token (15),
                       eoi 302, " what is it?"), logits0 [320] f32 (the last prompt position's
                       logits), tokens [32] int32 (the greedy tokens)

    python tests/oracle/gemma4_vlm.py OUT_DIR [--seed N] [--bidirectional] [--two-images] [--video [--num-frames N]]

With --two-images the prompt holds a second image (image2.png, 16 x 50 pixels: 14 soft tokens)
after " and ", before the question: images of different sizes, encoded one by one and scattered
in order.

With --video the prompt holds, after the image and " and ", a video of 3 frames (frame0.png ..
frame2.png, 29 x 41 pixels RGB) where the chat template writes `<|video|>` (id 304; config.json
gets video_token_id 304, processor_config.json a video_processor with patch 4, 70 soft tokens,
2x2 pooling). The frames go in as mlx-vlm's prepare_inputs hands decoded frames to the processor:
one uint8 array (T, C, H, W), with fps [2.0] (DEFAULT_VIDEO_SAMPLING's, as VideoMetadata's
sampled_fps for frames it did not decode). mlx-vlm's own Gemma4Processor.__call__ expands the
marker (called on a stand-in holding its video processor and a byte-level tokenizer: bytes as
themselves, the special tokens as their ids): per frame "mm:ss " + boi + the video token × the
frame's soft tokens (63: 56 x 72 pixels after resizing) + eoi, frames joined by " ". Then
get_input_embeddings(pixel_values_videos=…, video_position_ids=…) encodes the frames as
_encode_video does (patches padded to 280 with position −1, masked in the tower) and scatters
them at the video tokens. io.safetensors also gets pixel_values_videos [1, 3, 280, 48] and
video_position_ids [1, 3, 280, 2]. With --num-frames N (< 3) the video processor keeps N of the 3
frames (its uniform sampling; the config's video_processor gets num_frames N).

With --bidirectional the text config sets use_bidirectional_attention "vision" (as the larger
Gemma 4 checkpoints do) and the prefill gets the processor's mm_token_type_ids, as generate passes
them: the image's tokens then attend to each other both ways (the script checks that this changes
the tokens).

What mlx-vlm 0.7.10 does that a port might not (besides the tower's quirks, in gemma4_vision.py):
- The processor expands each image token of the prompt into boi + image token × (that image's
  soft-token count) + eoi; the count is the resized image's (H/p)·(W/p)/k².
- get_input_embeddings: text rows are embed_tokens(ids) × sqrt(hidden) (a Python float: in the
  embeddings' dtype); image-token positions get the embedder's rows as they are (no scaling).
  The per-layer inputs read the ids with every image (and audio/video) token replaced by 0, and
  their projection half is computed from the merged rows.
- Attention over the prompt is causal (sliding layers: a window of sliding_window keys) unless
  text_config.use_bidirectional_attention is "vision" and the processor's mm_token_type_ids reach
  the model (generate passes them): then each run of image tokens (type 1; boi/eoi are text) also
  sees itself both ways, in full and sliding layers alike (the window does not limit it), and
  prefill is not chunked. mlx-vlm applies that overlay only when the mask's key length equals the
  token-type length, i.e. with nothing cached before the prompt: after a cached prefix it is
  silently causal (mlex applies it to every prompt chunk holding an image).
- generate_step's prefill is chunked: all but the last prompt position in one call (with
  per_layer_inputs sliced by the cache offset), then the last position alone. This script prefills
  in one call and checks that the chunked way gives the same tokens.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from gemma4_vision import import_mlx_vlm_gemma4  # noqa: E402

IMAGE_TOKEN, BOI, EOI, AUDIO_TOKEN, VIDEO_TOKEN, BOS = 300, 301, 302, 303, 304, 305
SPECIAL = {"<|image|>": IMAGE_TOKEN, "<|image>": BOI, "<image|>": EOI, "<|video|>": VIDEO_TOKEN, "<bos>": BOS}
STEPS = 32

TEXT_CONFIG = {
    "model_type": "gemma4_text",
    "hidden_size": 48,
    "num_hidden_layers": 4,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "global_head_dim": 16,
    "vocab_size": 320,
    "vocab_size_per_layer_input": 320,
    "hidden_size_per_layer_input": 8,
    "num_kv_shared_layers": 2,  # layers 2 and 3 read layers 0 and 1's keys and values
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rms_norm_eps": 1e-6,
    "final_logit_softcapping": 30.0,
    "use_double_wide_mlp": True,  # the KV-shared layers' MLPs are twice as wide
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}

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
    "use_clipped_linears": False,
    "standardize": False,
}

PROCESSOR = {"patch_size": 4, "max_soft_tokens": 20, "pooling_kernel_size": 2}
VIDEO_PROCESSOR = {"patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 2}


class ByteTokenizer:
    """The Rust test's tokenizer: the special tokens as their ids, every other byte as itself."""

    def __call__(self, text, **kwargs):
        import re

        pattern = "(" + "|".join(re.escape(t) for t in SPECIAL) + ")"
        out = []
        for prompt in text:
            ids = []
            for piece in re.split(pattern, prompt):
                ids.extend([SPECIAL[piece]] if piece in SPECIAL else list(piece.encode()))
            out.append(ids)
        return {"input_ids": out}


def video_inputs(mods, prompt, frames, video_processor):
    """mlx-vlm's Gemma4Processor.__call__ on `prompt` (holding one <|video|>) and the frames."""
    import types as _types

    pg = mods["processing_gemma4"]
    stand_in = _types.SimpleNamespace(
        video_processor=pg.Gemma4VideoProcessor(**video_processor),
        boi_token="<|image>",
        eoi_token="<image|>",
        video_token="<|video|>",
        image_token="<|image|>",
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        audio_token_id=AUDIO_TOKEN,
        tokenizer=ByteTokenizer(),
    )
    video = np.stack([np.asarray(f) for f in frames]).transpose(0, 3, 1, 2)  # (T, C, H, W) uint8
    return pg.Gemma4Processor.__call__(stand_in, text=[prompt], videos=[video], fps=[2.0])


def random_parameters(model):
    flat = sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0])
    new = []
    for name, p in flat:
        noise = 0.1 * mx.random.normal(p.shape, dtype=mx.float32)
        leaf = name.rsplit(".", 1)[-1]
        if ("norm" in name and leaf == "weight") or leaf == "layer_scalar":
            value = 1.0 + noise
        elif name.endswith("embed_tokens.weight"):
            value = 0.3 * noise
        elif leaf == "position_embedding_table":
            value = 5 * noise
        else:
            value = noise
        new.append((name, value))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())
    return dict(new)


def greedy(model, input_ids, pixel_values, chunked, token_types=None, video=None):
    emb = model.get_input_embeddings(input_ids=input_ids, pixel_values=pixel_values, **(video or {}))
    embeds, pli = emb.inputs_embeds, emb.per_layer_inputs
    lm = model.language_model
    cache = lm.make_cache()
    if token_types is not None:
        out = lm(input_ids, inputs_embeds=embeds, cache=cache, per_layer_inputs=pli, logits_to_keep=1,
                 mm_token_type_ids=token_types)
    elif chunked:
        n = input_ids.shape[1] - 1
        lm(inputs=input_ids[:, :n], inputs_embeds=embeds[:, :n], cache=cache, per_layer_inputs=pli, logits_to_keep=1)
        out = lm(input_ids[:, n:], inputs_embeds=embeds[:, n:], cache=cache, per_layer_inputs=pli, logits_to_keep=1)
    else:
        out = lm(input_ids, inputs_embeds=embeds, cache=cache, per_layer_inputs=pli, logits_to_keep=1)
    logits0 = out.logits[0, -1]
    y = mx.argmax(logits0)
    tokens = [y.item()]
    while len(tokens) < STEPS:
        out = lm(y.reshape(1, 1), cache=cache)
        y = mx.argmax(out.logits[0, -1])
        tokens.append(y.item())
    return logits0, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bidirectional", action="store_true")
    ap.add_argument("--two-images", action="store_true")
    ap.add_argument("--video", action="store_true")
    ap.add_argument("--num-frames", type=int, default=None)
    args = ap.parse_args()
    text_cfg = dict(TEXT_CONFIG)
    if args.bidirectional:
        text_cfg["use_bidirectional_attention"] = "vision"

    mods = import_mlx_vlm_gemma4()
    cfg = mods["config"]
    text_config = cfg.TextConfig.from_dict(text_cfg)
    vision_config = cfg.VisionConfig.from_dict(VISION_CONFIG)
    model_config = cfg.ModelConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=IMAGE_TOKEN,
        boi_token_id=BOI,
        eoi_token_id=EOI,
        audio_token_id=AUDIO_TOKEN,
        video_token_id=VIDEO_TOKEN if args.video else None,
        vocab_size=320,
        hidden_size=48,
    )
    mx.random.seed(args.seed)
    model = mods["gemma4"].Model(model_config)
    weights = random_parameters(model)
    assert set(model.sanitize(weights)) == set(weights)

    from PIL import Image

    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    h, w = 23, 37
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 7) % 256, (yy * 11) % 256, rng.integers(0, 256, (h, w))], axis=-1).astype(np.uint8)
    png = os.path.join(args.out_dir, "image.png")
    Image.fromarray(img).save(png)

    proc = mods["processing_gemma4"].Gemma4ImageProcessor(**PROCESSOR)
    data, counts = proc.preprocess([Image.open(png).convert("RGB")])
    pixel_values = mx.array(np.asarray(data["pixel_values"], dtype=np.float32))
    n = counts[0]
    assert pixel_values.shape == (1, 3, 24, 40) and n == 15, (pixel_values.shape, n)

    ids = [BOS] + list(b"look: ") + [BOI] + [IMAGE_TOKEN] * n + [EOI]
    if args.two_images:
        h2, w2 = 50, 16
        yy, xx = np.mgrid[0:h2, 0:w2]
        img2 = np.stack([(yy * 5) % 256, rng.integers(0, 256, (h2, w2)), (xx * 13) % 256], axis=-1).astype(np.uint8)
        png2 = os.path.join(args.out_dir, "image2.png")
        Image.fromarray(img2).save(png2)
        data2, counts2 = proc.preprocess([Image.open(png2).convert("RGB")])
        n2 = counts2[0]
        assert n2 == 14, n2
        # The processor gives a list for images of different shapes; VisionModel encodes each.
        pixel_values = [pixel_values, mx.array(np.asarray(data2["pixel_values"], dtype=np.float32))]
        ids += list(b" and ") + [BOI] + [IMAGE_TOKEN] * n2 + [EOI]
    video = None
    video_processor = dict(VIDEO_PROCESSOR)
    if args.num_frames is not None:
        video_processor["num_frames"] = args.num_frames
    if args.video:
        frames = []
        for k in range(3):
            fh, fw = 29, 41
            yy, xx = np.mgrid[0:fh, 0:fw]
            f = np.stack([(xx * (5 + k)) % 256, rng.integers(0, 256, (fh, fw)), (yy * 9 + 40 * k) % 256], axis=-1).astype(np.uint8)
            path = os.path.join(args.out_dir, f"frame{k}.png")
            Image.fromarray(f).save(path)
            frames.append(Image.open(path).convert("RGB"))
        # The text around the video as the byte tokenizer reads it: everything so far is bytes
        # and specials already expanded, so only the video marker is left for the processor.
        inputs = video_inputs(mods, " and <|video|>", frames, video_processor)
        kept = min(3, video_processor.get("num_frames", 32))
        ids += [int(t) for t in np.asarray(inputs["input_ids"])[0]]
        video = {"pixel_values_videos": inputs["pixel_values_videos"], "video_position_ids": inputs["video_position_ids"]}
        n_video = int((inputs["input_ids"] == VIDEO_TOKEN).sum().item())
        assert n_video == kept * 63 and video["pixel_values_videos"].shape == (1, kept, 280, 48), (n_video, video["pixel_values_videos"].shape)
        assert int((inputs["mm_token_type_ids"] == 2).sum().item()) == n_video
    ids += list(b" what is it?")
    input_ids = mx.array([ids], dtype=mx.int32)

    causal_logits0, causal = greedy(model, input_ids, pixel_values, chunked=False, video=video)
    if video is not None:
        no_video, _ = greedy(model, input_ids, pixel_values, chunked=False)
        assert mx.abs(no_video - causal_logits0).max().item() > 1e-3, "the video's rows change nothing"
    if args.bidirectional:
        # The processor's mm_token_type_ids: 1 for image tokens, 2 for video tokens.
        token_types = (input_ids == IMAGE_TOKEN).astype(mx.int32) + 2 * (input_ids == VIDEO_TOKEN).astype(mx.int32)
        logits0, tokens = greedy(model, input_ids, pixel_values, chunked=False, token_types=token_types, video=video)
        assert mx.abs(logits0 - causal_logits0).max().item() > 1e-3, "the overlay changes nothing"
    else:
        logits0, tokens = causal_logits0, causal
        _, chunked = greedy(model, input_ids, pixel_values, chunked=True, video=video)
        assert chunked == tokens, (chunked, tokens)
    assert len(set(tokens)) > 4, f"greedy decoding repeats: {tokens}"

    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "image_token_id": IMAGE_TOKEN,
        "boi_token_id": BOI,
        "eoi_token_id": EOI,
        "audio_token_id": AUDIO_TOKEN,
        **({"video_token_id": VIDEO_TOKEN} if args.video else {}),
        "vocab_size": 320,
        "hidden_size": 48,
        "tie_word_embeddings": True,
        "text_config": text_cfg,
        "vision_config": VISION_CONFIG,
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "processor_config.json"), "w") as f:
        processor = {"image_processor": dict(PROCESSOR, image_processor_type="Gemma4ImageProcessor")}
        if args.video:
            processor["video_processor"] = dict(video_processor, video_processor_type="Gemma4VideoProcessor")
        json.dump(processor, f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(
        os.path.join(args.out_dir, "io.safetensors"),
        {
            "pixel_values": pixel_values[0] if args.two_images else pixel_values,
            "input_ids": input_ids,
            "logits0": logits0.astype(mx.float32),
            "tokens": mx.array(tokens, dtype=mx.int32),
            **({k: mx.array(v).astype(mx.float32 if k.startswith("pixel") else mx.int32) for k, v in video.items()} if video else {}),
        },
    )
    print(f"gemma4_vlm: seed {args.seed}: {len(ids)} prompt ids ({n} image tokens), tokens {tokens} in {args.out_dir}")


if __name__ == "__main__":
    main()
