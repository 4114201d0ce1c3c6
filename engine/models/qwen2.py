"""Qwen2: Llama's layout plus biases on the q/k/v projections."""

import functools

from engine.models.config import ModelConfig, config_from_hf
from engine.models.decoder import Family, project, split_heads


def project_qkv(qkv, p, cfg: ModelConfig):
    """q f32[T, H, D], k and v f32[T, Hkv, D] from the fused projection f32[T, (H + 2 Hkv) D]."""
    q, k, v = project(qkv, cfg)
    return (
        split_heads(q + p["bq"], cfg.num_heads),
        split_heads(k + p["bk"], cfg.num_kv_heads),
        split_heads(v + p["bv"], cfg.num_kv_heads),
    )


TRAITS = dict(default_theta=1e6, qkv_bias=True)
FAMILY = Family(
    name="qwen2",
    config_from_hf=functools.partial(config_from_hf, family="qwen2", **TRAITS),
    project_qkv=project_qkv,
    traits=TRAITS,
)
