"""The task interface: what differs between kinds of model, asked of one object chosen at load.

A task is made from the checkpoint's `ModelConfig` (`engine.tasks.task_for`) and owns every
decision that depends on the kind of model: which forward runs and how its weights are laid out,
how a request's items become sequences and how those are packed, what the forward returns at the
score rows, and how a rerank's relevance comes out of that. Callers ask it; nothing else looks at
the config to tell kinds apart.
"""

import functools
from collections.abc import Callable, Sequence
from typing import ClassVar

import jax
import numpy as np
import tokenizers

from engine import templates, truncation
from engine.capabilities import Ability
from engine.kinds import Layout, Output
from engine.models import FAMILIES, ModelConfig
from engine.pairs import PairEncoder


class Task:
    """One kind of model (see the module docstring). Subclasses set the class attributes and
    override what differs; `fits` says which configs a kind serves."""

    name: ClassVar[str]  # what `/get_model_info` and the REPL call this kind
    architecture: ClassVar[str]  # "decoder" | "cross-encoder" | "encoder"
    head: ClassVar[str]  # "language-model" | "sequence-classification" | "embedding"
    # what it answers (`engine.kinds.Output`), the first being the one its programs are compiled
    # for at start
    outputs: ClassVar[tuple[Output, ...]]
    # a rerank reads its documents as pairs with the query (CrossEncoder's truncation); False:
    # through the model's rerank recipe (`engine.templates`)
    reads_pairs: ClassVar[bool] = False

    def __init__(self, config: ModelConfig):
        self.config = config

    @classmethod
    def fits(cls, config: ModelConfig) -> bool:
        """Whether this kind serves a checkpoint of `config`."""
        raise NotImplementedError

    # --- the device program

    forward: ClassVar[Callable]  # (params, inputs, pool, *, cfg, family, ...) -> (f32[S, L], pool)
    output: ClassVar[Callable]  # what `forward` returns at the score rows (its `output`)
    place: ClassVar[Callable]  # (host params, cfg, dtype, dense) -> device params

    def layout(self, output: Output) -> Layout:
        """How sequences answering `output` are laid out: a causal decoder's share their
        prefixes (and the KV cache)."""
        return Layout.SHARED

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        """What the forward computes for `output`: its head at the score rows (`output`), and
        what makes the rows from every token's final state (None: the score rows themselves).
        Outputs with the same answer here run the same program. ValueError for an output this
        kind does not answer."""
        if output not in self.outputs:
            raise ValueError(f"a {self.name} answers no {output.title}")
        return self.output, None

    def forward_of(
        self,
        attention: Callable,
        dense,
        *,
        output: Output | None = None,
        config: ModelConfig | None = None,
        exact: bool = False,
        **options,
    ) -> Callable:
        """The forward of one packed batch answering `output` (by default the first this kind
        answers), `(params, inputs, pool) -> (f32[S, L], pool)` (f32[T, E] for every token's):
        this task's model with `attention` and `dense` (`score_kernels.select_*`), of `config`
        (another of the same model, e.g. cut to fewer layers; by default its own); `options`
        are the model's (`write_kv`, `unroll`). `exact`: every dot at full f32 precision (the
        f32 program's; see `exactly`). The one assembly the program, export and plan share."""
        head, rows = self.device_output(output or self.outputs[0])
        if rows is not None:
            options = {**options, "rows": rows}
        cfg = config or self.config
        family = FAMILIES[cfg.family]
        forward = functools.partial(
            self.forward,
            cfg=cfg,
            family=family,
            attention=attention,
            dense=dense,
            output=head,
            **options,
        )
        return exactly(forward) if exact else forward

    @property
    def reuses_kv(self) -> bool:
        """Whether a token's K/V may be kept and read again by later sequences (a KV pool)."""
        return any(self.layout(o).shares for o in self.outputs)

    # --- what it can do

    def refusal(self, ability: Ability) -> str | None:
        """Why this kind refuses `ability` (`engine.capabilities`), or None when it has it. The
        engine asks once, at load, for its capability record."""
        return self.refusals().get(ability)

    def refusals(self) -> dict[Ability, str]:
        """What this kind refuses, and why: a language model answers no vectors."""
        not_embedder = f"this model is a {self.name} ({self.describe()}), not an embedder"
        return {Ability.EMBED: not_embedder, Ability.EMBED_TOKENS: not_embedder}

    # --- requests

    def pair_encoder(
        self, tokenizer: tokenizers.Tokenizer, *, native: bool = True
    ) -> PairEncoder | None:
        """How score requests with pairs are tokenised (an embedder's texts natively where
        `native` and the tokenizer allow, `engine.native_tokenizer`); None: they are refused."""
        return None

    def rerank_labels(self, template, tokenizer) -> templates.RerankLabels | str:
        """The labels a rerank reads at each score row, or why this model cannot rerank."""
        return templates.rerank_labels(template, tokenizer)

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        """Each document's relevance f64[N] from the outputs f32[N, L] of its score row."""
        raise NotImplementedError

    def document_room(self, template, tokenizer, query: str, instruction, fit: int) -> int | None:
        """Tokens a rerank's document may keep so that its prompt has at most `fit` tokens; None
        when the documents are not cut for it (pairs are truncated as they are encoded)."""
        return truncation.room_for_document(tokenizer, template, query, instruction, fit)

    def rerank_inputs(
        self, template, tokenizer, query: str, documents: Sequence[str], instruction, fit, side
    ) -> tuple:
        """A rerank's score call: its query, items, and how they pair (`PairOptions`, None when
        the items follow the query as one sequence). `fit` bounds a pair's tokens (None: the
        model's own limit), cut at `side`."""
        prompt, items = templates.rerank_inputs(template, tokenizer, query, documents, instruction)
        return prompt, items, None

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        """The labels each score row reads for `output` of the caller's `labels` (checked): a
        language model's logits read the negated log-normaliser (the label one past the
        vocabulary) after them."""
        return [*labels, self.config.vocab_size] if output is Output.LOGITS else labels

    def row_width(self, output: Output, labels: int) -> int:
        """The columns of a score row's answer to `output` with `labels` labels."""
        return labels + (output is Output.LOGITS)

    def describe(self) -> str:
        """The model's kind in a few words, for people."""
        return self.config.family


def exactly(forward: Callable) -> Callable:
    """`forward` with every dot that names no precision of its own at HIGHEST: a GPU multiplies
    f32 in TF32 (10-bit mantissas) by default, a TPU in bf16 passes; HIGHEST is full f32 on
    every backend (on the CPU, what it does anyway)."""

    @functools.wraps(forward)
    def exact(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return forward(*args, **kwargs)

    return exact
