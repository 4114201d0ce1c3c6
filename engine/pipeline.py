"""The pipeline both front doors run: the three actors (tokenizer -> scheduler <-> device
runners) in one trio nursery, and the plumbing that hands a request in and wakes its caller when
the scheduler reports it finished or rejected (see `engine.messages`). `Engine` builds requests
for it and makes answers of what comes back.
"""

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import tokenizers
import trio

from engine import runner, scheduler, tokenizer_actor
from engine.config import EngineConfig
from engine.device.program import DeviceProgram
from engine.errors import EngineClosed, EngineOverloaded, RejectKind, rejection_error
from engine.host import kv_cache
from engine.host.buckets import Buckets
from engine.messages import Cancel, Rejected, Scored, ScoreRequest
from engine.results import EngineStats
from score_kernels import devices


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    outcome: Scored | Rejected | None = None


class Pipeline:
    """The actors' states and the requests in flight for a model of `task` on `programs` (one
    per device runner), batched on `buckets`."""

    def __init__(
        self,
        config: EngineConfig,
        task,
        tokenizer: tokenizers.Tokenizer,
        programs: Sequence[DeviceProgram],
        buckets: Buckets,
    ):
        self.config = config
        self.buckets = buckets
        self.tokenization = tokenizer_actor.TokenizerState.for_model(
            tokenizer,
            task,
            buckets,
            max_items=config.max_items_per_request,
            cache_size=config.tokenizer_cache_size,
            max_token_vectors=config.max_token_vectors_per_request,
            native=config.native_tokenizer,
        )
        self.scheduler = scheduler.SchedulerState(
            buckets,
            token_budget=config.token_budget,
            max_queued_tokens=config.max_queued_tokens,
            linger=config.batch_linger_ms / 1000,
            layouts={output: task.layout(output) for output in task.outputs},
            caches=kv_cache.runner_caches(
                [(p.kv.num_pages * config.prefix_cache, p.kv.page_size) for p in programs],
                max_context=buckets.max_context,
            ),
        )
        self.runners = [runner.RunnerState(p, block_size=config.block_size) for p in programs]
        self._ids = itertools.count()
        self._waiters: dict[int, _Waiter] = {}
        self._sent = 0  # messages handed to the tokenizer; each reaches the scheduler once
        self._changed = trio.Event()  # set when the scheduler has handled messages
        self._grid_compiled = [trio.Event() for _ in self.runners]
        self._closed = False

    async def grid_compiled(self) -> None:
        """Return once every runner has compiled its bucket grid: at once unless the grid
        compiles in the background (`EngineConfig.precompile_in_background`)."""
        for event in self._grid_compiled:
            await event.wait()

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the actors in `nursery`: the runners compiling their grids, then the tokenizer
        and the scheduler."""
        to_tokenizer, tokenizer_inbox = trio.open_memory_channel(math.inf)
        to_scheduler, scheduler_inbox = trio.open_memory_channel(math.inf)
        to_engine, engine_inbox = trio.open_memory_channel(math.inf)
        self._to_tokenizer = to_tokenizer
        grid = self.buckets.grid(self.config.token_budget) if self.config.precompile else []
        # runners whose devices share one memory compile one at a time: eight compiling at
        # once took over 18 GiB of host memory (SmolLM2 f32)
        limit = 1 if devices.share_memory() else len(self.runners)
        run_runner = functools.partial(
            runner.run,
            progress=self.config.progress,
            compiling=trio.CapacityLimiter(limit),
            compile_workers=self.config.compile_workers,
            background=self.config.precompile_in_background,
        )
        to_runners = []
        async with trio.open_nursery() as compiling:  # every runner starts compiling its grid
            for state, compiled in zip(self.runners, self._grid_compiled, strict=True):
                # room for the most a runner is handed (one running, one ahead): the scheduler
                # counts a batch handed until it is done, taken from the channel or not
                to_runner, runner_inbox = trio.open_memory_channel(scheduler.HANDED_AHEAD + 1)
                to_runners.append(to_runner)
                channels = (state, runner_inbox, to_scheduler.clone(), grid)
                run = functools.partial(run_runner, compiled=compiled)
                compiling.start_soon(functools.partial(nursery.start, run, *channels))
        await nursery.start(tokenizer_actor.run, self.tokenization, tokenizer_inbox, to_scheduler)
        run_scheduler = functools.partial(scheduler.run, on_change=self._on_change)
        await nursery.start(run_scheduler, self.scheduler, scheduler_inbox, to_runners, to_engine)
        nursery.start_soon(self._deliver, engine_inbox)

    def _on_change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _deliver(self, inbox: trio.MemoryReceiveChannel) -> None:
        async for outcome in inbox:
            waiter = self._waiters.pop(outcome.id, None)
            if waiter is not None:  # None: the caller was cancelled meanwhile
                waiter.outcome = outcome
                waiter.done.set()

    def close(self) -> None:
        """Refuse new requests and answer every waiting caller with EngineClosed."""
        self._closed = True
        for request_id, waiter in self._waiters.items():
            waiter.outcome = Rejected(
                id=request_id, kind=RejectKind.CLOSED, message="engine shut down"
            )
            waiter.done.set()
        self._waiters.clear()

    async def submit(self, request: ScoreRequest) -> Scored:
        """One request through the actors: its items' outputs and usage, or the error it was
        rejected with (InvalidInput naming the field, EngineOverloaded, EngineError,
        EngineClosed). Cancelling the caller drops whatever is left of its work."""
        if self._closed:
            raise EngineClosed("engine shut down")
        if len(self._waiters) >= self.config.max_queued_requests:
            raise EngineOverloaded(
                f"{len(self._waiters)} requests in flight (limit {self.config.max_queued_requests})"
            )
        request_id = next(self._ids)
        waiter = self._waiters[request_id] = _Waiter()
        self._send(msgspec.structs.replace(request, id=request_id, arrived=trio.current_time()))
        try:
            await waiter.done.wait()
        except BaseException:  # cancelled: drop whatever is left of the work
            if self._waiters.pop(request_id, None) is not None:
                self._send(Cancel(id=request_id))
            raise
        outcome = waiter.outcome
        if isinstance(outcome, Rejected):
            raise rejection_error(outcome.kind, outcome.message, outcome.field)
        return outcome

    def _send(self, message: ScoreRequest | Cancel) -> None:
        self._to_tokenizer.send_nowait(message)
        self._sent += 1

    def idle(self) -> bool:
        """True when no request is in flight and nothing is queued, planned or running."""
        handed_over = self._sent == self.scheduler.received
        return not self._waiters and handed_over and self.scheduler.idle()

    async def wait_idle(self) -> None:
        """Return once `idle()` holds: every request answered and its work gone (cancelled
        requests included)."""
        while not self.idle():
            await self._changed.wait()

    def stats(self) -> EngineStats:
        """Counters for metrics, read at the moment of the call."""
        s, c = self.scheduler.stats, self.tokenization.cache
        runs = [r.stats for r in self.runners]
        return EngineStats(
            in_flight=len(self._waiters),
            queue_depth=self.scheduler.queue_depth(),
            queued_tokens=self.scheduler.queued_tokens,
            batches=sum(r.batches for r in runs),
            failed_batches=sum(r.failed for r in runs),
            real_tokens=s.real_tokens,
            padded_tokens=s.padded_tokens,
            prefix_tokens_saved=s.prefix_tokens_saved,
            compiles=sum(r.compiles for r in runs),
            grid_compiled=all(event.is_set() for event in self._grid_compiled),
            device_busy_s=sum(r.busy_s for r in runs),
            cache_hits=c.hits,
            cache_misses=c.misses,
            runner_batches=[r.batches for r in runs],
            **kv_cache.counters(self.scheduler.caches),
        )
