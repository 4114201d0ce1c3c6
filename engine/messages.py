"""Every message that crosses a channel between the engine's actors, defined once.

Engine ──ScoreRequest──> tokenizer ──Tokenized | Rejected──> scheduler <──Cancel── Engine
scheduler ──Batch──> device runner ──BatchDone──> scheduler ──Scored | Rejected──> Engine
"""

from typing import Any

import msgspec


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Per-stage wall times of one request, in seconds."""

    tokenize: float = 0.0
    queue: float = 0.0  # from tokenised to the first batch that carries it
    batch_build: float = 0.0
    device: float = 0.0
    total: float = 0.0


class ScoreRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A caller's score call, as received (validated by the tokenizer actor)."""

    id: int
    query: Any  # str | list[int]
    items: Any  # str | list[str] | list[list[int]]
    label_token_ids: Any  # list[int]
    item_first: bool = False
    arrived: float


class Tokenized(msgspec.Struct, frozen=True, kw_only=True):
    """A validated request: one token sequence per item, with its labels."""

    id: int
    sequences: list[list[int]]
    labels: list[int]
    arrived: float
    tokenize_s: float


class Rejected(msgspec.Struct, frozen=True, kw_only=True):
    """A request that ends in an error; `kind` picks the exception the caller sees."""

    id: int
    kind: str  # "invalid" | "overloaded" | "failed" | "closed"
    message: str


class Cancel(msgspec.Struct, frozen=True, kw_only=True):
    """The caller went away: drop whatever is left of request `id`."""

    id: int


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """One packed prefix batch: device inputs plus the (request id, item index) behind each row."""

    id: int
    inputs: Any  # engine.models.PackedInputs of numpy arrays
    rows: list[tuple[int, int]]
    real_tokens: int
    build_s: float


class BatchDone(msgspec.Struct, frozen=True, kw_only=True):
    """Label log-probs f32[S, L] for a batch's rows, or the error that stopped it."""

    id: int
    logprobs: Any = None  # np.ndarray | None
    error: str | None = None
    device_s: float = 0.0


class Scored(msgspec.Struct, frozen=True, kw_only=True):
    """A finished request: label log-probs per item and its timings."""

    id: int
    logprobs: list[list[float]]
    prompt_tokens: int
    timings: Timings
