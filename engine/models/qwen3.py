"""Qwen3: no projection biases, RMSNorm over each q and k head before RoPE."""

import functools

from engine.models import llama
from engine.models.config import ModelConfig, config_from_hf
from engine.models.decoder import Family, rms_norm


def project_qkv(qkv, p, cfg: ModelConfig):
    """q f32[T, H, D], k and v f32[T, Hkv, D] from the fused projection f32[T, (H + 2 Hkv) D]."""
    q, k, v = llama.project_qkv(qkv, p, cfg)
    return rms_norm(q, p["q_norm"], cfg.norm_eps), rms_norm(k, p["k_norm"], cfg.norm_eps), v


TRAITS = dict(default_theta=1e6, qk_norm=True)
FAMILY = Family(
    name="qwen3",
    config_from_hf=functools.partial(config_from_hf, family="qwen3", **TRAITS),
    project_qkv=project_qkv,
    traits=TRAITS,
)
