"""A late-interaction (ColBERT) head, as PyLate's `ColBERT` computes it: each text becomes one
vector per token, its final state projected and normalised (`engine.models.encoder.colbert`),
and a document's relevance to a query is MaxSim, the sum over the query's vectors of each one's
largest dot product with the document's (`engine.late_interaction`).

Queries and documents are encoded differently (`framing`): each gets its role's marker token
after its first token and is held to its role's length; a query is padded with the mask token
to its full length (query expansion), the pads seen by no token unless the model attends to
them (`engine.host.packing`); a document's punctuation (the skiplist) is left out of its vectors.
Each text is packed alone, every token seeing all of it, as an embedder's."""

from collections.abc import Callable

import numpy as np

from engine import templates
from engine.capabilities import Ability
from engine.errors import InvalidInput
from engine.host.pairs import Framing
from engine.kinds import Output
from engine.messages import TokenVectors
from engine.models import encoder
from engine.tasks.head import Head

ROLES = ("query", "document")


class ColBERT(Head):
    kind = "late-interaction"
    outputs = (Output.MULTI,)
    embeds_texts = True

    @classmethod
    def fits(cls, config) -> bool:
        return config.colbert is not None

    @property
    def name(self) -> str:
        return "late-interaction model"

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        return encoder.colbert, None

    def every_token(self, output: Output) -> bool:
        return True

    def output_for(self, ability: Ability) -> Output | None:
        return Output.MULTI if ability in (Ability.EMBED_MULTI, Ability.RERANK) else None

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        return []  # a row's output is its text's vectors

    def rerank_labels(self, template, tokenizer):
        """A rerank reads no labels: it scores vectors (`engine.late_interaction`)."""
        return templates.RerankLabels([], Output.MULTI)

    def refusals(self) -> dict[Ability, str]:
        late = f"this model is a late-interaction model ({self.describe()})"
        multi = f"{late}: it answers multi-vectors (embed_multi, /pooling token_embed)"
        return super().refusals() | {
            Ability.EMBED_MULTI: None,
            Ability.EMBED: multi,
            Ability.EMBED_TOKENS: multi,
            Ability.EMBED_HYBRID: f"{late}, not BGE-M3: it answers multi-vectors alone",
            Ability.SCORE: f"{late}: it has no language-model head for label-token scores",
            Ability.RECIPE: f"{late}: it reranks by MaxSim, with no recipe",
            Ability.ROOFLINE: "the plan models label scoring; this is a late-interaction model",
        }

    def describe(self) -> str:
        c = self.config.colbert
        return f"{self.config.family} ColBERT, {c.dim}-dimensional token vectors"

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.config.colbert.prompts)

    @property
    def default_prompt(self) -> str | None:
        return self.config.colbert.default_prompt

    def text_encoding(self, role: str | None) -> tuple[int, Framing]:
        """A query's or a document's (None: a document's) length, its marker's included, and
        framing (see the module docstring)."""
        c = self.config.colbert
        if check_role(role or "document") == "document":
            return c.document_length, Framing(marker=c.document_marker)
        expansion = Framing(
            marker=c.query_marker,
            pad_to=c.query_length if c.expand else 0,
            pad_id=c.pad_id,
            hide_pads=c.expand and not c.attend_expansion,
        )
        return c.query_length, expansion

    def multi(self, row: TokenVectors, role: str) -> np.ndarray:
        """A text's multi-vectors f32[k, D]: a query's every token's (its expansion's
        included), a document's but those of its skiplist tokens."""
        if role == "query":
            return row.vectors
        return row.vectors[~np.isin(row.ids, self.config.colbert.skiplist)]


def check_role(role: str) -> str:
    """`role`, checked: "query" or "document"; InvalidInput naming `input_type` otherwise."""
    if role not in ROLES:
        raise InvalidInput("input_type", f"must be one of {', '.join(ROLES)}; got {role!r}")
    return role
