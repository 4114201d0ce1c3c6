"""An LLM scoring engine: prefill-only label log-probs for query/item pairs."""

from engine.config import EngineConfig
from engine.device.program import DenseChoice, DeviceProgram
from engine.engine import Engine, open_engine
from engine.errors import (
    EngineClosed,
    EngineError,
    EngineOverloaded,
    InputTooLarge,
    InvalidInput,
    Unsupported,
)
from engine.loaders import (
    Checkpoint,
    CheckpointError,
    default_embedder_path,
    default_model_path,
    load_checkpoint,
)
from engine.messages import Timings
from engine.offline import ScoringModel, load_model
from engine.results import (
    EmbedResult,
    EngineInfo,
    EngineStats,
    HybridEmbedResult,
    KVPoolInfo,
    MultiVectorResult,
    RerankHit,
    RerankResult,
    ScoreResult,
    SparseEmbedResult,
    SparseVector,
    TokenEmbedResult,
)

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DenseChoice",
    "DeviceProgram",
    "EmbedResult",
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "EngineInfo",
    "EngineOverloaded",
    "EngineStats",
    "HybridEmbedResult",
    "InputTooLarge",
    "InvalidInput",
    "KVPoolInfo",
    "MultiVectorResult",
    "RerankHit",
    "RerankResult",
    "ScoreResult",
    "ScoringModel",
    "SparseEmbedResult",
    "SparseVector",
    "Timings",
    "TokenEmbedResult",
    "Unsupported",
    "default_embedder_path",
    "default_model_path",
    "load_checkpoint",
    "load_model",
    "open_engine",
]
