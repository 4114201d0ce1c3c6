"""A decoder with a sequence-classification head (`*ForSequenceClassification`: Qwen3/Qwen2/Llama/
Gemma rerankers): the head's raw logits at each score row, no label-token scores, reranks
through the model's recipe with every label read."""

import numpy as np

from engine import templates
from engine.capabilities import Ability
from engine.kinds import Output
from engine.models import decoder
from engine.tasks.language_model import LanguageModel
from engine.tasks.outputs import classifier_relevance


class Classifier(LanguageModel):
    name = "classifier"
    head = "sequence-classification"
    outputs = (Output.LOGITS,)
    output = staticmethod(decoder.class_logits)

    @classmethod
    def fits(cls, config) -> bool:
        return not config.encoder and config.num_labels > 0

    def refusals(self) -> dict[Ability, str]:
        return super().refusals() | {Ability.SCORE: refusal(self.config, "")}

    def rerank_labels(self, template, tokenizer) -> templates.RerankLabels:
        return class_labels(self.config)

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        return labels

    def row_width(self, output: Output, labels: int) -> int:
        return labels

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        return classifier_relevance(outputs, raw)


def class_labels(config) -> templates.RerankLabels:
    """A rerank of a classification head reads every label's logit."""
    return templates.RerankLabels(list(range(config.num_labels)), Output.LOGITS)


def refusal(config, kind: str) -> str:
    """Why a model with a classification head has no label-token scores."""
    return (
        f"this model has a sequence-classification head of {config.num_labels} label(s){kind}, "
        "not a language-model head: label-token scores are unavailable (rerank works)"
    )
