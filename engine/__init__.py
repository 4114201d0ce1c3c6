"""An LLM scoring engine: prefill-only label log-probs for query/item pairs."""

from engine.engine import (
    Engine,
    EngineClosed,
    EngineConfig,
    EngineError,
    EngineOverloaded,
    EngineStats,
    RerankResult,
    ScoreResult,
    open_engine,
)
from engine.inputs import InputTooLarge
from engine.loaders import Checkpoint, CheckpointError, load_checkpoint
from engine.scoring import ScoringModel, load_model

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "EngineOverloaded",
    "EngineStats",
    "InputTooLarge",
    "RerankResult",
    "ScoreResult",
    "ScoringModel",
    "load_checkpoint",
    "load_model",
    "open_engine",
]
