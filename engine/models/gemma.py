"""Gemma (the first generation): Llama's layout with embeddings scaled by sqrt(hidden_size), a
GeGLU MLP (tanh-approximated GELU) and RMSNorm weights applied as `1 + w` (the loader adds the
one, so the forward's norm is the shared one). Tied embeddings unless the config says not."""

from engine.models import llama
from engine.models.config import config_from_hf
from engine.models.decoder import Family

ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}  # Gemma's GELU is tanh's


def config(hf: dict):
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_activation {act!r} for gemma")
    return config_from_hf(
        hf,
        family="gemma",
        default_theta=10000.0,
        tie_default=True,
        embed_scale=True,
        mlp_activation=ACTIVATIONS[act],
    )


FAMILY = Family(name="gemma", config_from_hf=config, project_qkv=llama.project_qkv)
NORMS_PLUS_ONE = ("attn_norm", "mlp_norm", "final_norm")  # stored as w; applied as 1 + w
