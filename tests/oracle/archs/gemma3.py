"""gemma3 conformance cases (mlx-lm `models/gemma3_text.py`, and `models/gemma3.py` for the
multimodal wrapper): sliding-window layers (window 8, local rope base) alternating with global
layers (rope_theta with linear rope scaling), softmax scale query_pre_attn_scalar^-0.5 with
query_pre_attn_scalar != head_dim, `1 + w` RMSNorms before and after attention and MLP, q/k
norms, a GeGLU MLP, embeddings times sqrt(hidden) rounded to bf16 (hidden 136 in the f32 case,
where that rounding shows: sqrt(136) = 11.662 -> 11.6875), and tied embeddings.

Prompts of 40 tokens prefilled in chunks of 16 cross the window of 8 and the chunk borders.
`gemma3_*` cases nest the text model in `text_config` (weights under `language_model.`, heads
left to the wrapper's defaults of 8 / 4) and carry vision-tower and projector tensors, which
mlx-lm's sanitize drops and so must the engine.

Gains (`peaky`): with norms after each branch, the norms alone set the gains. Gemma stores norm
weights as w in `x * (1 + w)`, so the effective gains are: input / pre-feedforward / final norms
~1, post-attention / post-feedforward norms ~prof["resid"] * prof["head"]^2 (layers outweigh the
embedding), q/k norms ~QK_GAIN (position-dependent attention); embedding and head rows of norm
prof["head"].

Tied embeddings: mlx-lm always builds an `lm_head` and ties only when the checkpoint has no
`lm_head.weight` (its sanitize), so a tied checkpoint is one saved without it: `before_save`
drops `lm_head` for every case but the `untied` ones, and adds the vision tensors to the wrapper
cases (files only; the oracle reloads them with its unmodified loader).
"""

import mlx.core as mx

import make_fixtures as mf

UNTIED = {"gemma3_text_untied_f32"}
# Gain of the q/k norms for every dtype (the bf16 profile's; the f32 profile's 6 makes these
# models' attention so sharp that merely applying the softmax scale to k instead of q inside
# mlx-lm moves its own f32 logprobs by 5e-4, half the tolerance).
QK_GAIN = 2.0
# text_config fields the gemma3 cases leave to the wrapper's defaults.
WRAPPER_DEFAULTS = ("num_attention_heads", "num_key_value_heads")


def text_config(hidden: int = 64, **overrides) -> dict:
    cfg = {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": 4,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "rms_norm_eps": 1e-6,
        "vocab_size": mf.VOCAB_SIZE,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 256,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def wrapper_config() -> dict:
    text = text_config(head_dim=16, query_pre_attn_scalar=32)
    # Heads left to gemma3's defaults (8 query heads, 4 KV heads), as Google's configs do.
    for k in (*WRAPPER_DEFAULTS, "architectures"):
        del text[k]
    return {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text,
        "vocab_size": mf.VOCAB_SIZE,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }


def cases() -> list[dict]:
    long = {"prompt_len": 40, "prefill_step_size": 16}
    return [
        {"name": "gemma3_text_f32", "config": text_config(hidden=136), "variant": "f32", **long},
        {"name": "gemma3_text_bf16", "config": text_config(), "variant": "bf16", **long},
        {"name": "gemma3_text_q4g64", "config": text_config(), "variant": "q4g64", **long},
        {"name": "gemma3_text_mxfp8", "config": text_config(), "variant": "mxfp8", **long},
        # Own lm_head, one global layer in three (layer 2), no rope scaling, the short prompt.
        {"name": "gemma3_text_untied_f32", "variant": "f32",
         "config": text_config(sliding_window_pattern=3, rope_scaling=None)},
        {"name": "gemma3_f32", "config": wrapper_config(), "variant": "f32", **long},
        {"name": "gemma3_q4g64", "config": wrapper_config(), "variant": "q4g64", **long},
    ]


def peaky(path: str, p: mx.array, prof: dict, key: mx.array):
    jitter = mf.NORM_JITTER * mx.random.normal(p.shape, key=key)
    if path.endswith(("q_norm.weight", "k_norm.weight")):
        return QK_GAIN * (1.0 + jitter) - 1.0
    if path.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
        # The input embedding has RMS prof["head"] (rows of norm prof["head"], times sqrt(hidden)),
        # and with tied embeddings the input token's own logit grows with its share of the stream
        # times its row norm: head^2. Branch gains of resid * head^2 keep that echo as weak in bf16
        # (head 3) as in f32 (head 1.5); with resid * head, bf16 models repeat their input token.
        return prof["resid"] * prof["head"] ** 2 * (1.0 + jitter) - 1.0
    if path.endswith("norm.weight"):
        return jitter
    if path.endswith(("embed_tokens.weight", "lm_head.weight")):
        return p * (prof["head"] / mx.sqrt(mx.mean(p * p) * p.shape[-1]))
    # Projections: every branch is normed before and after, so their scale does not matter.
    return p


def before_save(name: str, model) -> None:
    """What a real checkpoint of this case holds: no lm_head when tied, a vision side for gemma3."""
    wrapped = "language_model" in model
    text = model["language_model"] if wrapped else model
    if name not in UNTIED and "lm_head" in text:
        text.pop("lm_head")
    if wrapped:
        # gemma3's ModelArgs writes its head defaults into the text_config it was given (the very
        # dict make_fixtures saves next): take them out again, so config.json relies on them.
        for k in WRAPPER_DEFAULTS:
            model.args.text_config.pop(k, None)
        model["vision_tower"] = {"vision_model": {"post_layernorm": {"weight": mx.ones((8,))}}}
        model["multi_modal_projector"] = {"mm_input_projection_weight": mx.zeros((8, 4))}
