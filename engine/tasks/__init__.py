"""Tasks: what a checkpoint computes, decided once at load and asked of everywhere the kinds of
model differ (`engine.tasks.base.Task`). A new kind is one module and one line in `KINDS`."""

from engine.models import ModelConfig
from engine.tasks.base import Task
from engine.tasks.classifier import Classifier
from engine.tasks.cross_encoder import CrossEncoder
from engine.tasks.embedder import DecoderEmbedder, Embedder, EncoderEmbedder
from engine.tasks.language_model import LanguageModel
from engine.tasks.outputs import scores_from_logprobs

KINDS: tuple[type[Task], ...] = (
    EncoderEmbedder,
    DecoderEmbedder,
    CrossEncoder,
    Classifier,
    LanguageModel,
)


def task_for(config: ModelConfig) -> Task:
    """The task of a checkpoint of `config`: the first kind in `KINDS` that fits it."""
    return next(kind(config) for kind in KINDS if kind.fits(config))


__all__ = [
    "KINDS",
    "Classifier",
    "CrossEncoder",
    "DecoderEmbedder",
    "Embedder",
    "EncoderEmbedder",
    "LanguageModel",
    "Task",
    "scores_from_logprobs",
    "task_for",
]
