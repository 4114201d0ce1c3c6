"""Every message that crosses a channel between the engine's actors, defined once.

Engine ──ScoreRequest | Cancel──> tokenizer ──Tokenized | Rejected | Cancel──> scheduler
scheduler ──Batch──> device runner ──BatchDone──> scheduler ──Scored | Rejected──> Engine

A `Cancel` travels the same way as its request, so it always arrives after it.
"""

from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from engine.errors import RejectKind
from engine.host.pairs import PairOptions
from engine.kinds import Output
from engine.models import PackedInputs


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Per-stage wall times of one request, in seconds: each batch's stages count in full for
    every request it carries. What `total` holds beyond the stages is the hops between actors
    and gathering the answer."""

    tokenize: float = 0.0  # validation and tokenisation
    queue: float = 0.0  # from tokenised to the first batch that carries it
    batch_build: float = 0.0  # plan + pack
    plan: float = 0.0  # prefix grouping, radix match, splitting into batches
    pack: float = 0.0  # flat layout, attention metadata and block schedule, page tables
    device: float = 0.0  # the device calls, dispatch to outputs on the host
    dispatch: float = 0.0  # the device calls' host part: transfers in, launch
    total: float = 0.0


class ScoreRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A caller's request, built once by the `Engine` verb that makes it (validated by the
    tokenizer actor); the pipeline gives it its `id` and `arrived` as it hands it in."""

    id: int = 0
    query: str | list[int]
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int]
    item_first: bool = False
    output: Output = Output.LOGPROBS  # what each item answers
    # engine-internal: how an encoder's items are tokenised and truncated (`engine.host.pairs`): as
    # (query, item) pairs, or (an `Output.of_texts`) each text alone; None: query and item
    # joined (sglang's semantics)
    pairs: PairOptions | None = None
    arrived: float = 0.0


class Tokenized(msgspec.Struct, frozen=True, kw_only=True):
    """A validated request: one token sequence per item, with its labels."""

    id: int
    sequences: list[Sequence[int]]  # lists of ids, or i32 arrays (`inputs.join_ids`)
    labels: list[int]
    arrived: float
    tokenize_s: float
    truncated: int = 0  # tokens pair truncation took off (`engine.host.pairs`)
    output: Output = Output.LOGPROBS  # `ScoreRequest.output`
    # per sequence its first tokens, the keys every token of it sees (the rest: a ColBERT
    # query's hidden expansion, `engine.host.pairs.Framing`); None: all
    visible: list[int] | None = None


class Rejected(msgspec.Struct, frozen=True, kw_only=True):
    """A request that ends in an error; `kind` picks the exception the caller sees."""

    id: int
    kind: RejectKind
    message: str
    field: str | None = None  # the offending input field, for INVALID and TOO_LARGE


class Cancel(msgspec.Struct, frozen=True, kw_only=True):
    """The caller went away: drop whatever is left of request `id`."""

    id: int


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """One packed prefix batch: device inputs plus the (request id, item index) behind each row."""

    id: int
    inputs: PackedInputs  # of numpy arrays
    rows: list[tuple[int, int]]
    real_tokens: int
    build_s: float
    pool_generation: int = 0  # the KV pool it was planned against (see `BatchDone.pool_reset`)
    output: Output = Output.LOGPROBS  # what its rows answer (per token: f32[T, E])


class BatchDone(msgspec.Struct, frozen=True, kw_only=True):
    """The outputs f32[S, L] of a batch's score rows (label log-probs, a classification head's
    logits, pooled vectors: `engine.tasks`; a per-token output's f32[T, E]), or the error that
    stopped it."""

    id: int
    # f32[S, L], f32[T, E], or a sparse output's non-zero entries (`engine.device.sparse`)
    outputs: np.ndarray | tuple | None = None
    error: str | None = None
    device_s: float = 0.0
    dispatch_s: float = 0.0  # of `device_s`: until the program was launched
    pool_reset: bool = False  # the failure lost the KV pool: every cached page is gone
    retry: bool = False  # not run: planned against a pool lost since; its rows go back in line


class HybridRow(NamedTuple):
    """One text's answer to `Output.HYBRID`, as the device computed it for its tokens."""

    pooled: np.ndarray  # f32[E]: its first token's final state
    weights: np.ndarray  # f32[n]: each token's lexical weight
    vectors: np.ndarray  # f32[n, D]: each token's multi-vector
    ids: np.ndarray  # i32[n]: its token ids


class TokenVectors(NamedTuple):
    """One text's answer to `Output.MULTI`: each of its tokens' multi-vector."""

    vectors: np.ndarray  # f32[n, D]
    ids: np.ndarray  # i32[n]: its token ids


class Scored(msgspec.Struct, frozen=True, kw_only=True):
    """A finished request: its items' outputs (label log-probs, logits, or token states) and its
    timings."""

    id: int
    # its score rows f32[N, L] (what the caller reads of each is its first columns), or (a
    # ragged output, `Output.ragged`) per item its answer: its tokens' states f32[n, E], its
    # sparse vector (i32[k], f32[k]), or its `HybridRow`; [] for no items
    outputs: np.ndarray | list[np.ndarray]
    prompt_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those read from the KV cache
    truncated_tokens: int = 0  # tokens of the input that truncation left out
    timings: Timings
