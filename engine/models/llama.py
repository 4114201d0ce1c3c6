"""Llama (also SmolLM2 and Llama-3 with rope scaling): plain q/k/v projections."""

import functools

from engine.models.config import ModelConfig, config_from_hf
from engine.models.decoder import Family, project, split_heads


def project_qkv(qkv, p, cfg: ModelConfig):
    """q f32[T, H, D], k and v f32[T, Hkv, D] from the fused projection f32[T, (H + 2 Hkv) D]."""
    q, k, v = project(qkv, cfg)
    return (
        split_heads(q, cfg.num_heads),
        split_heads(k, cfg.num_kv_heads),
        split_heads(v, cfg.num_kv_heads),
    )


TRAITS = dict(default_theta=10000.0)
FAMILY = Family(
    name="llama",
    config_from_hf=functools.partial(config_from_hf, family="llama", **TRAITS),
    project_qkv=project_qkv,
    traits=TRAITS,
)
