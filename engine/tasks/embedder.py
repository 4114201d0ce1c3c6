"""An encoder embedder (a sentence-transformers directory over BERT, XLM-RoBERTa or ModernBERT):
each text packed alone with every token seeing all of it, pooled into one vector (its first
token or its mean) and normalised as the directory says; no KV reuse, no label-token scores, no
reranks."""

import numpy as np

from engine.models import encoder
from engine.models.layout import place_encoder
from engine.tasks.base import Task
from engine.tasks.cross_encoder import CrossEncoder


class Embedder(Task):
    name = "embedder"
    architecture = "encoder"
    head = "embedding"
    whole_sequences = True
    forward = staticmethod(encoder.forward)
    output = staticmethod(encoder.pooled)
    place = staticmethod(place_encoder)
    pair_encoder = CrossEncoder.pair_encoder  # each text alone, coded as the encoder reads ids

    @classmethod
    def fits(cls, config) -> bool:
        return config.encoder and config.embedding is not None

    @property
    def dimensions(self) -> int:
        return self.config.hidden_size

    def unshardable(self) -> str:
        return "encoder models run whole on each device: use data_parallel"

    def unplannable(self) -> str:
        return "the plan models decoders; this is an embedder"

    def label_scores_refused(self) -> str:
        return (
            f"this model is an embedder ({self.describe()}): it has no language-model head, so "
            "label-token scores are unavailable (it answers /v1/embeddings)"
        )

    def embeddings_refused(self) -> None:
        return None

    def takes_recipe(self) -> bool:
        return False

    def rerank_labels(self, template, tokenizer) -> str:
        return f"this model is an embedder ({self.describe()}): it does not rerank"

    def embeddings(self, outputs: np.ndarray) -> np.ndarray:
        """The vectors f32[N, E] from the pooled outputs f32[N, E]: divided by their L2 norm (at
        least 1e-12, as torch's `normalize`) when the model normalises."""
        if not self.config.embedding.normalize:
            return outputs
        norms = np.linalg.norm(outputs, axis=1, keepdims=True)
        return outputs / np.maximum(norms, np.float32(1e-12))

    def describe(self) -> str:
        mode = self.config.embedding.mode
        return f"{self.config.family} embedder, {mode} pooling"
