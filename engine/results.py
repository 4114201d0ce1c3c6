"""What the engine's calls answer: scores, rerank hits, embeddings, and the counters of
`Engine.stats`."""

from typing import NamedTuple

import msgspec
import numpy as np

from engine.messages import Timings
from score_kernels.dense_choice import DenseChoice


class ScoreResult(msgspec.Struct, frozen=True, kw_only=True):
    scores: list[list[float]]  # per item, per label
    prompt_tokens: int
    timings: Timings
    cached_tokens: int = 0  # of the prompt tokens, those read from the KV cache
    truncated_tokens: int = 0  # input tokens a cross-encoder's pair truncation left out


class EmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    embeddings: np.ndarray  # f32[N, E]: one vector per text, in text order
    prompt_tokens: int
    timings: Timings
    cached_tokens: int = 0  # of the prompt tokens, those read from the KV cache
    truncated_tokens: int = 0  # tokens cut off texts over the model's limit (asked for)


class TokenEmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    embeddings: list[np.ndarray]  # per text, in text order, f32[n, E]: each of its n tokens' state
    prompt_tokens: int
    timings: Timings
    truncated_tokens: int = 0  # tokens cut off texts over the model's limit (asked for)
    cached_tokens: int = 0  # none: each text is computed whole and alone


class SparseVector(NamedTuple):
    """A text's sparse vector: its non-zero entries' vocabulary ids, ascending, and weights."""

    indices: np.ndarray  # i32[k]
    values: np.ndarray  # f32[k], each > 0


class SparseEmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    embeddings: list[SparseVector]  # per text, in text order
    prompt_tokens: int
    timings: Timings
    truncated_tokens: int = 0  # tokens cut off texts over the model's limit (asked for)
    cached_tokens: int = 0  # none: each text is computed whole and alone


class MultiVectorResult(msgspec.Struct, frozen=True, kw_only=True):
    embeddings: list[np.ndarray]  # per text, in text order, f32[n, D]: its multi-vectors
    prompt_tokens: int
    timings: Timings
    truncated_tokens: int = 0
    cached_tokens: int = 0  # none: each text is computed whole and alone


class HybridEmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `Engine.embed_hybrid` answers, per text in text order; None: not asked for."""

    dense: np.ndarray | None  # f32[N, D]
    sparse: list[SparseVector] | None
    multi: list[np.ndarray] | None  # f32[n, D] each
    prompt_tokens: int
    timings: Timings
    truncated_tokens: int = 0
    cached_tokens: int = 0  # none: each text is computed whole and alone


class RerankHit(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    relevance_score: float


class RerankResult(msgspec.Struct, frozen=True, kw_only=True):
    results: list[RerankHit]  # best first
    prompt_tokens: int
    timings: Timings
    cached_tokens: int = 0  # of the prompt tokens, those read from the KV cache
    truncated_tokens: int = 0  # input tokens a cross-encoder's pair truncation left out


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    in_flight: int
    queue_depth: int
    queued_tokens: int = 0  # tokens of the requests waiting to be batched
    batches: int
    failed_batches: int
    real_tokens: int
    padded_tokens: int
    prefix_tokens_saved: int
    compiles: int
    # every runner's bucket grid compiled (False while it compiles in the background)
    grid_compiled: bool = True
    device_busy_s: float
    cache_hits: int  # tokenizer cache
    cache_misses: int
    prefix_cache_hit_tokens: int = 0  # cacheable prefix tokens read from the KV pool
    prefix_cache_miss_tokens: int = 0  # ... and computed
    kv_pages_evicted: int = 0
    kv_pages_used: int = 0  # cached, or held by planned and running batches
    kv_pages_free: int = 0
    runner_batches: list[int] = []  # batches run by each device runner


class KVPoolInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The first runner's paged KV pool: its size and whether prefixes are reused across
    requests."""

    pages: int
    page_size: int  # tokens per page
    capacity_tokens: int
    bytes: int
    prefix_cache: bool


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the loaded engine is, for people and dashboards (`Engine.info`)."""

    task: str  # `engine.tasks.Task.name`
    architecture: str  # "decoder" | "cross-encoder" | "encoder" (an embedder's)
    head: str  # "language-model" | "sequence-classification" | "embedding"
    dtype: str  # the compute mode: "bfloat16", "float32" or "int8"
    weight_bytes: int  # on the (first runner's) devices
    kv_bytes_per_token: int
    max_sequence_tokens: int
    buckets: dict  # the padding grid (`engine.host.buckets.Buckets` fields)
    kv_pool: KVPoolInfo
    dense: str  # the dense strategy's name ("measured": chosen per weight shape)
    dense_choice: DenseChoice | None  # what the measured strategy chose (None when forced)
    # each ability (`engine.capabilities.Ability`, by name): None, or why it is refused
    capabilities: dict[str, str | None] = {}
