"""Gemma, Gemma 2 and Gemma 3 (text) over the shared decoder.

Gemma: Llama's layout with embeddings scaled by sqrt(hidden_size), a GeGLU MLP (tanh GELU) and
RMSNorm weights applied as `1 + w` (the loader adds the one, so the forward's norm is the shared
one). Gemma 2 adds norms after the attention and MLP outputs ("sandwich" norms), a score scale
of `query_pre_attn_scalar ** -0.5`, soft-capped attention scores and final logits, and sliding-
window layers alternating with global ones. Gemma 3 drops the soft-capping, norms q and k per
head (as Qwen3), slides five layers in six, and gives sliding layers their own unscaled RoPE
base. Tied embeddings unless the config says not.
"""

import msgspec

from engine.models.config import ModelConfig, config_from_hf, rope_scaling_from_hf
from engine.models.decoder import Family

ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}  # Gemma's GELU is tanh's
# stored as w, applied as 1 + w: the loader adds the one (those a checkpoint has)
NORMS_PLUS_ONE = (
    *("attn_norm", "mlp_norm", "final_norm", "post_attn_norm", "post_mlp_norm"),
    *("q_norm", "k_norm"),
)


def config(hf: dict, **flags) -> ModelConfig:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_activation {act!r} for gemma")
    flags = {"family": "gemma", "default_theta": 10000.0, **flags}
    return config_from_hf(
        hf, tie_default=True, embed_scale=True, mlp_activation=ACTIVATIONS[act], **flags
    )


def sliding_layers(hf: dict, period: int) -> tuple[bool, ...]:
    """Which layers slide: `layer_types`, else all but every `period`-th (the older configs'
    `sliding_window_pattern`; Gemma 2's alternation is a period of 2)."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)
    ]
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types must name {n} sliding_attention/full_attention layers")
    return tuple(t == "sliding_attention" for t in types)


def _windows(hf: dict, period: int) -> dict:
    window = hf.get("sliding_window") or 0
    return dict(
        sliding_window=int(window),
        sliding_layers=sliding_layers(hf, period) if window else (),
        sandwich_norms=True,
        query_scale=float(hf.get("query_pre_attn_scalar") or _head_dim(hf)) ** -0.5,
    )


def _head_dim(hf: dict) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def config2(hf: dict) -> ModelConfig:
    return config(
        hf,
        family="gemma2",
        attn_softcap=float(hf.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(hf.get("final_logit_softcapping") or 0.0),
        **_windows(hf, 2),
    )


def config3(hf: dict) -> ModelConfig:
    cfg = config(
        hf,
        family="gemma3",
        default_theta=1e6,
        qk_norm=True,
        attn_softcap=float(hf.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(hf.get("final_logit_softcapping") or 0.0),
        **_windows(hf, hf.get("sliding_window_pattern") or 6),
    )
    theta, scaling, local = _rope3(hf)
    return msgspec.structs.replace(
        cfg, rope_theta=theta, rope_scaling=scaling, local_rope_theta=local
    )


def _rope3(hf: dict) -> tuple[float, object, float]:
    """(global base, global scaling, local base): per layer type in `rope_parameters` (newer
    configs), else `rope_theta`, `rope_scaling` and `rope_local_base_freq`."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:
        full, local = params["full_attention"], params.get("sliding_attention") or {}
        if rope_scaling_from_hf({"rope_scaling": local}) is not None:
            raise ValueError("scaled RoPE on sliding-window layers is not supported")
        theta = float(full.get("rope_theta", 1e6))
        return (
            theta,
            rope_scaling_from_hf({"rope_scaling": full}),
            float(local.get("rope_theta", 1e4)),
        )
    theta = float(hf.get("rope_theta", params.get("rope_theta", 1e6)))
    return theta, rope_scaling_from_hf(hf), float(hf.get("rope_local_base_freq", 1e4))


FAMILY = Family(name="gemma", config_from_hf=config)
FAMILY2 = Family(name="gemma2", config_from_hf=config2)
FAMILY3 = Family(name="gemma3", config_from_hf=config3)
FAMILIES = (FAMILY, FAMILY2, FAMILY3)
NAMES = tuple(f.name for f in FAMILIES)
