"""The oracle for mlex's Gemma 3 vision tower and multimodal projector: mlx-vlm's own on tiny weights.

Builds mlx-vlm's gemma3 VisionModel (SigLIP) and Gemma3MultiModalProjector on a tiny config, gives
every parameter random float32 values, runs the vision part of mlx-vlm's gemma3
`Model.get_input_embeddings` on random pixel values and writes into OUT_DIR:

    config.json                  a gemma3 checkpoint's config.json (nested vision_config/text_config)
    model.safetensors            the parameters, named as mlx-vlm's full gemma3 Model holds them
                                 ("vision_tower.…", "multi_modal_projector.…"), the patch
                                 embedding's conv weight in MLX layout [out, kh, kw, in]
    model_torch_conv.safetensors the same, but that conv weight in PyTorch layout [out, in, kh, kw]
                                 (as Hugging Face checkpoints hold it; mlx-vlm's sanitize takes both)
    io.safetensors               pixel_values [2, 3, 32, 32] (NCHW, as HF processors give them),
                                 tower [2, 64, 32] (the tower's output, post_layernorm applied),
                                 features [2, 16, 48] (the projector's output, before mlx-vlm divides
                                 it by sqrt(hidden_size) to scatter it into the text embeddings)

    python tests/oracle/gemma3_vision.py OUT_DIR [--seed N]

mlx-vlm is installed without its dependencies (scripts/setup-oracle.sh), so nothing here may run
mlx_vlm/__init__.py or mlx_vlm/models/gemma3/__init__.py: the packages are stubbed in sys.modules
with their real __path__, and only the model files are imported.

What mlx-vlm 0.7.10 does that a port might not: the tower's post_layernorm is nn.LayerNorm with its
default eps 1e-5 (the encoder's layer norms take layer_norm_eps, 1e-6; Hugging Face's SigLIP uses
layer_norm_eps for all); the projector's RMSNorm scales by (1 + weight) with eps layer_norm_eps; the
MLP's GELU is nn.GELU(approx="precise"), which in MLX is the tanh approximation (gelu_approx), not
the exact erf one; mm_tokens_per_image is read from text_config.
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
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402


def import_mlx_vlm_gemma3():
    """mlx-vlm's gemma3 vision, config and projector modules, without its package __init__ files.

    find_spec on a top-level package locates it without executing it. The stub packages carry the
    real __path__, so `from ..base import …` inside the model files resolves to the installed files
    (mlx_vlm/models/base.py, attention.py, mlp.py, cache.py, rope_utils.py, ../turboquant.py: these
    import only mlx, numpy and PIL). gemma3.py imports processing_gemma3.py, which imports
    transformers (pinned in the venv) and patches transformers' AutoProcessor at import: harmless
    here. Nothing else needed stubbing.
    """
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gemma3_vision: mlx-vlm is not installed (run scripts/setup-oracle.sh)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in [
        ("mlx_vlm", root),
        ("mlx_vlm.models", os.path.join(root, "models")),
        ("mlx_vlm.models.gemma3", os.path.join(root, "models", "gemma3")),
    ]:
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [path]
            mod.__package__ = name
            mod.__file__ = os.path.join(path, "__init__.py")
            sys.modules[name] = mod
    vision = importlib.import_module("mlx_vlm.models.gemma3.vision")
    config = importlib.import_module("mlx_vlm.models.gemma3.config")
    gemma3 = importlib.import_module("mlx_vlm.models.gemma3.gemma3")
    return vision, config, gemma3


VISION_CONFIG = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "patch_size": 4,
    "image_size": 32,  # 8x8 = 64 patches
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}

TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 48,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 64,
    "rms_norm_eps": 1e-6,
    # mlx-vlm reads it from text_config (default 256); Hugging Face's Gemma3Config holds it at the
    # top level. Written in both places, the same.
    "mm_tokens_per_image": 16,  # 4x4 tokens: an average pool of 2x2 patches
}


def random_parameters(module, prefix):
    """A random float32 value for every parameter of `module` (in sorted-name order, so the values
    depend only on the seed), as a flat {full name: array} dict and applied to the module."""
    flat = sorted(tree_flatten(module.parameters()), key=lambda kv: kv[0])
    new = []
    for name, p in flat:
        noise = 0.1 * mx.random.normal(p.shape, dtype=mx.float32)
        leaf = name.rsplit(".", 1)
        if name.startswith("mm_soft_emb_norm."):
            value = noise  # gemma3's RMSNorm scales by (1 + weight)
        elif len(leaf) == 2 and ("layer_norm" in leaf[0] or "layernorm" in leaf[0]) and leaf[1] == "weight":
            value = 1.0 + noise
        else:
            value = noise  # linear / conv weights and biases, LayerNorm biases, position embedding
        new.append((name, value))
    module.update(tree_unflatten(new))
    mx.eval(module.parameters())
    names = {n for n, _ in tree_flatten(module.parameters())}
    assert names == {n for n, _ in new}, (names, [n for n, _ in new])
    return {prefix + n: v for n, v in new}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    vision, config, gemma3 = import_mlx_vlm_gemma3()
    vision_config = config.VisionConfig.from_dict(VISION_CONFIG)
    text_config = config.TextConfig.from_dict(TEXT_CONFIG)
    model_config = config.ModelConfig(text_config=text_config, vision_config=vision_config, model_type="gemma3")

    mx.random.seed(args.seed)
    tower = vision.VisionModel(vision_config)
    projector = gemma3.Gemma3MultiModalProjector(model_config)
    weights = {}
    weights.update(random_parameters(tower, "vision_tower."))
    weights.update(random_parameters(projector, "multi_modal_projector."))
    conv = "vision_tower.vision_model.embeddings.patch_embedding.weight"
    torch_weights = dict(weights)
    torch_weights[conv] = mx.contiguous(weights[conv].transpose(0, 3, 1, 2))
    # mlx-vlm's loader passes every weight through VisionModel.sanitize, which guesses the conv
    # layout from the shape (check_array_shape): it must take both files to the same tensors.
    for w in (weights, torch_weights):
        s = tower.sanitize(w)
        assert s.keys() == weights.keys() and all(mx.array_equal(s[k], weights[k]).item() for k in s)

    pixel_values = mx.random.uniform(-1.0, 1.0, (2, 3, 32, 32), dtype=mx.float32)
    # Model.get_input_embeddings, the vision part (the cast is to the text embeddings' dtype:
    # float32 here).
    hidden_state, _, _ = tower(pixel_values.transpose(0, 2, 3, 1).astype(mx.float32), output_hidden_states=True)
    features = projector(hidden_state)
    mx.eval(hidden_state, features)
    assert hidden_state.shape == (2, 64, 32) and hidden_state.dtype == mx.float32, hidden_state
    assert features.shape == (2, 16, 48) and features.dtype == mx.float32, features

    os.makedirs(args.out_dir, exist_ok=True)
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "image_token_index": model_config.image_token_index,
        "mm_tokens_per_image": TEXT_CONFIG["mm_tokens_per_image"],
        "text_config": TEXT_CONFIG,
        "vision_config": VISION_CONFIG,
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    mx.save_safetensors(os.path.join(args.out_dir, "model.safetensors"), weights)
    mx.save_safetensors(os.path.join(args.out_dir, "model_torch_conv.safetensors"), torch_weights)
    mx.save_safetensors(
        os.path.join(args.out_dir, "io.safetensors"),
        {"pixel_values": pixel_values, "tower": hidden_state, "features": features},
    )
    print(
        f"gemma3_vision: seed {args.seed}: {len(weights)} tensors, pixel_values {tuple(pixel_values.shape)} -> "
        f"tower {tuple(hidden_state.shape)} -> features {tuple(features.shape)} "
        f"(|features| max {mx.abs(features).max().item():.4g}) in {args.out_dir}"
    )


if __name__ == "__main__":
    main()
