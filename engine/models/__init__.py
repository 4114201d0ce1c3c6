"""Model families: each a config parser and a q/k/v projection over the shared decoder."""

from engine.models import gemma, llama, qwen2, qwen3
from engine.models.config import ModelConfig, RopeScaling
from engine.models.decoder import Dense, Family, PackedInputs, label_logprobs

FAMILIES: dict[str, Family] = {
    f.name: f for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, *gemma.FAMILIES)
}
MODEL_TYPES = {**{name: name for name in FAMILIES}, "gemma3_text": "gemma3"}  # config.json's

__all__ = [
    "FAMILIES",
    "MODEL_TYPES",
    "Dense",
    "Family",
    "ModelConfig",
    "PackedInputs",
    "RopeScaling",
    "label_logprobs",
]
