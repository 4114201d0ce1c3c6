"""Llama (also SmolLM2 and Llama-3 with rope scaling): plain q/k/v projections."""

import functools

from engine.models.config import ModelConfig, config_from_hf
from engine.models.decoder import Family, matmul, split_heads


def project_qkv(h, p, cfg: ModelConfig):
    """q f32[T, H, D], k and v f32[T, Hkv, D] from the normed hidden state h f32[T, E]."""
    q = split_heads(matmul(h, p["wq"]), cfg.num_heads)
    k = split_heads(matmul(h, p["wk"]), cfg.num_kv_heads)
    v = split_heads(matmul(h, p["wv"]), cfg.num_kv_heads)
    return q, k, v


FAMILY = Family(
    name="llama",
    config_from_hf=functools.partial(config_from_hf, family="llama", default_theta=10000.0),
    project_qkv=project_qkv,
)
