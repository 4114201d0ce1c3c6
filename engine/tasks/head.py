"""The head axis of a task: what the forward returns at which rows for each output, and how an
answer (label scores, a relevance, a vector) is made of it. `LabelScores`, `Classifier` and
`Pooler` are the heads; a new one is a module and a line in `engine.tasks.HEADS`."""

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from engine.capabilities import Ability
from engine.errors import InvalidInput
from engine.host.pairs import Framing
from engine.kinds import Output
from engine.models import ModelConfig
from engine.tasks.backbones import Backbone

_OUTPUTS = {
    Ability.EMBED: Output.POOLED,
    Ability.EMBED_TOKENS: Output.TOKENS,
    Ability.EMBED_SPARSE: Output.SPARSE,
}


class Head:
    """What a kind of head decides, on its `backbone`; `fits` says which configs it serves
    (exactly one head fits any config)."""

    kind: ClassVar[str]  # "language-model" | "sequence-classification" | "embedding"
    # what it answers (`engine.kinds.Output`), the first being the one its programs are compiled
    # for at start
    outputs: ClassVar[tuple[Output, ...]]
    embeds_texts: ClassVar[bool] = False  # its texts are encoded alone (`engine.host.pairs`)

    def __init__(self, config: ModelConfig, backbone: Backbone):
        self.config = config
        self.backbone = backbone

    @classmethod
    def fits(cls, config: ModelConfig) -> bool:
        raise NotImplementedError

    @property
    def name(self) -> str:
        """What `/get_model_info` and the REPL call the model."""
        raise NotImplementedError

    @property
    def architecture(self) -> str:
        """ "decoder" | "cross-encoder" | "encoder"."""
        return self.backbone.name

    def device_output(self, output: Output) -> tuple[Callable, Callable | None]:
        """What the forward computes for `output` (one of `outputs`): the head at the score rows,
        and what makes the rows from every token's final state (None: the score rows)."""
        raise NotImplementedError

    def every_token(self, output: Output) -> bool:
        """Whether `output` reads every token's state of its sequence (not its score row's)."""
        return False

    def row_labels(self, output: Output, labels: list[int]) -> list[int]:
        """The labels each score row reads for `output` of the caller's `labels` (checked)."""
        return labels

    def row_width(self, output: Output, labels: int) -> int:
        """The columns of a score row's answer to `output` with `labels` labels."""
        return labels

    def row_divisors(self, configured: tuple[int, ...]) -> tuple[int, ...]:
        """The score-row buckets (T // d of a T-token batch) of this head's batches, given the
        configured ones (`EngineConfig.row_divisors`): those."""
        return configured

    def relevance(self, outputs: np.ndarray, raw: bool) -> np.ndarray:
        """Each document's relevance f64[N] from the outputs f32[N, L] of its score row."""
        raise NotImplementedError

    def rerank_labels(self, template, tokenizer):
        """The labels a rerank reads at each score row (`templates.RerankLabels`), or why this
        model cannot rerank."""
        raise NotImplementedError

    def refusals(self) -> dict[Ability, str]:
        """What this head refuses, and why (over its backbone's: `Task.refusal`): by default
        it answers no vectors."""
        not_embedder = f"this model is a {self.name} ({self.describe()}), not an embedder"
        not_sparse = (
            f"this model is a {self.name} ({self.describe()}), not a sparse encoder (SPLADE)"
        )
        not_hybrid = (
            f"this model is a {self.name} ({self.describe()}), not a multi-vector or hybrid "
            "embedder (BGE-M3)"
        )
        return {
            Ability.EMBED: not_embedder,
            Ability.EMBED_TOKENS: not_embedder,
            Ability.EMBED_SPARSE: not_sparse,
            Ability.EMBED_MULTI: not_hybrid,
            Ability.EMBED_HYBRID: not_hybrid,
        }

    def output_for(self, ability: Ability) -> Output | None:
        """What a request of the verb `ability` asks this model for (None: a rerank or score
        of its own kind, `rerank_labels`)."""
        return _OUTPUTS.get(ability)

    @property
    def prompts(self) -> dict[str, str]:
        """The named prompts its texts may be given (sentence-transformers'); none but an
        embedder's."""
        return {}

    @property
    def default_prompt(self) -> str | None:
        """The prompt name a text gets when none is asked for."""
        return None

    def prompt(self, name: str | None) -> str:
        """The text put before texts given prompt `name` (None: the default one, or none);
        InvalidInput naming `prompt_name` for a prompt this model does not have."""
        prompts = self.prompts
        if name is not None and name not in prompts:
            have = ", ".join(prompts) or "none"
            raise InvalidInput("prompt_name", f"unknown prompt {name!r} (this model has: {have})")
        name = name or self.default_prompt
        return prompts[name] if name else ""

    def text_encoding(self, role: str | None) -> tuple[int, Framing | None]:
        """How a text embedded as `role` ("query", "document"; None: not said) is encoded: the
        tokens it is held to, and how it is framed once tokenised (None: as tokenised). The
        same for every role but a late-interaction model's (`engine.tasks.colbert`)."""
        return self.config.max_length, None

    def describe(self) -> str:
        """The model's kind in a few words, for people."""
        return self.config.family
