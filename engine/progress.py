"""Work in flight in the scheduler: a request's progress (its rows' outputs as batches answer
them, the time each stage took, and its `Scored` answer once every row is in) and a batch's."""

from dataclasses import dataclass, field

import numpy as np

from engine.kinds import Output
from engine.messages import HybridRow, Scored, Timings, Tokenized, TokenVectors


@dataclass
class Progress:
    """What the scheduler knows of one request it tracks."""

    msg: Tokenized
    queued_at: float
    # its score rows' outputs f32[n, W] (from its first batch answered on; W is the narrowest
    # label width of its batches so far, each of which holds the request's outputs), or (a
    # ragged output) a list of each item's answer
    outputs: np.ndarray | list | None = None
    remaining: int = 0
    first_batch_at: float | None = None
    build_s: float = 0.0
    pack_s: float = 0.0
    device_s: float = 0.0
    dispatch_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens read from the KV cache
    # per runner's cache: (node, epoch) of the cached prefix pinned while queued, or None
    holds: list[tuple[int, int] | None] = field(default_factory=list)

    def scored(self, request_id: int) -> Scored:
        """The finished request's answer."""
        timings = Timings(
            tokenize=self.msg.tokenize_s,
            queue=self.first_batch_at - self.queued_at,
            batch_build=self.build_s,
            plan=self.build_s - self.pack_s,
            pack=self.pack_s,
            device=self.device_s,
            dispatch=self.dispatch_s,
        )
        prompt = sum(map(len, self.msg.sequences))
        return Scored(
            id=request_id,
            outputs=self.outputs,
            prompt_tokens=prompt,
            cached_tokens=self.cached_tokens,
            truncated_tokens=self.msg.truncated,
            timings=timings,
        )


@dataclass
class InFlight:
    """A batch handed to a runner and not done yet."""

    rows: list[tuple[int, int]]  # (request id, item index) per score row
    contexts: list  # engine.host.packing.Context | None per chunk: committed or aborted when done
    cached: list[int]  # tokens of each row read from the KV cache
    output: Output = Output.LOGPROBS  # what its rows answer
    runner: int = 0
    # a per-token output's: each row's sequence's tokens [start, end) in the batch; None: a
    # row's output is its answer
    spans: list[tuple[int, int]] | None = None


def store_rows(live: dict[int, Progress], rows, outputs: np.ndarray) -> None:
    """Copy each live request's score rows out of the batch's outputs f32[S, L] (whose padding
    rows are thousands in a large bucket) into its own f32[n, W]: one copy per run of rows of
    one request (a request's rows are mostly one run)."""
    if not rows:  # a batch of prefix pieces only: nothing it computes is answered
        return
    rids = np.fromiter((rid for rid, _ in rows), np.int64, len(rows))  # [R]
    items = np.fromiter((idx for _, idx in rows), np.int64, len(rows))  # [R]
    starts = [0, *(np.flatnonzero(rids[1:] != rids[:-1]) + 1).tolist()]
    ends = starts[1:] + [len(rows)]
    for rid, start, end in zip(rids[starts].tolist(), starts, ends, strict=True):
        req = live.get(rid)
        if req is None:  # cancelled or failed meanwhile
            continue
        if req.outputs is None:
            req.outputs = np.empty((len(req.msg.sequences), outputs.shape[1]), outputs.dtype)
        width = min(req.outputs.shape[1], outputs.shape[1])
        if width < req.outputs.shape[1]:
            req.outputs = req.outputs[:, :width]
        req.outputs[items[start:end]] = outputs[start:end, :width]
        req.remaining -= end - start


def store(live: dict[int, Progress], flight: InFlight, outputs) -> None:
    """Each live request's answers out of a batch's `outputs` (`BatchDone`): its score rows, or
    each item's answer of its own (`Output.ragged`)."""
    output = flight.output
    if not output.ragged:
        store_rows(live, flight.rows, outputs)
        return
    if output is Output.SPARSE:  # engine.device.sparse.SparseRows
        answers = (outputs.row(r) for r in range(len(flight.rows)))
    elif output is Output.HYBRID:  # f32[S, E], f32[T], f32[T, D]
        answers = _hybrid_rows(live, flight, *outputs)
    elif output is Output.MULTI:  # f32[T, D]
        answers = _token_vectors(live, flight, outputs)
    else:  # f32[T, E], which is let go: each item's tokens copied out
        answers = (outputs[start:end].copy() for start, end in flight.spans)
    for (rid, idx), answer in zip(flight.rows, answers, strict=False):
        req = live.get(rid)
        if req is not None:
            req.outputs[idx] = answer
            req.remaining -= 1


def _hybrid_rows(live, flight: InFlight, pooled, weights, vectors):
    """Each row's `HybridRow`: its pooled state, and its tokens' weights, vectors and ids."""
    for r, (ids, span) in enumerate(_token_spans(live, flight)):
        yield HybridRow(pooled[r].copy(), weights[span].copy(), vectors[span].copy(), ids)


def _token_vectors(live, flight: InFlight, vectors):
    """Each row's `TokenVectors`: its tokens' vectors and ids."""
    for ids, span in _token_spans(live, flight):
        yield TokenVectors(vectors[span].copy(), ids)


def _token_spans(live, flight: InFlight):
    """Each row's token ids i32[n] (None: its request is gone) and its tokens' slice of the
    batch."""
    for (rid, idx), (start, end) in zip(flight.rows, flight.spans, strict=True):
        req = live.get(rid)
        ids = np.asarray(req.msg.sequences[idx], np.int32) if req is not None else None
        yield ids, slice(start, end)
