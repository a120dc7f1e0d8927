"""smollm3 conformance cases (mlx-lm `models/smollm3.py`): llama with rotary positions switched
off in some layers. mlx-lm's rule: `no_rope_layers[i]` truthy = layer i uses rope; when the list
is absent, layer i uses rope unless (i + 1) % no_rope_layer_interval == 0 (default interval 4).
"""
import make_fixtures as mf

HIDDEN = 64


def config(**overrides) -> dict:
    cfg = {
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "hidden_size": HIDDEN,
        # 4 layers at the default interval 4: layers 0-2 rotate, layer 3 does not.
        "num_hidden_layers": 4,
        "intermediate_size": 2 * HIDDEN,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": mf.VOCAB_SIZE,
        "max_position_embeddings": 256,
        "rope_theta": 5000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    return [
        {"name": "smollm3_f32", "config": config(), "variant": "f32"},
        {"name": "smollm3_bf16", "config": config(), "variant": "bf16"},
        {"name": "smollm3_q4g64", "config": config(), "variant": "q4g64"},
        {"name": "smollm3_nvfp4", "config": config(), "variant": "nvfp4"},
        # Interval 2 with 3 layers: layer 1 skips rope, layers 0 and 2 rotate.
        {"name": "smollm3_interval2_f32", "variant": "f32",
         "config": config(num_hidden_layers=3, no_rope_layer_interval=2)},
        # An explicit list (wins over the interval): only layer 0 rotates; untied head.
        {"name": "smollm3_list_untied_f32", "variant": "f32",
         "config": config(num_hidden_layers=3, no_rope_layers=[1, 0, 0], tie_word_embeddings=False)},
    ]
