"""A sequence-classification head: a decoder's (`*ForSequenceClassification`: Qwen3/Qwen2/Llama/
Gemma rerankers), read at each sequence's last token and reranking through the model's recipe,
or an encoder's (BERT, XLM-RoBERTa, ModernBERT cross-encoders), read at each pair's first token
(or its mean). Its raw logits, every label read by a rerank; no label-token scores."""

import numpy as np

from engine import templates
from engine.capabilities import Ability
from engine.kinds import Output
from engine.models import decoder, encoder
from engine.tasks.head import Head
from engine.tasks.outputs import classifier_relevance

LOGITS = {"decoder": decoder.class_logits, "encoder": encoder.pair_logits}


class Classifier(Head):
    kind = "sequence-classification"
    outputs = (Output.LOGITS,)

    @classmethod
    def fits(cls, config) -> bool:
        other = config.splade is not None or config.colbert is not None
        return config.embedding is None and not other and (config.encoder or config.num_labels > 0)

    @property
    def name(self) -> str:
        return "cross-encoder" if self.backbone.reads_pairs else "classifier"

    @property
    def architecture(self) -> str:
        return "cross-encoder" if self.backbone.reads_pairs else self.backbone.name

    def device_output(self, output):
        return LOGITS[self.backbone.name], None

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        return classifier_relevance(outputs, raw)

    def rerank_labels(self, template, tokenizer) -> templates.RerankLabels:
        """A rerank reads every label's logit."""
        return templates.RerankLabels(list(range(self.config.num_labels)), Output.LOGITS)

    def refusals(self) -> dict[Ability, str]:
        cfg = self.config
        kind = f" (a {cfg.family} cross-encoder)" if self.backbone.reads_pairs else ""
        why = (
            f"this model has a sequence-classification head of {cfg.num_labels} label(s){kind}, "
            "not a language-model head: label-token scores are unavailable (rerank works)"
        )
        return super().refusals() | {Ability.SCORE: why}

    def describe(self) -> str:
        family = self.config.family
        return f"{family} cross-encoder" if self.backbone.reads_pairs else family
