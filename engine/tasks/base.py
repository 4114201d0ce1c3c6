"""The task: what differs between kinds of model, asked of one object chosen at load.

A task is made from the checkpoint's `ModelConfig` (`engine.tasks.task_for`) along two axes: its
**backbone** (`engine.tasks.backbones`: a causal decoder or a bidirectional encoder), which
decides how a request's items become sequences, how they are laid out and which forward runs
them; and its **head** (`engine.tasks.head`: label scores, a classifier, a pooler), which decides
the outputs it answers, what the forward returns at which rows for each, and how an answer is
made of that. Callers ask the task; nothing else looks at the config to tell kinds apart.
"""

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np
import tokenizers

from engine.capabilities import Ability
from engine.host.pairs import PairEncoder
from engine.kinds import Layout, Output
from engine.models import FAMILIES, ModelConfig
from engine.tasks.backbones import Backbone
from engine.tasks.head import Head


class Task:
    """A model's `backbone` and `head` (see the module docstring)."""

    def __init__(self, config: ModelConfig, backbone: Backbone, head: Head):
        self.config = config
        self.backbone = backbone
        self.head = head
        self.name = head.name  # what `/get_model_info` and the REPL call the model
        self.architecture = head.architecture  # "decoder" | "cross-encoder" | "encoder"
        self.outputs = head.outputs  # what it answers; the first compiled at start
        self.place = backbone.place  # (host params, cfg, dtype, dense) -> device params

    def layout(self, output: Output) -> Layout:
        """How sequences answering `output` are laid out in a batch."""
        return self.backbone.layout(self.head.every_token(output))

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        """What the forward computes for `output` (`Head.device_output`); outputs with the same
        answer here run the same program. ValueError for an output this model does not answer."""
        if output not in self.outputs:
            raise ValueError(f"a {self.name} answers no {output.title}")
        return self.head.device_output(output)

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
        """The forward of one packed batch answering `output` (by default the first this model
        answers), `(params, inputs, pool) -> (f32[S, L], pool)` (f32[T, E] for every token's):
        its backbone's model with `attention` and `dense` (`score_kernels.select_*`), of
        `config` (another of the same model, e.g. cut to fewer layers; by default its own);
        `options` are the model's (`write_kv`, `unroll`). `exact`: every dot at full f32
        precision (the f32 program's; see `exactly`). The one assembly the program, export and
        plan share."""
        head, rows = self.device_output(output or self.outputs[0])
        if rows is not None:
            options = {**options, "rows": rows}
        cfg = config or self.config
        forward = functools.partial(
            self.backbone.forward,
            cfg=cfg,
            family=FAMILIES[cfg.family],
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

    def refusal(self, ability: Ability) -> str | None:
        """Why this model refuses `ability` (`engine.capabilities`: its head's reason, else its
        backbone's), or None when it has it. The engine asks once, at load, for its record."""
        return (self.backbone.refusals() | self.head.refusals()).get(ability)

    # --- requests

    @property
    def reads_pairs(self) -> bool:
        """Whether a rerank reads its documents as pairs with the query (CrossEncoder's
        truncation); False: through the model's rerank recipe (`engine.templates`)."""
        return self.backbone.reads_pairs

    def pair_encoder(
        self, tokenizer: tokenizers.Tokenizer, *, native: bool = True
    ) -> PairEncoder | None:
        """How requests with pairs are tokenised: an encoder's pairs, an embedder's texts alone
        (natively where `native` and the tokenizer allow, `engine.text.native_tokenizer`); None:
        they are refused."""
        if not (self.backbone.reads_pairs or self.head.embeds_texts):
            return None
        cfg = self.config
        return PairEncoder(
            tokenizer, vocab_size=cfg.vocab_size, type_vocab_size=cfg.type_vocab_size, native=native
        )

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        """The labels each score row reads for `output` of the caller's `labels` (checked)."""
        return self.head.row_labels(output, labels)

    def row_width(self, output: Output, labels: int) -> int:
        """The columns of a score row's answer to `output` with `labels` labels."""
        return self.head.row_width(output, labels)

    def rerank_labels(self, template, tokenizer):
        """The labels a rerank reads at each score row, or why this model cannot rerank."""
        return self.head.rerank_labels(template, tokenizer)

    def rerank_inputs(
        self, template, tokenizer, query: str, documents: Sequence[str], options
    ) -> tuple:
        """A rerank's score call under `options` (`engine.rerank.RerankOptions`): its query,
        items, how they pair, and the tokens cut (`Backbone.rerank_inputs`)."""
        args = (template, tokenizer, query, documents, options)
        return self.backbone.rerank_inputs(self.config, *args)

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        """Each document's relevance f64[N] from the outputs f32[N, L] of its score row."""
        return self.head.relevance(outputs, raw)

    def describe(self) -> str:
        """The model's kind in a few words, for people."""
        return self.head.describe()


def exactly(forward: Callable) -> Callable:
    """`forward` with every dot that names no precision of its own at HIGHEST: a GPU multiplies
    f32 in TF32 (10-bit mantissas) by default, a TPU in bf16 passes; HIGHEST is full f32 on
    every backend (on the CPU, what it does anyway)."""

    @functools.wraps(forward)
    def exact(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return forward(*args, **kwargs)

    return exact
