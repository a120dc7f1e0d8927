"""The oracle for Gemma 3's pan and scan through mlex (tests/vision.rs): Hugging Face's processor
gives the prompt ids and pixel values, mlx-vlm's model the greedy tokens.

Writes into OUT_DIR a tiny gemma3 checkpoint that turns pan and scan on: gemma3_vlm.py's config
and random weights (seed --seed), a preprocessor_config.json with do_pan_and_scan true and
settings other than the defaults (32 x 32, crops from 8 pixels, at most 3, from an aspect ratio of
1.2), a byte-level tokenizer over the model's 320 ids with Gemma 3's image and turn tokens at
300..=306 and a cut-down Gemma 3 chat template (tokenizer.json, tokenizer_config.json), and PNG
images of odd sizes: wide and tall ones that are cropped (2 or 3 crops, one capped by the maximum),
one under the ratio threshold and one whose crops would be under the minimum size (no crops).

For each case (a list of images in one user message, text around them) it renders the chat
template with the tokenizer (as mlx-vlm's generate does), runs transformers' Gemma3Processor
(Gemma3ImageProcessorPil loaded from the preprocessor_config.json, the tokenizer) on the text and
images, and checks that mlx-vlm's own Gemma3Processor gives the same ids and pixels. transformers'
Gemma3Processor passes its own defaults for the four pan-and-scan settings (off, crops from 256
pixels, at most 4, from a ratio of 1.2) over the image processor's config, so the config's values
do not reach it: they are passed per call here, which is what mlx-vlm's processor (passing none,
the config deciding) does, and what mlex does. manifest.json lists, per case, the images, the
input_ids and num_crops; <case>.f32 holds the pixel_values (little-endian float32, [sum of 1 + crops,
3, 32, 32]).

For the case "greedy" (one wide image: the whole image and 3 crops) it also decodes 32 greedy
tokens with mlx-vlm's gemma3 Model on those ids and pixels as gemma3_vlm.py does (the tower on all
four, every image token filled in order, one-call prefill, checked against the chunked one):
manifest.json's "tokens".

    python tests/oracle/gemma3_pan_and_scan.py OUT_DIR [--seed N]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from gemma3_vlm import CONFIG, build_config, greedy, random_parameters  # noqa: E402
from gemma3_vision import import_mlx_vlm_gemma3  # noqa: E402
from image_preprocess import rgb  # noqa: E402

PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor",
    "processor_class": "Gemma3Processor",
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_pan_and_scan": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_seq_length": 16,
    "pan_and_scan_max_num_crops": 3,
    "pan_and_scan_min_crop_size": 8,
    "pan_and_scan_min_ratio_to_activate": 1.2,
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 32, "width": 32},
}

# transformers' Gemma3Processor passes its own defaults for these four (off, 256, 4, 1.2) over the
# image processor's config; mlx-vlm's passes nothing, so the config decides. Per call here.
PAN_AND_SCAN = {k: v for k, v in PREPROCESSOR.items() if "pan_and_scan" in k}

SPECIALS = {
    300: "<image_soft_token>",
    301: "<start_of_image>",
    302: "<end_of_image>",
    303: "<start_of_turn>",
    304: "<end_of_turn>",
    305: "<bos>",
    306: "<eos>",
}

# Gemma 3's template, cut down: image parts become <start_of_image>.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# (name, width, height, seed, crops under PREPROCESSOR)
IMAGES = [
    ("wide_97x29", 97, 29, 21, 3),  # ratio 3.3: 3 crops of 33 x 29
    ("tall_23x50", 23, 50, 22, 2),  # ratio 2.2: 2 crops of 23 x 25
    ("capped_203x20", 203, 20, 23, 3),  # ratio 10: capped at 3 crops of 68 x 20
    ("near_square_41x35", 41, 35, 24, 0),  # ratio 1.17: under the threshold
    ("thin_15x7", 15, 7, 25, 0),  # crops would be 8 x 7, under the minimum of 8
    ("tall_9x40", 9, 40, 26, 3),  # ratio 4.4, floor(40 / 8) = 5: capped at 3 crops of 9 x 14
]

# (case, images in the one user message); text parts around and between them.
CASES = [
    ("greedy", ["wide_97x29"]),
    ("tall", ["tall_23x50"]),
    ("none", ["near_square_41x35"]),
    ("mixed", ["capped_203x20", "thin_15x7", "tall_9x40", "near_square_41x35"]),
]


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (what tests/common's tiny tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tokenizer(out):
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    added = []
    for i in range(256, 320):
        content = SPECIALS.get(i, f"<unused_{i}>")
        vocab[content] = i
        added.append({"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    config = {
        "bos_token": "<bos>", "eos_token": "<eos>", "chat_template": TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
        # Gemma 3's tokenizer_config.json names its image tokens so (Gemma3Processor reads them).
        "extra_special_tokens": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                 "image_token": "<image_soft_token>"},
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def messages(names):
    content = [{"type": "text", "text": "look: "}]
    for k, name in enumerate(names):
        content.append({"type": "image"})
        content.append({"type": "text", "text": f" ({k}) " if k + 1 < len(names) else " what is it?"})
    return [{"role": "user", "content": content}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = args.out_dir
    os.makedirs(out, exist_ok=True)

    from transformers import AutoTokenizer
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=1)
    write_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (tokenizer.boi_token, tokenizer.image_token, tokenizer.eoi_token) == (
        "<start_of_image>", "<image_soft_token>", "<end_of_image>")
    image_processor = Gemma3ImageProcessorPil.from_pretrained(out)
    assert image_processor.do_pan_and_scan is True and image_processor.pan_and_scan_max_num_crops == 3
    hf = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16)

    _, config_mod, gemma3 = import_mlx_vlm_gemma3()
    import mlx_vlm.models.gemma3.language as language
    import mlx_vlm.models.gemma3.processing_gemma3 as mlx_processing

    ours = mlx_processing.Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16)

    for name, w, h, seed, _ in IMAGES:
        rgb(w, h, seed).save(os.path.join(out, f"{name}.png"), "PNG")

    # The model (gemma3_vlm.py's, its 16 tokens per image at 32 x 32).
    cfg = json.loads(json.dumps(CONFIG))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    model_config = build_config(config_mod, cfg)
    mx.random.seed(args.seed)
    model = gemma3.Model(model_config)
    weights = random_parameters(model, language)
    loaded = gemma3.LanguageModel(model_config.text_config).sanitize(dict(weights))
    model.load_weights(list(loaded.items()), strict=True)
    mx.eval(model.parameters())
    mx.save_safetensors(os.path.join(out, "model.safetensors"), weights)

    crops_of = {name: crops for name, _, _, _, crops in IMAGES}
    manifest = []
    for case, names in CASES:
        images = [Image.open(os.path.join(out, f"{n}.png")) for n in names]
        text = tokenizer.apply_chat_template(messages(names), add_generation_prompt=True, tokenize=False)
        res = hf(text=text, images=images, return_tensors="np", **PAN_AND_SCAN)
        ids = np.asarray(res["input_ids"]).reshape(-1).tolist()
        px = np.ascontiguousarray(res["pixel_values"], dtype="<f4")
        crops = [crops_of[n] for n in names]
        assert px.shape == (len(names) + sum(crops), 3, 32, 32), (case, px.shape)
        assert ids.count(300) == 16 * px.shape[0], case
        # mlx-vlm's processor: the config's do_pan_and_scan, the same ids and pixels.
        theirs = ours(text=text, images=images)
        assert np.asarray(theirs["input_ids"]).reshape(-1).tolist() == ids, case
        assert np.array_equal(np.asarray(theirs["pixel_values"]), px), case
        px.tofile(os.path.join(out, f"{case}.f32"))
        entry = {"case": case, "images": [f"{n}.png" for n in names], "num_crops": crops, "input_ids": ids,
                 "pixel_values": f"{case}.f32", "shape": list(px.shape)}
        if case == "greedy":
            input_ids = mx.array([ids], dtype=mx.int32)
            emb = model.get_input_embeddings(input_ids, mx.array(px), mask=mx.ones_like(input_ids))
            embeds = np.array(emb.inputs_embeds)
            tokens, step_logits, _ = greedy(model, input_ids, mx.array(embeds), chunked=False)
            chunked, _, _ = greedy(model, input_ids, mx.array(embeds), chunked=True)
            assert mx.array_equal(tokens, chunked).item()
            entry["tokens"] = tokens.tolist()
            top2 = mx.sort(step_logits, axis=-1)[:, -2:]
            gap = (top2[:, 1] - top2[:, 0]).min().item()
            print(f"gemma3_pan_and_scan: greedy {entry['tokens']} ({len(set(entry['tokens']))} distinct, "
                  f"top-2 gap >= {gap:.3g}) over {len(ids)} prompt ids")
            if len(set(entry["tokens"])) < 4:
                sys.exit(f"gemma3_pan_and_scan: seed {args.seed}: greedy tokens barely vary")
        manifest.append(entry)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"gemma3_pan_and_scan: {len(manifest)} cases in {out}")


if __name__ == "__main__":
    main()
