"""Tasks: what a checkpoint computes, decided once at load along two axes, its backbone and its
head (`engine.tasks.base.Task`), and asked of everywhere the kinds of model differ. A new head
is one module and one line in `HEADS`."""

from engine.models import ModelConfig
from engine.tasks.backbones import Backbone, Decoder, Encoder, backbone_for
from engine.tasks.base import Task
from engine.tasks.classifier import Classifier
from engine.tasks.colbert import ColBERT
from engine.tasks.head import Head
from engine.tasks.label_scores import LabelScores
from engine.tasks.m3 import M3
from engine.tasks.outputs import scores_from_logprobs
from engine.tasks.pooler import Pooler
from engine.tasks.splade import Splade

# exactly one fits a config
HEADS: tuple[type[Head], ...] = (LabelScores, Classifier, Pooler, Splade, M3, ColBERT)


def task_for(config: ModelConfig) -> Task:
    """The task of a checkpoint of `config`: its backbone, and the one head that fits it."""
    (head,) = [kind for kind in HEADS if kind.fits(config)]
    backbone = backbone_for(config)
    return Task(config, backbone, head(config, backbone))


__all__ = [
    "HEADS",
    "M3",
    "Backbone",
    "Classifier",
    "ColBERT",
    "Decoder",
    "Encoder",
    "Head",
    "LabelScores",
    "Pooler",
    "Splade",
    "Task",
    "scores_from_logprobs",
    "task_for",
]
