"""Qwen3: no projection biases, RMSNorm over each q and k head before RoPE."""

import functools

from engine.models.config import config_from_hf
from engine.models.decoder import Family

TRAITS = dict(default_theta=1e6, qk_norm=True)
FAMILY = Family(
    name="qwen3",
    config_from_hf=functools.partial(config_from_hf, family="qwen3", **TRAITS),
    traits=TRAITS,
)
