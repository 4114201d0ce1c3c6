"""Model families: each a config parser and a q/k/v projection over the shared decoder, or
(cross-encoders) over the shared encoder. Which forward and parameter layout a checkpoint runs
is its task's (`engine.tasks`)."""

from engine.models import bert, distilbert, gemma, llama, modernbert, qwen2, qwen3, xlm_roberta
from engine.models.config import ModelConfig, RopeScaling
from engine.models.decoder import Dense, Family, PackedInputs

DECODERS = (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, *gemma.FAMILIES)
ENCODERS = (bert.FAMILY, xlm_roberta.FAMILY, modernbert.FAMILY, distilbert.FAMILY)
FAMILIES: dict[str, Family] = {f.name: f for f in (*DECODERS, *ENCODERS)}
MODEL_TYPES = {**{name: name for name in FAMILIES}, "gemma3_text": "gemma3"}  # config.json's


__all__ = [
    "FAMILIES",
    "MODEL_TYPES",
    "Dense",
    "Family",
    "ModelConfig",
    "PackedInputs",
    "RopeScaling",
]
