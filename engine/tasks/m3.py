"""BGE-M3's head: an embedder (`Pooler`: its dense vector, CLS pooled and normalised as its
directory says) that answers, from the same forward of each text, its lexical weights and its
multi-vectors (FlagEmbedding's `BGEM3FlagModel.encode` with `return_dense`, `return_sparse`
and `return_colbert_vecs`). Every request to it asks for `Output.HYBRID`: one program, each
text computed once whatever subset it wants; the host keeps what each verb asks for."""

from collections.abc import Callable

import numpy as np

from engine import templates
from engine.capabilities import Ability
from engine.kinds import Output
from engine.messages import HybridRow
from engine.models import encoder
from engine.results import SparseVector
from engine.tasks.pooler import Pooler


class M3(Pooler):
    kind = "hybrid-embedding"
    outputs = (Output.HYBRID,)

    @classmethod
    def fits(cls, config) -> bool:
        return config.m3 is not None

    @property
    def name(self) -> str:
        return "hybrid embedder"

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        return encoder.m3, None

    def every_token(self, output: Output) -> bool:
        return True

    def output_for(self, ability: Ability) -> Output:
        return Output.HYBRID

    def refusals(self) -> dict[Ability, str]:
        refused = super().refusals()
        offered = (Ability.EMBED_SPARSE, Ability.EMBED_MULTI, Ability.EMBED_HYBRID, Ability.RERANK)
        for ability in offered:
            refused.pop(ability, None)
        why = f"this model is a hybrid embedder ({self.describe()})"
        return refused | {
            Ability.EMBED_TOKENS: f"{why}: its token vectors are its multi-vectors (embed_multi)",
        }

    def rerank_labels(self, template, tokenizer):
        """A rerank reads no labels: it scores vectors (`engine.late_interaction`)."""
        return templates.RerankLabels([], Output.HYBRID)

    def describe(self) -> str:
        return f"{self.config.family} BGE-M3: dense, lexical and multi-vectors"

    def pooled(self, rows: list[HybridRow]) -> np.ndarray:
        """The texts' pooled states f32[N, E] (the dense vectors before `embeddings`)."""
        width = self.pooled_width
        return np.stack([r.pooled for r in rows]) if rows else np.zeros((0, width), np.float32)

    def lexical(self, row: HybridRow) -> SparseVector:
        """A text's lexical weights: each token id's largest weight above 0 over its tokens,
        the tokenizer's cls, eos, pad and unk left out; ids ascending."""
        keep = (row.weights > 0) & ~np.isin(row.ids, self.config.m3.unused)
        ids, weights = row.ids[keep], row.weights[keep]
        order = np.lexsort((-weights, ids))  # by id, the largest weight first
        ids, weights = ids[order], weights[order]
        first = np.ones(len(ids), bool)
        first[1:] = ids[1:] != ids[:-1]
        return SparseVector(ids[first].astype(np.int32), weights[first])

    @staticmethod
    def multi(row: HybridRow) -> np.ndarray:
        """A text's multi-vectors f32[n - 1, D]: each token's after the first (CLS)."""
        return row.vectors[1:]
