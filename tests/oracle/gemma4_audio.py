"""The oracle for mlex's Gemma 4 audio input: mlx-vlm 0.7.10's feature extractor, audio tower and greedy decode.

Builds mlx-vlm's full gemma4 `Model` (the text and vision configs of gemma4_vlm.py, plus a tiny
`audio_config`: 2 conformer blocks of width 32, chunks of 4 with 4 keys back and 2 ahead, gradient
clipping at 4) on random float32 weights (the clippable linears' bounds set to finite values that
clip), writes a 16 kHz mono 16-bit WAV it synthesizes (two tones and noise, 1.3 s), and reads it
back as float32 samples (int16 / 32768: what a WAV reader gives). Then:

- features: mlx-vlm's Gemma4AudioFeatureExtractor (defaults: 128 mel bins, 20 ms frames, 10 ms
  hop) on that waveform and on a second, random one of 0.37 s (odd length, padding at its end);
- tower: `audio_tower(features, ~mask)` and `embed_audio` of it, for both waveforms;
- the prompt: mlx-vlm's own Gemma4Processor.__call__ (on a stand-in holding the feature extractor
  and a byte-level tokenizer: bytes as themselves, the special tokens as their ids) expands the
  `<|audio|>` of "listen: <|audio|> what is it?" into boa + the audio token × ceil(ms / 40) + eoa;
- greedy: 32 tokens for that prompt, as gemma4_vlm.py's `greedy` drives the model
  (get_input_embeddings with input_features / input_features_mask, then the language model).

Writes into OUT_DIR: config.json, processor_config.json (the feature extractor's defaults spelled
out), model.safetensors, clip.wav, and io.safetensors holding wave_a [N] f32 (the WAV's samples),
features_a [T, 128] f32, mask_a [T] int32, tower_a [T', 24] f32, rows_a [T', 48] f32, the same
for wave_b / …_b, input_ids [1, L] int32, logits0 [320] f32, tokens [32] int32.

    python tests/oracle/gemma4_audio.py OUT_DIR [--seed N]

What mlx-vlm does that a port might not:
- the number of audio tokens comes from the waveform's duration, not from the tower's rows: when
  it is larger (a clip whose length is not a multiple of 640 samples can give one more token than
  rows), masked_scatter wraps around to the first rows (`indices % source.size`);
- with several clips in one prompt, the feature extractor pads them all to the longest and the
  scatter takes rows from the flattened batch in order: a clip shorter than the longest hands its
  padding rows to the next clip's tokens. mlex encodes each clip alone (the rows of its own);
  this oracle holds one clip per prompt, where the two agree.
"""

import argparse
import json
import os
import sys
import types
import warnings
import wave

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message="At least one mel filter has all zero values")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import importlib  # noqa: E402

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from gemma4_vision import import_mlx_vlm_gemma4  # noqa: E402
from gemma4_vlm import TEXT_CONFIG, VISION_CONFIG, greedy, random_parameters  # noqa: E402

IMAGE_TOKEN, BOI, EOI, AUDIO_TOKEN, BOS, BOA, EOA = 300, 301, 302, 303, 305, 307, 308
SPECIAL = {"<|image|>": IMAGE_TOKEN, "<|image>": BOI, "<image|>": EOI, "<|audio|>": AUDIO_TOKEN,
           "<bos>": BOS, "<|audio>": BOA, "<audio|>": EOA}

AUDIO_CONFIG = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 4],
    "conv_kernel_size": 5,
    "residual_weight": 0.5,
    "attention_chunk_size": 4,
    "attention_context_left": 5,
    "attention_context_right": 2,
    "attention_logit_cap": 50.0,
    "attention_invalid_logits_value": -1e9,
    "rms_norm_eps": 1e-6,
    "gradient_clipping": 4.0,
    "output_proj_dims": 24,
}


class ByteTokenizer:
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


def write_wav(path, samples_i16, rate):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples_i16.astype("<i2").tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    mods = import_mlx_vlm_gemma4()
    audio_mod = importlib.import_module("mlx_vlm.models.gemma4.audio")  # noqa: F841 (gemma4 imports it)
    fe_mod = importlib.import_module("mlx_vlm.models.gemma4.audio_feature_extractor")
    pg = mods["processing_gemma4"]
    cfg = mods["config"]
    model_config = cfg.ModelConfig(
        text_config=cfg.TextConfig.from_dict(TEXT_CONFIG),
        vision_config=cfg.VisionConfig.from_dict(VISION_CONFIG),
        audio_config=cfg.AudioConfig.from_dict(AUDIO_CONFIG),
        image_token_id=IMAGE_TOKEN,
        boi_token_id=BOI,
        eoi_token_id=EOI,
        audio_token_id=AUDIO_TOKEN,
        boa_token_id=BOA,
        eoa_token_id=EOA,
        video_token_id=None,
        vocab_size=320,
        hidden_size=48,
    )
    mx.random.seed(args.seed)
    model = mods["gemma4"].Model(model_config)
    weights = random_parameters(model)
    # The clippable linears' bounds: finite, and tight enough to clip some values.
    rng = np.random.default_rng(args.seed)
    for name in list(weights):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("input_min", "output_min"):
            weights[name] = mx.array(-float(rng.uniform(0.8, 1.6)), dtype=mx.float32)
        elif leaf in ("input_max", "output_max"):
            weights[name] = mx.array(float(rng.uniform(0.8, 1.6)), dtype=mx.float32)
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    assert set(model.sanitize(weights)) == set(weights)
    assert any("audio_tower" in k and k.endswith("input_min") for k in weights)

    os.makedirs(args.out_dir, exist_ok=True)
    rate = 16000
    t = np.arange(int(1.3 * rate)) / rate
    tone = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.05 * rng.standard_normal(t.size)
    pcm = np.clip(np.round(tone * 32767), -32768, 32767).astype(np.int16)
    write_wav(os.path.join(args.out_dir, "clip.wav"), pcm, rate)
    wave_a = pcm.astype(np.float32) / 32768.0
    wave_b = (0.3 * rng.standard_normal(5923)).astype(np.float32)

    fe = fe_mod.Gemma4AudioFeatureExtractor()
    out = {}
    for tag, w in [("a", wave_a), ("b", wave_b)]:
        r = fe(w)
        feats = np.asarray(r["input_features"][0], dtype=np.float32)
        mask = np.asarray(r["input_features_mask"][0]).astype(bool)
        f = mx.array(feats)[None]
        m = mx.array(mask)[None]
        enc, _ = model.audio_tower(f, ~m)
        rows = model.embed_audio(enc)
        out[f"wave_{tag}"] = mx.array(w)
        out[f"features_{tag}"] = mx.array(feats)
        out[f"mask_{tag}"] = mx.array(mask.astype(np.int32))
        out[f"tower_{tag}"] = enc[0]
        out[f"rows_{tag}"] = rows[0]

    stand_in = types.SimpleNamespace(
        feature_extractor=fe,
        audio_token="<|audio|>",
        boa_token="<|audio>",
        eoa_token="<audio|>",
        audio_seq_length=750,
        audio_ms_per_token=40,
        image_token_id=IMAGE_TOKEN,
        video_token_id=None,
        audio_token_id=AUDIO_TOKEN,
        tokenizer=ByteTokenizer(),
    )
    stand_in._compute_audio_num_tokens = types.MethodType(pg.Gemma4Processor._compute_audio_num_tokens, stand_in)
    inputs = pg.Gemma4Processor.__call__(stand_in, text=["listen: <|audio|> what is it?"], audio=[wave_a])
    ids = [BOS] + [int(x) for x in np.asarray(inputs["input_ids"])[0]]
    n = ids.count(AUDIO_TOKEN)
    assert n == 33, n  # ceil(1300 ms / 40)
    input_ids = mx.array([ids], dtype=mx.int32)
    audio = {"input_features": inputs["input_features"], "input_features_mask": inputs["input_features_mask"]}
    logits0, tokens = greedy(model, input_ids, None, chunked=False, video=audio)
    silent, _ = greedy(model, input_ids, None, chunked=False)
    assert mx.abs(silent - logits0).max().item() > 1e-3, "the audio's rows change nothing"
    _, chunked = greedy(model, input_ids, None, chunked=True, video=audio)
    assert chunked == tokens, (chunked, tokens)
    assert len(set(tokens)) > 4, f"greedy decoding repeats: {tokens}"

    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "image_token_id": IMAGE_TOKEN,
        "boi_token_id": BOI,
        "eoi_token_id": EOI,
        "audio_token_id": AUDIO_TOKEN,
        "boa_token_id": BOA,
        "eoa_token_id": EOA,
        "vocab_size": 320,
        "hidden_size": 48,
        "tie_word_embeddings": True,
        "text_config": TEXT_CONFIG,
        "vision_config": VISION_CONFIG,
        "audio_config": AUDIO_CONFIG,
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "processor_config.json"), "w") as f:
        json.dump({"image_processor": {"patch_size": 4, "max_soft_tokens": 20, "pooling_kernel_size": 2},
                   "feature_extractor": {"feature_size": 128, "sampling_rate": 16000, "frame_length_ms": 20.0,
                                         "hop_length_ms": 10.0, "mel_floor": 0.001,
                                         "feature_extractor_type": "Gemma4AudioFeatureExtractor"},
                   "audio_seq_length": 750, "audio_ms_per_token": 40}, f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    out.update({"input_ids": input_ids, "logits0": logits0.astype(mx.float32), "tokens": mx.array(tokens, dtype=mx.int32)})
    mx.save_safetensors(os.path.join(args.out_dir, "io.safetensors"), out)
    print(f"gemma4_audio: seed {args.seed}: {len(ids)} prompt ids ({n} audio tokens), tokens {tokens} in {args.out_dir}")


if __name__ == "__main__":
    main()
