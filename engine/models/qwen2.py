"""Qwen2: Llama's layout plus biases on the q/k/v projections."""

import functools

from engine.models.config import config_from_hf
from engine.models.decoder import Family

TRAITS = dict(default_theta=1e6, qkv_bias=True)
FAMILY = Family(
    name="qwen2",
    config_from_hf=functools.partial(config_from_hf, family="qwen2", **TRAITS),
    traits=TRAITS,
)
