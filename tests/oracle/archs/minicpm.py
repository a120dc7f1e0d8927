"""minicpm conformance cases (mlx-lm `models/minicpm.py`): a llama-shaped decoder with the
embeddings scaled by `scale_emb`, each residual branch by `scale_depth / sqrt(num_hidden_layers)`
and the final hidden state divided by `hidden_size / dim_model_base` before an untied `lm_head`.

The scalings are chosen away from 1 (embeddings x2.5, branches x0.81, head input /2), so an
engine that drops any of them diverges. mlx-lm's own loader cannot load `tie_word_embeddings:
true` (its sanitize adds an `lm_head.weight` the model has no place for), so every case is untied.
"""
import make_fixtures as mf

HIDDEN = 64
DIM_MODEL_BASE = 32  # hidden / dim_model_base = 2


def config(**overrides) -> dict:
    cfg = {
        "model_type": "minicpm",
        "architectures": ["MiniCPMForCausalLM"],
        "hidden_size": HIDDEN,
        "dim_model_base": DIM_MODEL_BASE,
        "num_hidden_layers": 3,
        "intermediate_size": 2 * HIDDEN,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": mf.VOCAB_SIZE,
        "max_position_embeddings": 256,
        "scale_depth": 1.4,
        "scale_emb": 2.5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    return [
        {"name": "minicpm_f32", "config": config(), "variant": "f32"},
        {"name": "minicpm_bf16", "config": config(), "variant": "bf16"},
        {"name": "minicpm_q4g64", "config": config(), "variant": "q4g64"},
        {"name": "minicpm_mxfp8", "config": config(), "variant": "mxfp8"},
        # Dynamic NTK rope scaling (as MiniCPM's long-context checkpoints use): the base changes
        # once prompt + generation pass max_position_embeddings (40 + 32 > 48); small prefill
        # chunks cross that point mid-prompt.
        {"name": "minicpm_rope_dynamic_f32", "variant": "f32", "prompt_len": 40, "prefill_step_size": 16,
         "config": config(rope_scaling={"type": "dynamic", "factor": 2.0}, max_position_embeddings=48)},
    ]


def peaky(path, p, prof, key):
    """The head sees the final hidden state divided by hidden / dim_model_base: scale its rows up
    by the same factor so the logits keep the shared profile's spread."""
    if path == "lm_head.weight":
        mx = mf.mx
        return p * (prof["head"] / mx.sqrt(mx.mean(p * p) * p.shape[-1])) * (HIDDEN / DIM_MODEL_BASE)
    return None
