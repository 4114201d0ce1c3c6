"""An LLM scoring engine: prefill-only label log-probs for query/item pairs."""

from engine.loaders import Checkpoint, CheckpointError, load_checkpoint
from engine.scoring import ScoringModel, load_model

__all__ = ["Checkpoint", "CheckpointError", "ScoringModel", "load_checkpoint", "load_model"]
