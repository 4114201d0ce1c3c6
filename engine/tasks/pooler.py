"""An embedder's head (sentence-transformers directories): each text becomes one vector, pooled
and normalised as the directory says, or its every token's vector before pooling; no
label-token scores. It reranks as a bi-encoder: a document's relevance is its vector's cosine
similarity to the query's (`engine.late_interaction.cosine`), as vLLM scores with an embedder.

On an encoder (BERT, XLM-RoBERTa, ModernBERT) each text is packed alone, every token seeing all
of it, and its first token or its mean pooled. On a decoder (Qwen3-Embedding; Qwen2, Llama and
Gemma ones) the last token's final hidden state is the vector: texts that share a prefix (a
query instruction) compute it once, and the KV cache keeps it across requests, as for scoring;
a mean reads every token's state, so each text is packed alone.
"""

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from engine import templates
from engine.capabilities import Ability
from engine.errors import InvalidInput
from engine.kinds import Output
from engine.models import decoder, encoder
from engine.tasks.head import Head

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {  # a Dense module's, f32
    "tanh": np.tanh,
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
}


class Pooler(Head):
    kind = "embedding"
    outputs = (Output.POOLED, Output.TOKENS)
    embeds_texts = True

    @classmethod
    def fits(cls, config) -> bool:
        return config.embedding is not None and config.m3 is None

    @property
    def name(self) -> str:
        return "embedder"

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        if self.backbone.name == "encoder":
            return (encoder.states if output is Output.TOKENS else encoder.pooled), None
        if output is Output.TOKENS:
            return decoder.last_hidden, decoder.every_token
        mean = self.config.embedding.mode == "mean"
        return decoder.last_hidden, decoder.mean_rows if mean else None

    def every_token(self, output: Output) -> bool:
        return output is Output.TOKENS or self.config.embedding.mode != "last"

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        return []  # a row's output is its pooled vector

    def row_width(self, output: Output, labels: int) -> int:
        return self.pooled_width

    def output_for(self, ability: Ability) -> Output | None:
        return Output.POOLED if ability is Ability.RERANK else super().output_for(ability)

    def rerank_labels(self, template, tokenizer):
        """A rerank reads no labels: it compares vectors (`engine.late_interaction`)."""
        return templates.RerankLabels([], Output.POOLED)

    def refusals(self) -> dict[Ability, str]:
        embedder = f"this model is an embedder ({self.describe()})"
        return super().refusals() | {
            Ability.EMBED: None,
            Ability.EMBED_TOKENS: None,
            Ability.EMBED_SPARSE: f"{embedder} of dense vectors, not a sparse encoder (SPLADE)",
            Ability.SCORE: f"{embedder}: it has no language-model head, so label-token scores "
            "are unavailable (it answers /v1/embeddings)",
            Ability.RERANK: None,
            Ability.RECIPE: f"{embedder}: it reranks by cosine similarity, with no recipe",
            Ability.ROOFLINE: "the plan models label scoring; this is an embedder",
        }

    def describe(self) -> str:
        return f"{self.config.family} embedder, {self.config.embedding.mode} pooling"

    @property
    def pooled_width(self) -> int:
        """The width of the pooled vectors the device answers: the final hidden state's."""
        return self.config.hidden_size

    @property
    def dimensions(self) -> int:
        """The width of the model's vectors: its last Dense module's, or the pooled one."""
        dense = self.config.embedding.dense
        return dense[-1].out_features if dense else self.pooled_width

    @functools.cached_property
    def _projections(self) -> list[tuple[np.ndarray, np.ndarray | None, Callable]]:
        """Each Dense module's (weight f32[N, M], bias f32[N] or None, activation)."""
        out = []
        for layer in self.config.embedding.dense:
            tensors = load_file(str(Path(layer.path) / "model.safetensors"))
            weight = tensors["linear.weight"].astype(np.float32)
            bias = tensors.get("linear.bias")
            bias = None if bias is None else bias.astype(np.float32)
            out.append((weight, bias, ACTIVATIONS[layer.activation]))
        return out

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.config.embedding.prompts)

    @property
    def default_prompt(self) -> str | None:
        return self.config.embedding.default_prompt

    def embeddings(
        self, outputs: np.ndarray, dimensions: int | None = None, normalize: bool | None = None
    ) -> np.ndarray:
        """The vectors f32[N, D] from the pooled outputs f32[N, E]: through the Dense modules,
        their first `dimensions` components (None: all), divided by their L2 norm (at least
        1e-12, as torch's `normalize`) when `normalize` (None: when the model normalises)."""
        for weight, bias, activation in self._projections:
            outputs = outputs @ weight.T
            outputs = activation(outputs if bias is None else outputs + bias)
        vectors = outputs[:, :dimensions] if dimensions else outputs
        if not (self.config.embedding.normalize if normalize is None else normalize):
            return vectors
        return unit(vectors)

    def check_dimensions(self, dimensions: int) -> None:
        """InvalidInput naming `dimensions` unless the model answers vectors that wide: its
        own width, or a width its Matryoshka training covers."""
        pooling, width = self.config.embedding, self.dimensions
        if dimensions == width:
            return
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise InvalidInput("dimensions", "must be an integer")
        if not pooling.matryoshka:
            why = f"this model answers {width} dimensions and is not trained for others"
        elif pooling.matryoshka_dimensions and dimensions not in pooling.matryoshka_dimensions:
            trained = ", ".join(map(str, pooling.matryoshka_dimensions))
            why = f"this model is trained for {trained} dimensions"
        elif not 1 <= dimensions <= width:
            why = f"must be from 1 to {width}"
        else:
            return
        raise InvalidInput("dimensions", why)


def unit(vectors: np.ndarray) -> np.ndarray:
    """Vectors f32[N, D] divided by their L2 norms (at least 1e-12, as torch's `normalize`)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))
