"""A SPLADE head (sentence-transformers' SparseEncoder directories): each text becomes a sparse
vector over the vocabulary, its tokens' masked-language-model logits made log-saturated
weights and pooled (`engine.models.encoder.splade`). Each text is packed alone, every token
seeing all of it, as an embedder's; the device keeps the vocabulary-wide rows and sends back
their non-zero entries alone (`engine.device.sparse`). No label scores, no reranks, no dense
vectors."""

from collections.abc import Callable

import numpy as np

from engine.capabilities import Ability
from engine.kinds import Output
from engine.models import encoder
from engine.tasks.head import Head

# the score-row bucket T // FEW_ROWS besides the configured ones: texts of FEW_ROWS tokens or
# more on average fill no more rows than it holds
FEW_ROWS = 32


class Splade(Head):
    kind = "sparse-embedding"
    outputs = (Output.SPARSE,)
    embeds_texts = True

    @classmethod
    def fits(cls, config) -> bool:
        return config.splade is not None

    @property
    def name(self) -> str:
        return "sparse encoder"

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        return encoder.splade, None

    def every_token(self, output: Output) -> bool:
        return True

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        return []  # a row's output is its text's sparse vector

    def row_width(self, output: Output, labels: int) -> int:
        return self.config.vocab_size

    def row_divisors(self, configured: tuple[int, ...]) -> tuple[int, ...]:
        # a row is a vocabulary-wide f32 vector whose padding rows cost memory traffic (the
        # pool's start, its activation, the output): a batch of longer texts has a bucket of
        # few rows too, which took 14% off 300 texts of ~85 tokens (docs/hybrid-retrieval.md)
        return tuple(sorted({*configured, FEW_ROWS}))

    def rerank_labels(self, template, tokenizer) -> str:
        return self.refusals()[Ability.RERANK]

    def refusals(self) -> dict[Ability, str]:
        sparse = f"this model is a sparse encoder ({self.describe()})"
        not_dense = f"{sparse}: it answers sparse vectors (embed_sparse, /embed_sparse)"
        return super().refusals() | {
            Ability.EMBED_SPARSE: None,
            Ability.SCORE: f"{sparse}: it has no language-model head for label-token scores",
            Ability.RERANK: f"{sparse}: it does not rerank",
            Ability.RECIPE: f"{sparse}: it does not rerank",
            Ability.EMBED: not_dense,
            Ability.EMBED_TOKENS: not_dense,
            Ability.ROOFLINE: "the plan models label scoring; this is a sparse encoder",
        }

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.config.splade.prompts)

    @property
    def default_prompt(self) -> str | None:
        return self.config.splade.default_prompt

    def describe(self) -> str:
        return f"{self.config.family} SPLADE, {self.config.splade.pooling} pooling"


def pruned(
    indices: np.ndarray, values: np.ndarray, keep: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """A sparse vector's `keep` largest entries (None: all of them), still by index."""
    if keep is None or len(values) <= keep:
        return indices, values
    top = np.sort(np.argsort(-values, kind="stable")[:keep])
    return indices[top], values[top]
