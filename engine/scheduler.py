"""Scheduler actor: owns the queue, forms packed prefix batches, tracks requests to completion.

Pull-based: a batch is built when the device runner is free, from whatever is waiting then, so
requests that arrive while the device works join the next batch instead of a batch frozen ahead
of time. Only a queue holding a full token budget is batched ahead, to overlap host packing with
the device. When the device has just answered requests, it waits up to `linger` seconds for
that many more requests to queue: closed-loop clients come straight back, and without the wait
their cohorts split into small, slow batches. A lone request is never held back (its cohort is
itself). Requests are served in arrival order; one of many items may span several batches.
Requests of one output (`engine.kinds.Output`) batch together, laid out as the model's task
says for it (`layouts`): token states, for one, each text packed alone and computed whole,
nothing read from the KV cache.

With several device runners (data parallel) each has its own KV pool, so each has its own
cache here, and a window is planned for one runner: a free runner whose cache holds most of the
head request's prefix, else the least used. A runner is handed at most one batch ahead of the
one it runs.
"""

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass

import trio

from engine.channels import drain
from engine.errors import RejectKind
from engine.host import batching, packing
from engine.host.buckets import Buckets
from engine.host.kv_cache import KVCache
from engine.kinds import Layout, Output
from engine.messages import Batch, BatchDone, Cancel, Rejected, Scored, Timings, Tokenized
from engine.progress import InFlight, Progress, store

WINDOW_ITEMS = 4096  # queued items considered for one batch: bounds host work per batch
HANDED_AHEAD = 1  # batches a runner is handed beyond the one it runs
# a language model's outputs' layouts: what a scheduler serves unless told
SCORING = {Output.LOGPROBS: Layout.SHARED, Output.LOGITS: Layout.SHARED}


@dataclass
class SchedulerStats:
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    prefix_tokens_saved: int = 0


class SchedulerState:
    """Queue and request table; every method is synchronous and returns messages to send on."""

    def __init__(
        self,
        buckets: Buckets,
        *,
        token_budget: int,
        max_queued_tokens: int,
        linger: float = 0.0,
        caches: Sequence[KVCache | None] = (None,),
        layouts: Mapping[Output, Layout] = SCORING,
    ):
        self.buckets = buckets
        self.layouts = layouts  # of each output the model answers (`engine.tasks.Task.layout`)
        self.caches = list(caches)  # one per device runner
        self.assigned = [0] * len(self.caches)  # batches handed to each runner, not done
        self.runner_batches = [0] * len(self.caches)  # batches each runner was handed
        self.token_budget = token_budget
        self.max_queued_tokens = max_queued_tokens
        self.linger = linger
        self.last_done_at = -math.inf  # when the device last answered requests
        self.cohort = 0  # requests expected queued before batching: waiting then + answered
        self.requests: dict[int, Progress] = {}
        self.queue: OrderedDict[int, deque[int]] = OrderedDict()  # request id -> item indices
        self.queued_tokens = 0
        self.in_flight: dict[int, InFlight] = {}
        self.next_batch_id = 0
        # per runner: KV pools lost so far (batches carry the one they read)
        self.pool_generation = [0] * len(self.caches)
        self.received = 0  # messages from the tokenizer: one per message the engine sent it
        self.stats = SchedulerStats()
        # batches of the window at the head of the queue, valid until the queue changes
        self._window: list[tuple[int, int]] = []  # (request id, item index) per sequence
        self._window_sequences: list[list[int]] = []
        self._window_output = Output.LOGPROBS  # what the window's requests answer
        self._batches: Generator[packing.PackedBatch | None, bool, None] | None = None
        self._planned_for = 0  # the runner whose cache the window was planned against
        self._blocked = False  # the plan waits for pages a running batch writes

    @property
    def cache(self) -> KVCache | None:
        """The first runner's cache (the only one with one runner)."""
        return self.caches[0]

    def handle(self, msg, now: float) -> list[Scored | Rejected]:
        """Apply one inbound message; returns the caller-bound messages it produced."""
        if isinstance(msg, Tokenized | Rejected | Cancel):
            self.received += 1
        if isinstance(msg, Tokenized):
            return self._admit(msg, now)
        if isinstance(msg, Rejected):
            return [msg]
        if isinstance(msg, Cancel):
            if msg.id in self.requests:  # else finished or rejected already
                self._drop(msg.id)
            return []
        if isinstance(msg, BatchDone):
            return self._complete(msg, now)
        raise TypeError(f"scheduler got an unexpected {type(msg).__name__}")

    def _admit(self, msg: Tokenized, now: float) -> list[Scored | Rejected]:
        if not msg.sequences:  # no items: answered at once, with no scores
            timings = Timings(tokenize=msg.tokenize_s)
            return [Scored(id=msg.id, outputs=[], prompt_tokens=0, timings=timings)]
        tokens = sum(map(len, msg.sequences))
        if tokens > self.max_queued_tokens:
            return [
                Rejected(
                    id=msg.id,
                    kind=RejectKind.TOO_LARGE,
                    message=f"{tokens} tokens exceed the queue limit of {self.max_queued_tokens}",
                    field="items",
                )
            ]
        if self.queued_tokens + tokens > self.max_queued_tokens:
            return [
                Rejected(
                    id=msg.id,
                    kind=RejectKind.OVERLOADED,
                    message=f"queue full: {self.queued_tokens} tokens waiting "
                    f"(limit {self.max_queued_tokens})",
                )
            ]
        n = len(msg.sequences)
        self._replan()
        ragged = msg.output.ragged
        self.requests[msg.id] = req = Progress(msg, now, [None] * n if ragged else None, n)
        prefix = msg.sequences[0][:-1]  # what it finds cached stays cached until it runs
        shares = self.layouts[msg.output].shares
        caches = [c if shares else None for c in self.caches]
        req.holds = [None if c is None else (c.hold(prefix), c.epoch) for c in caches]
        self.queue[msg.id] = deque(range(n))
        self.queued_tokens += tokens
        return []

    def _drop(self, request_id: int) -> None:
        self._replan()
        req = self._forget(request_id)
        for idx in self.queue.pop(request_id, ()):
            self.queued_tokens -= len(req.msg.sequences[idx])

    def _forget(self, request_id: int) -> Progress:
        req = self.requests.pop(request_id)
        for cache, hold in zip(self.caches, req.holds, strict=True):
            if hold is not None:
                cache.let_go(*hold)
        return req

    def batch_wait(self, now: float) -> float | None:
        """Seconds to wait before building the next batch: 0 to build now, None to wait for the
        next message (nothing queued, or the device busy with less than a budget queued, none of
        it the rest of a request already running)."""
        if not self.queue:
            return None
        if self._blocked and self.assigned[self._planned_for]:
            return None  # the next batch reads what a running one writes
        if self.pick_runner() is not None and (
            self.queued_tokens >= self.token_budget or self._head_started()
        ):
            # a full batch either way, or the rest of a request a running batch began: its
            # answer waits for that rest, so build it ahead rather than after
            return 0.0
        if 0 not in self.assigned:
            return None  # let the queue grow until a device is free
        if len(self.queue) >= self.cohort:
            return 0.0
        return max(0.0, self.last_done_at + self.linger - now)

    def _head_started(self) -> bool:
        """Whether the request at the head of the queue has items in a batch already."""
        rid = next(iter(self.queue))
        return self.requests[rid].first_batch_at is not None

    def pick_runner(self) -> int | None:
        """The runner the next batch is for: a free one (the one whose cache holds most of the
        head request's prefix, then the one the window was planned for, then the least used),
        else one running a batch with none handed ahead; None when every runner has both."""
        for load in range(HANDED_AHEAD + 1):
            ready = [r for r, n in enumerate(self.assigned) if n == load]
            if ready:
                return max(ready, key=self._affinity)
        return None

    def _affinity(self, runner: int) -> tuple[int, bool, int]:
        cache, cached = self.caches[runner], 0
        if cache is not None and self.queue:
            rid, items = next(iter(self.queue.items()))
            cached = cache.peek(self.requests[rid].msg.sequences[items[0]][:-1])
        return cached, runner == self._planned_for, -self.runner_batches[runner]

    def next_batch(self, now: float, runner: int = 0) -> Batch | None:
        """The next packed batch from the head of the queue for `runner`, or None when nothing
        waits.

        The window at the head is grouped and planned once (`packing.batches`); later batches
        take the next of its batches until the queue changes other than by batching (an arrival,
        a cancellation, a failure), so a request of thousands of items is not regrouped for
        every batch.
        """
        start = time.perf_counter()
        if runner != self._planned_for:
            self._replan()
            self._planned_for = runner
        batch = self._next_packed()
        if batch is None:
            return None
        seqs = self._window_sequences
        rows = [self._window[i] for i in batch.order]
        taken = sum(len(seqs[i]) for i in batch.order)  # tokens, each prefix counted per row
        self._dequeue(rows, taken, now)
        self._count(batch.inputs, batch.real_tokens, taken)
        if any(batch.cached):
            for (rid, _), cached in zip(rows, batch.cached, strict=True):
                self.requests[rid].cached_tokens += cached
        output = self._window_output
        spans = None
        if output.per_token:
            spans = packing.token_spans(batch, seqs, self.layouts[output])
        return self._emit(batch, rows, time.perf_counter() - start, runner, spans)

    def _next_packed(self) -> packing.PackedBatch | None:
        """The next batch of the planned window; a window used up is replaced by the next one
        (a queue longer than `WINDOW_ITEMS` items)."""
        for _ in range(2):
            if self._batches is None:
                if not self.queue:
                    return None
                self._plan_window()
            try:  # a plan that waited is told whether anything it could wait for still runs
                idle = not self.assigned[self._planned_for]
                batch = self._batches.send(idle if self._blocked else None)
            except StopIteration:
                self._replan()
                continue
            self._blocked = batch is None
            return batch
        return None

    def _replan(self) -> None:
        """Plan the window again before the next batch (the queue changed)."""
        self._batches, self._blocked = None, False

    def _plan_window(self) -> None:
        self._window = window = self._head()
        self._window_sequences = [self.requests[r].msg.sequences[i] for r, i in window]
        labels = [self.requests[r].msg.labels for r, _ in window]
        visible = _visible([self.requests[r].msg for r, _ in window], window)
        # its requests all answer one output (`_head`)
        self._window_output = output = self.requests[window[0][0]].msg.output
        layout = self.layouts[output]
        self._blocked = False
        self._batches = batching.batches(
            self._window_sequences,
            labels,
            token_budget=self.token_budget,
            buckets=self.buckets,
            cache=self.caches[self._planned_for] if layout.shares else None,
            layout=layout,
            visible=visible,
        )

    def fail_waiting(self, error: Exception) -> list[Rejected]:
        """Fail every request at the head of the queue: the batch they formed could not be built.

        Only reached through a bug (inputs are validated before they queue); failing them keeps
        the scheduler serving instead of retrying the same batch forever.
        """
        ids = {rid for rid, _ in self._head()}
        return self._fail(ids, f"batch build failed: {type(error).__name__}: {error}")

    def _head(self) -> list[tuple[int, int]]:
        """The items at the head of the queue: up to `WINDOW_ITEMS`, of requests that all answer
        the output of the first (outputs run different programs, laid out their own ways)."""
        window, output = [], None
        for rid, items in self.queue.items():
            kind = self.requests[rid].msg.output
            if output is not None and kind != output:
                break
            output = kind
            window.extend((rid, idx) for idx in items)
            if len(window) >= WINDOW_ITEMS:
                break
        return window[:WINDOW_ITEMS]

    def _dequeue(self, rows: list[tuple[int, int]], tokens: int, now: float) -> None:
        """Take a batch's `rows` (with `tokens` tokens in all) off the queue."""
        taken: dict[int, set[int]] = {}
        for rid, idx in rows:
            taken.setdefault(rid, set()).add(idx)
        self.queued_tokens -= tokens
        for rid, idxs in taken.items():
            queued = self.queue[rid]
            if len(idxs) == len(queued):  # all of it (a batch takes only queued items)
                del self.queue[rid]
            else:
                self.queue[rid] = deque(i for i in queued if i not in idxs)
            req = self.requests[rid]
            if req.first_batch_at is None:
                req.first_batch_at = now

    def _count(self, inputs, real: int, unshared: int) -> None:
        self.stats.batches += 1
        self.stats.real_tokens += real
        self.stats.padded_tokens += int(inputs.tokens.shape[0]) - real
        self.stats.prefix_tokens_saved += unshared - real

    def _emit(
        self, packed: packing.PackedBatch, rows, build_s: float, runner: int, spans=None
    ) -> Batch:
        batch = Batch(
            id=self.next_batch_id,
            inputs=packed.inputs,
            rows=rows,
            real_tokens=packed.real_tokens,
            build_s=build_s,
            pool_generation=self.pool_generation[runner],
            output=self._window_output,
        )
        self.next_batch_id += 1
        output = self._window_output
        flight = InFlight(rows, packed.contexts, packed.cached, output, runner, spans)
        self.in_flight[batch.id] = flight
        self.assigned[runner] += 1
        self.runner_batches[runner] += 1
        for rid in {rid for rid, _ in rows}:
            self.requests[rid].build_s += build_s
            self.requests[rid].pack_s += packed.pack_s
        return batch

    def _complete(self, done: BatchDone, now: float) -> list[Scored | Rejected]:
        flight = self.in_flight.pop(done.id)
        rows = flight.rows
        self.assigned[flight.runner] -= 1
        self._settle(flight, done)
        if done.retry:
            self._requeue(flight)
            return []
        if done.error is not None:
            return self._fail({rid for rid, _ in rows}, f"device step failed: {done.error}")
        live = {rid: self.requests[rid] for rid, _ in rows if rid in self.requests}
        for req in live.values():  # cancelled or failed requests are no longer in the table
            req.device_s += done.device_s
            req.dispatch_s += done.dispatch_s
        store(live, flight, done.outputs)
        finished = [self._forget(rid).scored(rid) for rid, req in live.items() if not req.remaining]
        self.last_done_at = now
        self.cohort = len(self.queue) + len(finished)
        return finished

    def _settle(self, flight: InFlight, done: BatchDone) -> None:
        """Commit or abort the batch's cache contexts; a lost pool voids its runner's cache."""
        cache = self.caches[flight.runner]
        if cache is None:
            return
        if done.pool_reset:
            cache.reset()
            self.pool_generation[flight.runner] += 1
        for ctx in filter(None, flight.contexts):
            if done.error is None:
                cache.commit(ctx)
            else:
                cache.abort(ctx)

    def _requeue(self, flight: InFlight) -> None:
        """Put a batch's items that were not run back at the head of the line."""
        self._replan()
        back: dict[int, list[int]] = {}
        for (rid, idx), cached in zip(flight.rows, flight.cached, strict=True):
            if rid in self.requests:
                back.setdefault(rid, []).append(idx)
                self.requests[rid].cached_tokens -= cached
        for rid, idxs in back.items():
            self.queue[rid] = deque([*idxs, *self.queue.get(rid, ())])
            self.queue.move_to_end(rid, last=False)
            self.queued_tokens += sum(len(self.requests[rid].msg.sequences[i]) for i in idxs)

    def _fail(self, request_ids: set[int], error: str) -> list[Rejected]:
        out = []
        for rid in sorted(request_ids & self.requests.keys()):
            self._drop(rid)
            out.append(Rejected(id=rid, kind=RejectKind.FAILED, message=error))
        return out

    def queue_depth(self) -> int:
        """Requests waiting for (more of) their items to be batched."""
        return len(self.queue)

    def idle(self) -> bool:
        """True when no request is tracked: nothing queued, planned or running."""
        return not (self.requests or self.queue or self.in_flight) and self.queued_tokens == 0


async def run(
    state: SchedulerState,
    inbox: trio.MemoryReceiveChannel,
    batches: Sequence[trio.MemorySendChannel],
    results: trio.MemorySendChannel,
    *,
    on_change: Callable[[], None] = lambda: None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Apply inbound messages as they come while a second task feeds the runners; `on_change`
    is called after each burst of them is applied.

    `batches` holds one channel per runner, each with room for `HANDED_AHEAD + 1` batches;
    `results` must be unbounded (callers are woken without backpressure on the
    scheduler).
    """
    work = trio.Event()

    async def dispatch() -> None:
        nonlocal work
        while True:
            wait = state.batch_wait(trio.current_time())
            if wait is None or wait > 0:
                with trio.move_on_after(math.inf if wait is None else wait):
                    await work.wait()
                work = trio.Event()
                continue
            runner = state.pick_runner()
            try:
                batch = state.next_batch(trio.current_time(), runner)
            except Exception as e:
                for out in state.fail_waiting(e):
                    results.send_nowait(out)
                continue
            if batch is not None:
                batches[runner].send_nowait(batch)  # room: it was handed at most HANDED_AHEAD

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatch)
        task_status.started()
        async for first in inbox:
            now = trio.current_time()
            for msg in drain(inbox, first, math.inf):  # a burst is seen whole before batching
                for out in state.handle(msg, now):
                    results.send_nowait(out)
            work.set()
            on_change()


def _visible(msgs: list[Tokenized], window: list[tuple[int, int]]) -> list[int] | None:
    """Each windowed sequence's tokens its tokens see (`Tokenized.visible`), or None where all
    of every one's do."""
    if all(m.visible is None for m in msgs):
        return None
    return [
        len(m.sequences[i]) if m.visible is None else m.visible[i]
        for m, (_, i) in zip(msgs, window, strict=True)
    ]
