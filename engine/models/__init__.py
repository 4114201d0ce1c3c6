"""Model families: each a config parser and a q/k/v projection over the shared decoder."""

from engine.models import gemma, llama, qwen2, qwen3
from engine.models.config import ModelConfig, RopeScaling
from engine.models.decoder import Dense, Family, PackedInputs, label_logprobs

FAMILIES: dict[str, Family] = {
    f.name: f for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, gemma.FAMILY)
}

__all__ = [
    "FAMILIES",
    "Dense",
    "Family",
    "ModelConfig",
    "PackedInputs",
    "RopeScaling",
    "label_logprobs",
]
