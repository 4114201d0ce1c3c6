"""The embeddable engine: `async with open_engine(config) as engine: await engine.score(...)`.

Three actors run in one trio nursery and talk over memory channels (see `engine.messages`):
tokenizer -> scheduler <-> device runner. The engine hands requests in, relays cancellations,
and wakes each caller when the scheduler reports its request finished or rejected.
"""

import functools
import itertools
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jax
import msgspec
import numpy as np
import trio

from engine import inputs, packing, runner, scheduler, templates, tokenizer_actor
from engine.messages import Cancel, Rejected, Scored, ScoreRequest, Timings
from engine.scoring import ScoringModel, load_model, scores_from_logprobs


def default_compile_cache_dir() -> str:
    return str(Path.home() / ".cache" / "llm-scoring-engine" / "jax")


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything that configures an engine. Immutable; every field has a working default."""

    model: str | None = None  # a .gguf file or HF directory; None is the default model
    dtype: str = "bfloat16"  # weight dtype: "bfloat16" or "float32"
    # "reference" | "xla" | "cpu" | "pallas"; None picks by backend (cpu on CPU, pallas on TPU/GPU)
    attention: str | None = None
    # layer matmuls: "xla" | "cpu" (bf16 weights packed once for the native AVX512-BF16 kernel);
    # None picks "cpu" for bf16 where that kernel runs
    dense: str | None = None
    token_budget: int = 16384  # most real tokens in one packed batch
    block_size: int = 64  # attention block (tokens); token buckets are multiples of it
    # padded batch sizes in tokens, ascending multiples of block_size; None: powers of two from
    # 2 * block_size to 1024, then four per octave, up to the model's context (buckets <=
    # token_budget are compiled at start)
    token_buckets: tuple[int, ...] | None = None
    row_divisors: tuple[int, ...] = (32, 8, 2)  # score-row buckets of a T-token batch: T // d
    label_widths: tuple[int, ...] = (4, 32, 256)  # padded label counts; the last is the limit
    # after answering requests, how long an idle device waits for as many to queue again (the
    # same clients coming back) before batching what is there
    batch_linger_ms: float = 50.0
    max_queued_requests: int = 1024  # in-flight requests before score() fails as overloaded
    max_queued_tokens: int = 2_000_000  # tokenised tokens waiting before requests are refused
    max_items_per_request: int = 4096
    tokenizer_cache_size: int = 65536  # texts whose token ids are kept (LRU)
    compile_cache_dir: str | None = msgspec.field(default_factory=default_compile_cache_dir)
    precompile: bool = True  # compile the bucket grid at start, before serving
    progress: bool = True  # progress bars while loading and compiling


class EngineError(RuntimeError):
    """The engine could not score a valid request (a device step failed)."""


class EngineOverloaded(EngineError):
    """Too much queued work: retry later."""


class EngineClosed(EngineError):
    """The engine shut down before the request finished."""


class ScoreResult(msgspec.Struct, frozen=True, kw_only=True):
    scores: list[list[float]]  # per item, per label
    prompt_tokens: int
    timings: Timings


class RerankHit(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    relevance_score: float


class RerankResult(msgspec.Struct, frozen=True, kw_only=True):
    results: list[RerankHit]  # best first
    prompt_tokens: int
    timings: Timings


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    in_flight: int
    queue_depth: int
    batches: int
    failed_batches: int
    real_tokens: int
    padded_tokens: int
    prefix_tokens_saved: int
    compiles: int
    device_busy_s: float
    cache_hits: int
    cache_misses: int


_ERRORS = {
    "invalid": ValueError,
    "too_large": inputs.InputTooLarge,
    "overloaded": EngineOverloaded,
    "failed": EngineError,
    "closed": EngineClosed,
}


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    outcome: Scored | Rejected | None = None


class Engine:
    """Scores and reranks through the actors; create it with `open_engine`."""

    def __init__(self, config: EngineConfig, model: ScoringModel):
        self.config = config
        self.model = model
        self.buckets = engine_buckets(config, model.config.max_position_embeddings)
        self.template = templates.template_for(model.config.family, model.tokenizer)
        try:
            self._rerank_labels = list(templates.label_ids(self.template, model.tokenizer))
        except ValueError as e:  # the model cannot rerank; score still works
            self._rerank_labels = str(e)
        self.tokenizer = tokenizer_actor.TokenizerState(
            model.tokenizer,
            vocab_size=model.config.vocab_size,
            max_len=min(model.config.max_position_embeddings, self.buckets.tokens[-1]),
            max_items=config.max_items_per_request,
            max_labels=self.buckets.label_widths[-1],
            cache_size=config.tokenizer_cache_size,
        )
        self.scheduler = scheduler.SchedulerState(
            self.buckets,
            token_budget=config.token_budget,
            max_queued_tokens=config.max_queued_tokens,
            linger=config.batch_linger_ms / 1000,
        )
        self.runner = runner.RunnerState(model, block_size=config.block_size)
        self._ids = itertools.count()
        self._waiters: dict[int, _Waiter] = {}
        self._closed = False

    async def _start(self, nursery: trio.Nursery) -> None:
        to_tokenizer, tokenizer_inbox = trio.open_memory_channel(math.inf)
        to_scheduler, scheduler_inbox = trio.open_memory_channel(math.inf)
        to_runner, runner_inbox = trio.open_memory_channel(0)
        to_engine, engine_inbox = trio.open_memory_channel(math.inf)
        self._to_tokenizer, self._to_scheduler = to_tokenizer, to_scheduler.clone()
        grid = self.buckets.grid(self.config.token_budget) if self.config.precompile else []
        run_runner = functools.partial(runner.run, progress=self.config.progress)
        await nursery.start(run_runner, self.runner, runner_inbox, to_scheduler.clone(), grid)
        await nursery.start(tokenizer_actor.run, self.tokenizer, tokenizer_inbox, to_scheduler)
        await nursery.start(scheduler.run, self.scheduler, scheduler_inbox, to_runner, to_engine)
        nursery.start_soon(self._deliver, engine_inbox)

    async def _deliver(self, inbox: trio.MemoryReceiveChannel) -> None:
        async for outcome in inbox:
            waiter = self._waiters.pop(outcome.id, None)
            if waiter is not None:  # None: the caller was cancelled meanwhile
                waiter.outcome = outcome
                waiter.done.set()

    def _close(self) -> None:
        self._closed = True
        for request_id, waiter in self._waiters.items():
            waiter.outcome = Rejected(id=request_id, kind="closed", message="engine shut down")
            waiter.done.set()
        self._waiters.clear()

    async def score(
        self,
        query: inputs.Query,
        items: inputs.Items,
        label_token_ids: Sequence[int],
        *,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> ScoreResult:
        """Score items against a query with `ScoringModel.score` semantics.

        Raises ValueError (InputTooLarge for size limits) for bad input, EngineOverloaded when
        the queue is full, EngineError when the device step fails, EngineClosed on shutdown.
        """
        start = trio.current_time()
        scored = await self._submit(query, items, label_token_ids, item_first)
        timings = msgspec.structs.replace(scored.timings, total=trio.current_time() - start)
        logprobs = np.asarray(scored.logprobs, np.float32)  # f32[N, L]: one label set per request
        scores = scores_from_logprobs(logprobs, apply_softmax=apply_softmax).tolist()
        return ScoreResult(scores=scores, prompt_tokens=scored.prompt_tokens, timings=timings)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        instruction: str | None = None,
    ) -> RerankResult:
        """Documents by relevance to `query`: P(yes) / (P(yes) + P(no)) under the model's
        rerank template, best first, the first `top_n` of them (all when None)."""
        _check_rerank(query, documents, top_n)
        if isinstance(self._rerank_labels, str):
            raise EngineError(f"rerank is unavailable for this model: {self._rerank_labels}")
        yes_no = self._rerank_labels
        items = [self.template.document_text(d) for d in documents]
        result = await self.score(
            self.template.query_text(query, instruction), items, yes_no, apply_softmax=True
        )
        hits = [RerankHit(index=i, relevance_score=s[0]) for i, s in enumerate(result.scores)]
        hits.sort(key=lambda h: -h.relevance_score)
        return RerankResult(
            results=hits[:top_n], prompt_tokens=result.prompt_tokens, timings=result.timings
        )

    async def _submit(self, query, items, label_token_ids, item_first: bool) -> Scored:
        if self._closed:
            raise EngineClosed("engine shut down")
        if len(self._waiters) >= self.config.max_queued_requests:
            raise EngineOverloaded(
                f"{len(self._waiters)} requests in flight (limit {self.config.max_queued_requests})"
            )
        request_id = next(self._ids)
        waiter = self._waiters[request_id] = _Waiter()
        self._to_tokenizer.send_nowait(
            ScoreRequest(
                id=request_id,
                query=query,
                items=items,
                label_token_ids=label_token_ids,
                item_first=item_first,
                arrived=trio.current_time(),
            )
        )
        try:
            await waiter.done.wait()
        except BaseException:  # cancelled: drop whatever is left of the work
            if self._waiters.pop(request_id, None) is not None:
                self._to_scheduler.send_nowait(Cancel(id=request_id))
            raise
        if isinstance(waiter.outcome, Rejected):
            raise _ERRORS[waiter.outcome.kind](waiter.outcome.message)
        return waiter.outcome

    @property
    def max_sequence_tokens(self) -> int:
        """The longest query + item sequence accepted (the context, or the largest bucket)."""
        return self.tokenizer.max_len

    def idle(self) -> bool:
        """True when no request is in flight and nothing is queued, planned or running."""
        s = self.scheduler
        return not (self._waiters or s.requests or s.queue or s.cancelled or s.in_flight)

    def stats(self) -> EngineStats:
        """Counters for metrics, read at the moment of the call."""
        s, r, c = self.scheduler.stats, self.runner.stats, self.tokenizer.cache
        return EngineStats(
            in_flight=len(self._waiters),
            queue_depth=self.scheduler.queue_depth(),
            batches=r.batches,
            failed_batches=r.failed,
            real_tokens=s.real_tokens,
            padded_tokens=s.padded_tokens,
            prefix_tokens_saved=s.prefix_tokens_saved,
            compiles=r.compiles,
            device_busy_s=r.busy_s,
            cache_hits=c.hits,
            cache_misses=c.misses,
        )


def engine_buckets(config: EngineConfig, context: int) -> packing.Buckets:
    """The padding grid the config asks for; ValueError naming the field that is inconsistent."""
    b = config.block_size
    tokens = (
        config.token_buckets or packing.default_buckets(max(config.token_budget, context), b).tokens
    )
    if list(tokens) != sorted(set(tokens)) or any(t <= 0 or t % b for t in tokens):
        raise ValueError(f"token_buckets: must be ascending multiples of block_size {b}")
    if tokens[-1] < config.token_budget:
        raise ValueError(f"token_buckets: the largest ({tokens[-1]}) is below token_budget")
    for name in ("row_divisors", "label_widths"):
        values = getattr(config, name)
        if not values or any(v < 1 for v in values):
            raise ValueError(f"{name}: must be positive integers")
    if not 0 <= config.batch_linger_ms <= 10_000:
        raise ValueError("batch_linger_ms: must be between 0 and 10000")
    return packing.Buckets(
        b, tuple(tokens), tuple(config.row_divisors), tuple(sorted(config.label_widths))
    )


def _check_rerank(query, documents, top_n) -> None:
    if not isinstance(query, str):
        raise ValueError("query: must be a string")
    if isinstance(documents, str) or not documents:
        raise ValueError("documents: must be a non-empty list of strings")
    if not all(isinstance(d, str) for d in documents):
        raise ValueError("documents: must be a non-empty list of strings")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ValueError("top_n: must be a positive integer")


def _enable_compile_cache(directory: str | None) -> None:
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        # every grid program, not only slow ones: a restart should compile nothing
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


@asynccontextmanager
async def open_engine(config: EngineConfig | None = None) -> AsyncIterator[Engine]:
    """Load the model, compile the bucket grid, run the actors; shut everything down on exit.

    On exit every caller still waiting gets `EngineClosed` and no task or thread survives.
    """
    config = config or EngineConfig()
    _enable_compile_cache(config.compile_cache_dir)
    model = await trio.to_thread.run_sync(
        lambda: load_model(
            config.model,
            dtype=config.dtype,
            attention=config.attention,
            dense=config.dense,
            token_budget=config.token_budget,
            progress=config.progress,
        )
    )
    engine = Engine(config, model)
    async with trio.open_nursery() as nursery:
        await engine._start(nursery)
        try:
            yield engine
        finally:
            engine._close()
            nursery.cancel_scope.cancel()
