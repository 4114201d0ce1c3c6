"""Scheduler actor: owns the queue, forms packed prefix batches, tracks requests to completion.

Pull-based: a batch is built when the device runner is free, from whatever is waiting then, so
requests that arrive while the device works join the next batch instead of a batch frozen ahead
of time. Only a queue holding a full token budget is batched ahead, to overlap host packing with
the device. When the device has just answered requests, it waits up to `linger` seconds for
that many more requests to queue: closed-loop clients come straight back, and without the wait
their cohorts split into small, slow batches. A lone request is never held back (its cohort is
itself). Requests are served in arrival order; one of many items may span several batches.
"""

import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import trio

from engine import packing
from engine.channels import drain
from engine.messages import Batch, BatchDone, Cancel, Rejected, Scored, Timings, Tokenized

WINDOW_ITEMS = 4096  # queued items considered for one batch: bounds host work per batch


@dataclass
class _Request:
    msg: Tokenized
    queued_at: float
    logprobs: list = field(default_factory=list)
    remaining: int = 0
    first_batch_at: float | None = None
    build_s: float = 0.0
    device_s: float = 0.0


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
        buckets: packing.Buckets,
        *,
        token_budget: int,
        max_queued_tokens: int,
        linger: float = 0.0,
    ):
        self.buckets = buckets
        self.token_budget = token_budget
        self.max_queued_tokens = max_queued_tokens
        self.linger = linger
        self.last_done_at = -math.inf  # when the device last answered requests
        self.cohort = 0  # requests expected queued before batching: waiting then + answered
        self.requests: dict[int, _Request] = {}
        self.queue: OrderedDict[int, deque[int]] = OrderedDict()  # request id -> item indices
        self.queued_tokens = 0
        self.cancelled: set[int] = set()  # cancelled before the tokenizer handed them over
        self.highest_seen = -1  # the tokenizer hands requests over in id order
        self.in_flight: dict[int, list[tuple[int, int]]] = {}
        self.next_batch_id = 0
        self.stats = SchedulerStats()
        # batches planned from the head of the queue, valid until the queue changes
        self._plans: deque[list[packing.Chunk]] = deque()
        self._planned: tuple[list, list, list] = ([], [], [])

    def handle(self, msg, now: float) -> list[Scored | Rejected]:
        """Apply one inbound message; returns the caller-bound messages it produced."""
        if isinstance(msg, Tokenized):
            return self._admit(msg, now)
        if isinstance(msg, Rejected):
            return self._forward_rejection(msg)
        if isinstance(msg, Cancel):
            self._cancel(msg.id)
            return []
        if isinstance(msg, BatchDone):
            return self._complete(msg, now)
        raise TypeError(f"scheduler got an unexpected {type(msg).__name__}")

    def _arrived(self, request_id: int) -> bool:
        """Whether the caller still wants it; clears a cancellation that was waiting for it."""
        self.highest_seen = max(self.highest_seen, request_id)
        if request_id in self.cancelled:
            self.cancelled.discard(request_id)
            return False
        return True

    def _forward_rejection(self, msg: Rejected) -> list[Rejected]:
        return [msg] if self._arrived(msg.id) else []

    def _admit(self, msg: Tokenized, now: float) -> list[Rejected]:
        if not self._arrived(msg.id):
            return []
        tokens = sum(map(len, msg.sequences))
        if tokens > self.max_queued_tokens:
            return [
                Rejected(
                    id=msg.id,
                    kind="too_large",
                    message=f"items: {tokens} tokens exceed the queue limit of "
                    f"{self.max_queued_tokens}",
                )
            ]
        if self.queued_tokens + tokens > self.max_queued_tokens:
            return [
                Rejected(
                    id=msg.id,
                    kind="overloaded",
                    message=f"queue full: {self.queued_tokens} tokens waiting "
                    f"(limit {self.max_queued_tokens})",
                )
            ]
        n = len(msg.sequences)
        self._plans.clear()
        self.requests[msg.id] = _Request(msg, now, [None] * n, n)
        self.queue[msg.id] = deque(range(n))
        self.queued_tokens += tokens
        return []

    def _cancel(self, request_id: int) -> None:
        if request_id in self.requests:
            self._drop(request_id)
        elif request_id > self.highest_seen:
            self.cancelled.add(request_id)
        # else: finished or rejected already; nothing is left of it

    def _drop(self, request_id: int) -> None:
        self._plans.clear()
        req = self.requests.pop(request_id)
        for idx in self.queue.pop(request_id, ()):
            self.queued_tokens -= len(req.msg.sequences[idx])

    def batch_wait(self, now: float) -> float | None:
        """Seconds to wait before building the next batch: 0 to build now, None to wait for the
        next message (nothing queued, or the device busy with less than a budget queued)."""
        if not self.queue:
            return None
        if self.queued_tokens >= self.token_budget:
            return 0.0  # a full batch either way: build it ahead
        if self.in_flight:
            return None  # let the queue grow until the device is free
        if len(self.queue) >= self.cohort:
            return 0.0
        return max(0.0, self.last_done_at + self.linger - now)

    def next_batch(self, now: float) -> Batch | None:
        """The next packed batch from the head of the queue, or None when nothing waits.

        The window at the head is grouped and planned once; later batches take the next plan
        until the queue changes other than by batching (an arrival, a cancellation, a failure),
        so a request of thousands of items is not regrouped for every batch.
        """
        if not self._plans:
            self._plan_window()
        if not self._plans:
            return None
        start = time.perf_counter()
        window, seqs, labels = self._planned
        plan = self._plans.popleft()
        inputs, order = packing.pack(seqs, labels, plan, self.buckets)
        rows = [window[i] for i in order]
        real = packing.real_tokens(plan, seqs)
        self._dequeue(rows, seqs, order, now)
        self._count(inputs, real, sum(len(seqs[i]) for i in order))
        return self._emit(inputs, rows, real, time.perf_counter() - start)

    def _plan_window(self) -> None:
        window = self._window()
        seqs = [self.requests[rid].msg.sequences[idx] for rid, idx in window]
        labels = [self.requests[rid].msg.labels for rid, _ in window]
        self._planned = (window, seqs, labels)
        if window:
            self._plans.extend(
                packing.plan(seqs, token_budget=self.token_budget, buckets=self.buckets)
            )

    def fail_waiting(self, error: Exception) -> list[Rejected]:
        """Fail every request at the head of the queue: the batch they formed could not be built.

        Only reached through a bug (inputs are validated before they queue); failing them keeps
        the scheduler serving instead of retrying the same batch forever.
        """
        ids = {rid for rid, _ in self._window()}
        return self._fail(ids, f"batch build failed: {type(error).__name__}: {error}")

    def _window(self) -> list[tuple[int, int]]:
        window = []
        for rid, items in self.queue.items():
            window.extend((rid, idx) for idx in items)
            if len(window) >= WINDOW_ITEMS:
                break
        return window[:WINDOW_ITEMS]

    def _dequeue(self, rows, seqs, order, now: float) -> None:
        taken: dict[int, set[int]] = {}
        for (rid, idx), i in zip(rows, order, strict=True):
            taken.setdefault(rid, set()).add(idx)
            self.queued_tokens -= len(seqs[i])
        for rid, idxs in taken.items():
            remaining = deque(i for i in self.queue[rid] if i not in idxs)
            if remaining:
                self.queue[rid] = remaining
            else:
                del self.queue[rid]
            req = self.requests[rid]
            if req.first_batch_at is None:
                req.first_batch_at = now

    def _count(self, inputs, real: int, unshared: int) -> None:
        self.stats.batches += 1
        self.stats.real_tokens += real
        self.stats.padded_tokens += int(inputs.tokens.shape[0]) - real
        self.stats.prefix_tokens_saved += unshared - real

    def _emit(self, inputs, rows, real: int, build_s: float) -> Batch:
        batch = Batch(
            id=self.next_batch_id, inputs=inputs, rows=rows, real_tokens=real, build_s=build_s
        )
        self.next_batch_id += 1
        self.in_flight[batch.id] = rows
        for rid in {rid for rid, _ in rows}:
            self.requests[rid].build_s += build_s
        return batch

    def _complete(self, done: BatchDone, now: float) -> list[Scored | Rejected]:
        rows = self.in_flight.pop(done.id)
        if done.error is not None:
            return self._fail({rid for rid, _ in rows}, f"device step failed: {done.error}")
        live = {rid: self.requests[rid] for rid, _ in rows if rid in self.requests}
        for req in live.values():  # cancelled or failed requests are no longer in the table
            req.device_s += done.device_s
        for r, (rid, idx) in enumerate(rows):
            if rid in live:
                live[rid].logprobs[idx] = done.logprobs[r, : len(live[rid].msg.labels)].tolist()
                live[rid].remaining -= 1
        finished = [self._finish(rid, now) for rid, req in live.items() if req.remaining == 0]
        self.last_done_at = now
        self.cohort = len(self.queue) + len(finished)
        return finished

    def _fail(self, request_ids: set[int], error: str) -> list[Rejected]:
        out = []
        for rid in sorted(request_ids & self.requests.keys()):
            self._drop(rid)
            out.append(Rejected(id=rid, kind="failed", message=error))
        return out

    def _finish(self, rid: int, now: float) -> Scored:
        req = self.requests.pop(rid)
        timings = Timings(
            tokenize=req.msg.tokenize_s,
            queue=req.first_batch_at - req.queued_at,
            batch_build=req.build_s,
            device=req.device_s,
        )
        prompt = sum(map(len, req.msg.sequences))
        return Scored(id=rid, logprobs=req.logprobs, prompt_tokens=prompt, timings=timings)

    def queue_depth(self) -> int:
        """Requests waiting for (more of) their items to be batched."""
        return len(self.queue)


async def run(
    state: SchedulerState,
    inbox: trio.MemoryReceiveChannel,
    batches: trio.MemorySendChannel,
    results: trio.MemorySendChannel,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Apply inbound messages as they come while a second task feeds the runner.

    `results` must be unbounded (callers are woken without backpressure on the scheduler).
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
            try:
                batch = state.next_batch(trio.current_time())
            except Exception as e:
                for out in state.fail_waiting(e):
                    results.send_nowait(out)
                continue
            if batch is not None:
                await batches.send(batch)  # waits until the runner can take it

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatch)
        task_status.started()
        async for first in inbox:
            now = trio.current_time()
            for msg in drain(inbox, first, math.inf):  # a burst is seen whole before batching
                for out in state.handle(msg, now):
                    results.send_nowait(out)
            work.set()
