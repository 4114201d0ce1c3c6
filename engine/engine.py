"""The embeddable engine: `async with open_engine(config) as engine: await engine.score(...)`.

`Engine` is the one front both doors share (`load_model()` is a synchronous front over it): each
verb checks what the model can do (`engine.capabilities`), builds its request (an output kind,
`engine.kinds`), runs it through the actors (`engine.pipeline`) and makes its answer.
"""

import functools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgspec
import numpy as np
import tokenizers
import trio

import _native
from engine import calibration, late_interaction, rounding_cache, runner, templates
from engine.capabilities import Ability, capabilities_of
from engine.config import EngineConfig
from engine.device.placement import Placement, device_groups
from engine.device.program import DeviceProgram, enable_compile_cache
from engine.embedding_verbs import EmbeddingVerbs
from engine.errors import InvalidInput
from engine.host import inputs, kv_cache
from engine.loaders import load_checkpoint
from engine.messages import ScoreRequest
from engine.models import ModelConfig
from engine.pipeline import Pipeline
from engine.rerank import DOCUMENTS, Reranker, RerankOptions, by_query, check_rerank
from engine.results import (
    EngineInfo,
    EngineStats,
    RerankHit,
    RerankResult,
    ScoreResult,
)
from engine.tasks import scores_from_logprobs
from score_kernels import devices
from score_kernels.calibration import Rounding
from score_kernels.dense import ROLES

log = logging.getLogger("engine")


class Engine(EmbeddingVerbs):
    """Scores and reranks through the actors; create it with `open_engine`.

    `tokenizer` is the model's Hugging Face tokenizer, `programs` the device programs, one per
    runner (`program`, the first, tells the architecture in its `config` and the weight dtype),
    `template` the rerank prompt.
    """

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: tokenizers.Tokenizer,
        programs: DeviceProgram | Sequence[DeviceProgram],
        source: str | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.programs = [programs] if isinstance(programs, DeviceProgram) else list(programs)
        self.program = program = self.programs[0]
        self.task = program.task
        context = program.config.max_position_embeddings
        rows = self.task.head.row_divisors(config.row_divisors)
        self.buckets = config.buckets(context, program.config.window, rows)
        self.max_sequence_tokens = self.buckets.max_sequence(context)
        # the tokens one input may have: an encoder's or embedder's own limit (its
        # sentence-transformers `max_seq_length`, its tokenizer's `model_max_length`) within
        # the longest sequence packed; a decoder scorer's is that longest sequence
        own = program.config.max_length
        self.max_input_tokens = (
            min(own, self.max_sequence_tokens) if own else self.max_sequence_tokens
        )
        family = program.config.family
        self.template = templates.template_for(family, tokenizer, source, config.reranker)
        self.reranker = Reranker(
            self.task,
            self.template,
            tokenizer,
            max_sequence_tokens=self.max_sequence_tokens,
            max_items=config.max_items_per_request,
        )
        self.capabilities = capabilities_of(self.task, self.reranker.labels)
        self.pipeline = Pipeline(config, self.task, tokenizer, self.programs, self.buckets)
        # the actors' states, for counters and tests
        self.tokenization = self.pipeline.tokenization
        self.scheduler, self.runners = self.pipeline.scheduler, self.pipeline.runners
        self._info: EngineInfo | None = None

    @property
    def runner(self) -> runner.RunnerState:
        """The first device runner (the only one without data parallelism)."""
        return self.runners[0]

    @property
    def model_config(self) -> ModelConfig:
        """The architecture of the loaded model."""
        return self.program.config

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

        Raises InvalidInput (a ValueError; InputTooLarge for size limits) naming the field for
        bad input, EngineOverloaded when the queue is full, EngineError when the device step
        fails, EngineClosed on shutdown.
        """
        self.capabilities.require(Ability.SCORE)
        request = ScoreRequest(
            query=query, items=items, label_token_ids=label_token_ids, item_first=item_first
        )
        logprobs, result = await self.outputs(request)
        scores = scores_from_logprobs(logprobs, apply_softmax=apply_softmax).tolist()
        return msgspec.structs.replace(result, scores=scores)

    async def outputs(self, request: ScoreRequest) -> tuple[np.ndarray, ScoreResult]:
        """The score rows' answers f32[N, L] to the request's output (label log-probs, logits,
        or an embedder's pooled vectors) and the result (scores empty) carrying the usage. What
        `score`, `rerank` and `embed` are made of."""
        start = trio.current_time()
        scored = await self.pipeline.submit(request)
        timings = msgspec.structs.replace(scored.timings, total=trio.current_time() - start)
        width = self.task.row_width(request.output, len(request.label_token_ids))
        rows = scored.outputs  # f32[N, W >= width], or [] for no items
        outputs = rows[:, :width] if len(rows) else np.zeros((0, width), np.float32)
        result = ScoreResult(
            scores=[],
            prompt_tokens=scored.prompt_tokens,
            timings=timings,
            cached_tokens=scored.cached_tokens,
            truncated_tokens=scored.truncated_tokens,
        )
        return outputs, result

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        truncate: bool = False,
        max_prompt_tokens: int | None = None,
        truncation_side: str = "right",
        raw_scores: bool = False,
    ) -> RerankResult:
        """Documents by relevance to `query` under the model's rerank recipe: P(yes) / (P(yes)
        + P(no)), or the sigmoid of one label's logit (with `raw_scores`, the logit: log P(yes)
        - log P(no), or the label's logit), best first, the first `top_n` of them (all when None).

        `max_tokens_per_doc` cuts each document to that many tokens; `truncate` cuts each so
        that its prompt fits the longest sequence accepted, `max_prompt_tokens` so that it has
        at most that many tokens. `truncation_side` "left" cuts a document's start instead of
        its end. Errors name `documents[i]`; Unsupported when the model cannot rerank.
        """
        self.capabilities.require(Ability.RERANK)
        check_rerank(query, documents, top_n, max_tokens_per_doc, truncation_side)
        options = self.reranker.options(
            instruction, max_tokens_per_doc, truncate, max_prompt_tokens, truncation_side
        )
        scores, result = await self._relevance(query, documents, options, raw_scores)
        hits = [RerankHit(index=i, relevance_score=s) for i, s in enumerate(scores)]
        hits.sort(key=lambda h: -h.relevance_score)
        return RerankResult(
            results=hits[:top_n],
            prompt_tokens=result.prompt_tokens,
            timings=result.timings,
            cached_tokens=result.cached_tokens,
            truncated_tokens=result.truncated_tokens,
        )

    async def score_pairs(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        *,
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        truncate: bool = False,
        max_prompt_tokens: int | None = None,
        raw_scores: bool = False,
    ) -> ScoreResult:
        """The rerank relevance of each (queries[i], documents[i]) pair, in pair order (one
        score per pair), with `rerank`'s options. Pairs that share a query are scored as one
        rerank call, the calls concurrently. Errors name `documents[i]` by pair index."""
        self.capabilities.require(Ability.RERANK)
        options = self.reranker.options(
            instruction, max_tokens_per_doc, truncate, max_prompt_tokens
        )

        async def relevance(query: str, texts: list[str]):
            check_rerank(query, texts, None, max_tokens_per_doc)
            return await self._relevance(query, texts, options, raw_scores)

        return await by_query(relevance, queries, documents)

    async def _relevance(
        self, query: str, documents: Sequence[str], options: RerankOptions, raw: bool
    ) -> tuple[list[float], ScoreResult]:
        """Each document's relevance to `query`, in document order, and the score result."""
        by_vectors = self.task.head.output_for(Ability.RERANK)
        if by_vectors is not None and by_vectors.of_texts:
            return await self._vector_relevance(query, documents, options)
        reranker = self.reranker
        if reranker.slow(options):  # it tokenises: off the event loop
            call = await trio.to_thread.run_sync(reranker.call, query, documents, options)
        else:
            call = reranker.call(query, documents, options)
        try:
            outputs, result = await self.outputs(call.request())
        except InvalidInput as e:
            raise e.renamed(DOCUMENTS) from None
        truncated = result.truncated_tokens + call.truncated
        return reranker.relevance(outputs, raw), msgspec.structs.replace(
            result, truncated_tokens=truncated
        )

    async def grid_compiled(self) -> None:
        """Return once every runner has compiled its bucket grid: at once unless the grid
        compiles in the background (`EngineConfig.precompile_in_background`)."""
        await self.pipeline.grid_compiled()

    def flush_cache(self) -> None:
        """Forget every cached prefix: later requests compute theirs again. Safe at any time
        (batches already planned still read and write the pages they were given)."""
        kv_cache.reset_all(self.scheduler.caches)

    def idle(self) -> bool:
        """True when no request is in flight and nothing is queued, planned or running."""
        return self.pipeline.idle()

    async def wait_idle(self) -> None:
        """Return once `idle()` holds: every request answered and its work gone (cancelled
        requests included)."""
        await self.pipeline.wait_idle()

    def stats(self) -> EngineStats:
        """Counters for metrics, read at the moment of the call."""
        return self.pipeline.stats()

    def info(self) -> EngineInfo:
        """What this engine is: its task, compute mode, sizes, padding grid, KV pool and dense
        path (the first runner's; runners are alike). Worked out once: none of it changes."""
        if self._info is None:
            self._info = self._describe()
        return self._info

    def _describe(self) -> EngineInfo:
        p, task = self.program, self.task
        return EngineInfo(
            task=task.name,
            architecture=task.architecture,
            head=task.head.kind,
            dtype=p.dtype,
            weight_bytes=p.weight_bytes,
            kv_bytes_per_token=p.kv.bytes_per_token,
            max_sequence_tokens=self.max_sequence_tokens,
            buckets=self.buckets._asdict(),
            kv_pool=p.kv.info(prefix_cache=self.scheduler.cache is not None),
            dense=p.dense.name,
            dense_choice=p.dense_choice,
            capabilities={a.value: why for a, why in self.capabilities.refusals.items()},
        )

    def sequences(self, request: ScoreRequest) -> list[list[int]]:
        """The token sequences `request` runs, one per item, exactly as the engine's tokenizer
        builds them; InvalidInput naming the field for bad input. Call it in the engine's
        thread (the tokenizer's cache is not shared across threads)."""
        return inputs.as_lists(self.tokenization.tokenize(request).sequences)


def warn_if_host_paths_uncompiled() -> None:
    """A build without its compiled modules plans and packs each batch in pure Python, several
    times slower: enough to leave a GPU idle half of a large request. Said once per engine."""
    if not _native.COMPILED:
        log.warning(
            "the host paths run their pure-Python forms: _native's modules were not built "
            "(pip install -e . or python setup.py build_ext --inplace builds them)"
        )


@asynccontextmanager
async def open_engine(config: EngineConfig | None = None) -> AsyncIterator[Engine]:
    """Load the model, compile the bucket grid, run the actors; shut everything down on exit.

    On exit every caller still waiting gets `EngineClosed` and no task or thread survives.
    """
    config = config or EngineConfig()
    if config.reranker is not None and config.reranker not in templates.RECIPES:
        raise ValueError(
            f"reranker: {config.reranker!r} is not one of {', '.join(templates.RECIPES)}"
        )
    late_interaction.check_weights(config.hybrid_weights)
    if config.int8_rounding not in calibration.ROUNDINGS:
        raise InvalidInput("int8_rounding", f"must be one of {', '.join(calibration.ROUNDINGS)}")
    if not 0 <= config.int8_smoothing <= 1:
        raise InvalidInput("int8_smoothing", "must be within 0 (none) and 1")
    _check_int8_bf16(config)
    if config.kv_pool_share < 1:
        raise InvalidInput("kv_pool_share", "must be 1 or more")
    warn_if_host_paths_uncompiled()
    enable_compile_cache(config.compile_cache_dir)
    checkpoint = await trio.to_thread.run_sync(
        functools.partial(load_checkpoint, config.model, progress=config.progress)
    )
    no_recipe = checkpoint.task.refusal(Ability.RECIPE)  # before the record, which needs one
    if config.reranker is not None and no_recipe:
        raise InvalidInput("reranker", no_recipe)
    groups = device_groups(config.data_parallel, config.tensor_parallel)
    make = functools.partial(
        DeviceProgram,
        checkpoint,
        dtype=config.dtype,
        attention=config.attention,
        dense=config.dense,
        kv_cache_bytes=config.kv_cache_bytes,
        page_size=config.kv_page_size,
        block_size=config.block_size,
        share=config.kv_pool_share * (len(groups) if devices.share_memory() else 1),
        dense_cache_dir=config.compile_cache_dir,
        int8_bf16=config.int8_bf16,
    )
    if config.dtype == "int8" and calibration.calibrates(config):
        programs = await _rounded_programs(make, groups, config, checkpoint)
    else:
        programs = await _programs(make, groups)
    if programs[0].dense_choice is not None:
        log.info("%s", programs[0].dense_choice.summary())
    engine = Engine(config, checkpoint.tokenizer, programs, checkpoint.source)
    # the host copies of the weights: the programs hold them on the device
    del checkpoint, make
    async with _running(engine):
        yield engine


@asynccontextmanager
async def _running(engine: Engine) -> AsyncIterator[Engine]:
    """`engine`'s actors running; shut down on exit."""
    async with trio.open_nursery() as nursery:
        await engine.pipeline.start(nursery)
        try:
            yield engine
        finally:
            engine.pipeline.close()
            nursery.cancel_scope.cancel()


def _check_int8_bf16(config: EngineConfig) -> None:
    """InvalidInput naming "int8_bf16" where it names a matrix no layer has (before the weights
    load; `DeviceProgram` refuses it outside the int8 mode's measured choice)."""
    if isinstance(config.int8_bf16, str):
        raise InvalidInput("int8_bf16", f"a list of matrix names ({', '.join(ROLES)})")
    unknown = sorted(set(config.int8_bf16) - set(ROLES))
    if unknown:
        raise InvalidInput("int8_bf16", f"{unknown} are not among {', '.join(ROLES)}")


async def _programs(make, groups, rounding: Rounding | None = None) -> list[DeviceProgram]:
    """A `DeviceProgram` of `make` per device group, its int8 matrices rounded by `rounding`."""
    place = functools.partial(make, rounding=rounding)
    return [
        await trio.to_thread.run_sync(functools.partial(place, placement=Placement(group)))
        for group in groups
    ]


async def _rounded_programs(make, groups, config: EngineConfig, checkpoint) -> list[DeviceProgram]:
    """The programs with their int8 matrices rounded as calibrated (GPTQ, smoothing): as the
    rounding cache kept them (`engine.rounding_cache`) where it has every one, else calibrated,
    filling the cache."""
    fingerprinted = functools.partial(
        rounding_cache.for_checkpoint, config.compile_cache_dir, method=calibration.method(config)
    )
    cache = await trio.to_thread.run_sync(fingerprinted, checkpoint)
    if cache is not None and not cache.empty():
        try:
            programs = await _programs(make, groups, cache)
            log.info("int8: the calibrated rounding read from %s", cache.directory)
            return programs
        except rounding_cache.RoundingMiss:
            log.info("int8: the rounding cache lacks a matrix; calibrating")
    hessians = await _calibrated(config, checkpoint)
    return await _programs(make, groups, hessians if cache is None else cache.calibrated(hessians))


async def _calibrated(config: EngineConfig, checkpoint) -> calibration.Hessians:
    """The Hessians of `checkpoint`'s layer matrices over the calibration texts, run by an engine
    of `config` in float32 (`engine.calibration`)."""
    record = functools.partial(calibration.recording_program, config, checkpoint)
    program, hessians = await trio.to_thread.run_sync(record)
    f32 = msgspec.structs.replace(config, dtype="float32", precompile=False)
    engine = Engine(f32, checkpoint.tokenizer, program, checkpoint.source)
    async with _running(engine):
        await engine.outputs(calibration.request(engine.task, checkpoint.tokenizer))
    return hessians
