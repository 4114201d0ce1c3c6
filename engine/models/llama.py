"""Llama (also SmolLM2 and Llama-3 with rope scaling): plain q/k/v projections."""

import functools

from engine.models.config import config_from_hf
from engine.models.decoder import Family

TRAITS = dict(default_theta=10000.0)
FAMILY = Family(
    name="llama",
    config_from_hf=functools.partial(config_from_hf, family="llama", **TRAITS),
    traits=TRAITS,
)
