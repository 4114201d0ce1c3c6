"""An encoder with a classifier (BERT, XLM-RoBERTa, ModernBERT cross-encoders): each
(query, document) pair encoded and truncated as sentence-transformers' `CrossEncoder` does,
packed alone with every token seeing the whole pair, the classifier's logits read at its first
token (or its mean); no KV reuse, no recipe, no label-token scores."""

from collections.abc import Sequence

import numpy as np
import tokenizers

from engine.capabilities import Ability
from engine.kinds import Layout, Output
from engine.models import encoder
from engine.models.layout import place_encoder
from engine.pairs import PairEncoder, PairOptions
from engine.tasks.base import Task
from engine.tasks.classifier import Classifier, refusal
from engine.tasks.outputs import classifier_relevance

UNSHARDABLE = "encoder models run whole on each device: use data_parallel"


class CrossEncoder(Task):
    name = "cross-encoder"
    architecture = "cross-encoder"
    head = "sequence-classification"
    outputs = (Output.LOGITS,)
    reads_pairs = True
    forward = staticmethod(encoder.forward)
    output = staticmethod(encoder.pair_logits)
    place = staticmethod(place_encoder)
    rerank_labels = Classifier.rerank_labels
    row_labels = Classifier.row_labels
    row_width = Classifier.row_width

    @classmethod
    def fits(cls, config) -> bool:
        return config.encoder

    def layout(self, output: Output) -> Layout:
        return Layout.WHOLE

    def refusals(self) -> dict[Ability, str]:
        return super().refusals() | {
            Ability.SCORE: refusal(self.config, f" (a {self.config.family} cross-encoder)"),
            Ability.RECIPE: "this is a cross-encoder: it reads each pair as it is, with no recipe",
            Ability.TENSOR_PARALLEL: UNSHARDABLE,
            Ability.ROOFLINE: "the plan models decoders; this is a cross-encoder",
        }

    def pair_encoder(self, tokenizer: tokenizers.Tokenizer, *, native: bool = True) -> PairEncoder:
        cfg = self.config
        return PairEncoder(
            tokenizer,
            vocab_size=cfg.vocab_size,
            type_vocab_size=cfg.type_vocab_size,
            native=native,
        )

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        return classifier_relevance(outputs, raw)

    def document_room(self, template, tokenizer, query, instruction, fit) -> None:
        return None

    def rerank_inputs(
        self, template, tokenizer, query: str, documents: Sequence[str], instruction, fit, side
    ) -> tuple:
        """The texts themselves as pairs, truncated to the model's max length (CrossEncoder's),
        or to `fit` when that is shorter."""
        limit = min(self.config.max_length, fit or self.config.max_length)
        return query, list(documents), PairOptions(limit=limit, side=side)

    def describe(self) -> str:
        return f"{self.config.family} cross-encoder"
