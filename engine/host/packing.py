"""Host side of the packed prefix batch (DESIGN §3): the flat arrays of one planned batch
(`engine.host.planning` says which sequences it holds).

Layout of one batch: for each chunk, the shared prefix once, then each member's suffix; padding
at the end. Positions restart at 0 for every sequence, so RoPE sees what one-by-one scoring sees.
"""

import time
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np

import _native
from engine.host.buckets import Buckets
from engine.host.planning import Chunk, Tokens, real_tokens
from engine.kinds import Layout
from engine.models import PackedInputs
from score_kernels import make_meta


class Context(NamedTuple):
    """How one chunk of a batch uses the KV pool (made by `engine.host.kv_cache.KVCache`).

    Its members share tokens [0, prefix). The first `cached` of them (whole pages) are read from
    `read_pages`, which also hold the tokens the batch writes; the batch computes the rest of the
    prefix once and writes tokens from `cached` on into `write_pages`. Without read pages the
    chunk is laid out as without a pool and only writes.
    """

    cached: int
    prefix: int
    read_pages: np.ndarray  # i32: the chunk's run of the context region
    write_pages: np.ndarray  # i32: pages for tokens [cached, cached + len * page)
    node: int  # the prefix-cache node pinned for the cached part
    epoch: int  # the cache's epoch when planned (a pool reset voids older contexts)
    sequence: Tokens  # the chunk's first member: its first `prefix` tokens are the prefix


class PackedBatch(NamedTuple):
    """One batch ready for the device, and what its rows stand for."""

    inputs: PackedInputs  # numpy arrays, bucketed
    order: list[int]  # the sequence index behind each real score row
    real_tokens: int  # tokens laid out before padding
    contexts: list[Context | None]  # per chunk, to commit or abort when the batch is done
    cached: list[int]  # tokens of each real score row's sequence read from the pool
    pack_s: float = 0.0  # the host's time to pack it


class Cached(NamedTuple):
    """What a batch's chunks read from the KV pool: each chunk's context (None: it reads none),
    in pages of `page_size` tokens; and by sequence the tokens cached before its plan
    (`reused`: a row counts at most these as cached; None: no limit)."""

    contexts: Sequence[Context | None]
    page_size: int
    reused: Mapping[int, int] | None = None


def pack(
    seqs: Sequence[Tokens],
    labels: Sequence[Sequence[int]],
    chunks: Sequence[Chunk],
    buckets: Buckets,
    cached: Cached | None = None,
    *,
    scored: int | None = None,
    layout: Layout = Layout.SHARED,
    visible: Sequence[int] | None = None,
) -> PackedBatch:
    """Flat numpy arrays for one batch, and the sequence index behind each real score row.

    Chunks with a context (`cached`) read their cached tokens from the context region instead
    of laying them out. Only sequences below index `scored` (all by default) are scored: the
    rows of the others (chunked-prefill pieces) follow theirs and are not in `order`. The shape
    (T, S, L) and the context region C come from `buckets`; ValueError when the batch fits no
    bucket. `Layout.WHOLE` sequences (an encoder's) have every token see all of its sequence,
    or its first `visible[i]` tokens where given (the rest are padding no token sees), and are
    scored at their first token.
    """
    start = time.perf_counter()
    cached = cached or Cached([None] * len(chunks), 1)
    view, view_chunks = _without_cached(seqs, chunks, cached.contexts)
    # Unpadded: i32[N] for the five per-token arrays, i32[R] for rows and order.
    tokens, positions, pstart, pend, ostart, rows, order = _native.pack_chunks(view, view_chunks)
    rows, order = _scored_first(rows, order, scored)
    n = len(tokens)
    width = max((len(labels[m]) for m in order), default=0)
    t, s, label_width = buckets.shape(n, len(rows), width)
    region = _Region.of(cached, view, view_chunks, (positions, pstart, pend), t, buckets)
    pad = region.c + np.arange(n, t, dtype=np.int32)  # padding tokens attend only to themselves
    spans = (
        np.concatenate([region.pstart, pad]),
        np.concatenate([region.pend, pad]),
        np.concatenate([ostart + region.c, pad]),
    )
    shape = dict(
        block_size=buckets.block_size,
        width_buckets=((region.c + t) // buckets.block_size,),
        context_pages=region.pages,
        page_size=cached.page_size,
    )
    if layout is Layout.WHOLE:
        own_end, rows = _whole_sequences(view, view_chunks, ostart, rows, visible)
        shape["own_end"] = np.concatenate([own_end + region.c, pad + 1])
    elif visible is not None:
        raise ValueError("only sequences laid out whole see part of themselves")
    meta = make_meta(*spans, **shape)
    window_meta = make_meta(*spans, **shape, window=buckets.window) if buckets.window else None
    score_rows = np.zeros(s, np.int32)  # i32[S]
    score_rows[: len(rows)] = rows
    zeros = np.zeros(t - n, np.int32)
    inputs = PackedInputs(
        np.concatenate([tokens, zeros]),  # i32[T]
        np.concatenate([positions, zeros]),  # i32[T]
        meta,
        score_rows,
        _label_ids([labels[m] for m in order], s, label_width),
        np.array(len(order), np.int32),  # the scored rows: the others' outputs are not read
        np.array(n, np.int32),  # the real tokens: the padding's are not multiplied
        region.slots,
        window_meta,
    )
    counts = _cached_tokens(chunks, cached, order)
    return PackedBatch(inputs, order, n, list(cached.contexts), counts, time.perf_counter() - start)


def token_spans(
    batch: PackedBatch, seqs: Sequence[Tokens], layout: Layout
) -> list[tuple[int, int]]:
    """Each real score row's sequence's tokens [start, end) in `batch`, a batch of sequences
    packed alone with none cached: a row is its sequence's first token (`Layout.WHOLE`, an
    encoder's) or its last."""
    rows = batch.inputs.score_rows[: len(batch.order)].tolist()
    lengths = [len(seqs[i]) for i in batch.order]
    if layout is Layout.WHOLE:
        return [(r, r + n) for r, n in zip(rows, lengths, strict=True)]
    return [(r + 1 - n, r + 1) for r, n in zip(rows, lengths, strict=True)]


def _scored_first(rows: np.ndarray, order: np.ndarray, scored: int | None):
    """The rows with the scored sequences' first, in order, and the scored sequences' order."""
    if scored is not None:
        first = np.argsort(order >= scored, kind="stable")
        rows, order = rows[first], order[first]
        order = order[order < scored]
    return rows, order.tolist()


class _Region(NamedTuple):
    """A batch's context region of C keys read from the pool: the token spans shifted past it
    (or into it, for tokens whose prefix is cached), its pages, and each token's pool slot."""

    c: int
    pstart: np.ndarray  # i32[N]
    pend: np.ndarray  # i32[N]
    pages: np.ndarray  # i32[C / page_size]
    slots: np.ndarray  # i32[T]: the pool slot each token's K/V is written to; -1: none

    @classmethod
    def of(cls, cached: Cached, view, view_chunks, arrays, t: int, buckets: Buckets) -> "_Region":
        positions, pstart, pend = arrays
        page_size = cached.page_size
        region = _context_region(cached.contexts, page_size)  # [(offset, pages)] per chunk
        pages = np.concatenate([np.zeros(0, np.int32)] + [p for _, p in region]).astype(np.int32)
        c = buckets.context_for(len(pages) * page_size)
        slots = np.full(t, -1, np.int32)
        in_context = np.zeros(len(positions), bool)
        spans = (positions, pstart, pend, in_context)  # `_place` writes into these
        laid_out = zip(_bases(view, view_chunks), cached.contexts, region, strict=True)
        for (base, end, chunk), ctx, (offset, _) in laid_out:
            if ctx is not None:
                _place(ctx, (base, end, chunk.prefix_len), offset, spans, slots, page_size)
        padded = np.concatenate([pages, np.zeros(c // page_size - len(pages), np.int32)])
        shift = lambda x: np.where(in_context, x, x + c)
        return cls(c, shift(pstart), shift(pend), padded, slots)


def _cached_tokens(chunks: Sequence[Chunk], cached: Cached, order: list[int]) -> list[int]:
    """Each scored row's tokens read from the pool, at most what was cached before its plan."""
    counts: dict[int, int] = {}
    for chunk, ctx in zip(chunks, cached.contexts, strict=True):
        if ctx is not None and ctx.cached:
            counts.update(dict.fromkeys(chunk.members, ctx.cached))
    if not counts:  # nothing read from the pool (a cold cache, or a batch that reads none)
        return [0] * len(order)
    if cached.reused is not None:
        counts = {m: min(c, cached.reused.get(m, 0)) for m, c in counts.items()}
    return [counts.get(m, 0) for m in order]


def _whole_sequences(
    view: Sequence[Tokens],
    chunks: Sequence[Chunk],
    ostart: np.ndarray,  # i32[N]
    rows: np.ndarray,  # i32[R]: each sequence's last token
    visible: Sequence[int] | None,
) -> tuple[np.ndarray, np.ndarray]:  # own_end i32[N], rows i32[R]
    """An encoder's layout: each token's own span ends with its sequence (or after its
    sequence's `visible` first tokens), and a sequence is scored at its first token."""
    if any(c.prefix_len or len(c.members) != 1 for c in chunks):
        raise ValueError("an encoder's sequences are laid out alone, with no shared prefix")
    members = [c.members[0] for c in chunks]
    lengths = np.array([len(view[m]) for m in members], np.int32)
    ends = np.cumsum(lengths, dtype=np.int32)
    if visible is not None:
        ends = ends - lengths + np.array([visible[m] for m in members], np.int32)
    return np.repeat(ends, lengths), ostart[rows]


def laid_out(
    seqs: Sequence[Tokens], chunks: Sequence[Chunk], contexts: Sequence[Context | None]
) -> int:
    """Tokens `pack` would lay out for these chunks and contexts (padding aside)."""
    view, view_chunks = _without_cached(seqs, chunks, contexts)
    return real_tokens(view_chunks, view)


def _without_cached(
    seqs: Sequence[Tokens], chunks: Sequence[Chunk], contexts: Sequence[Context | None]
) -> tuple[list[Tokens], list[Chunk]]:
    """Sequences and chunks as laid out: a chunk that reads a context drops its cached tokens
    and shares the rest of its context's prefix."""
    view, view_chunks = list(seqs), []
    for chunk, ctx in zip(chunks, contexts, strict=True):
        if ctx is None or not len(ctx.read_pages):
            view_chunks.append(chunk)
            continue
        for m in chunk.members:
            view[m] = seqs[m][ctx.cached :]
        view_chunks.append(Chunk(ctx.prefix - ctx.cached, chunk.members))
    return view, view_chunks


def _bases(view: Sequence[Tokens], chunks: Sequence[Chunk]) -> Iterator[tuple[int, int, Chunk]]:
    """(first token, end, chunk) of each chunk as laid out."""
    base = 0
    for chunk in chunks:
        end = base + real_tokens([chunk], view)
        yield base, end, chunk
        base = end


def _context_region(
    contexts: Sequence[Context | None], page_size: int
) -> list[tuple[int, np.ndarray]]:
    """(offset in the context region, pages) of each chunk: the runs laid end to end."""
    region, offset = [], 0
    for ctx in contexts:
        pages = ctx.read_pages if ctx is not None else np.zeros(0, np.int32)
        region.append((offset, pages))
        offset += len(pages) * page_size
    return region


def _place(
    ctx: Context,
    extent: tuple[int, int, int],  # first token, end and laid-out prefix length of the chunk
    offset: int,  # the chunk's run in the context region
    arrays: tuple[np.ndarray, ...],  # positions, pstart, pend i32[N]; in_context bool[N]
    slots: np.ndarray,  # i32[T]
    page: int,
) -> None:
    """Point one chunk's spans at its context run and its prefix tokens' K/V at their slots."""
    base, end, head = extent
    positions, pstart, pend, in_context = arrays
    if len(ctx.read_pages):
        positions[base:end] += ctx.cached
        pstart[base:end] = offset
        pend[base : base + head] = offset + ctx.cached  # the prefix computed here
        pend[base + head : end] = offset + ctx.prefix  # members read the whole prefix
        in_context[base:end] = True
    written = np.arange(min(len(ctx.write_pages) * page, ctx.prefix - ctx.cached))
    # the chunk's prefix tokens are laid out first, from position `cached` (a page boundary) on
    slots[base + written] = ctx.write_pages[written // page] * page + written % page


def _label_ids(labels: Sequence[Sequence[int]], rows: int, width: int) -> np.ndarray:
    """i32[rows, width]: row r holds `labels[r]`, zero-padded."""
    label_ids = np.zeros((rows, width), np.int32)
    lengths = np.fromiter(map(len, labels), np.intp, len(labels))  # [R]
    filled = np.arange(width) < lengths[:, None]  # bool[R, width], row-major as `chain`'s ids
    label_ids[: len(labels)][filled] = np.fromiter(chain.from_iterable(labels), np.int32)
    return label_ids


def empty_batch(
    tokens: int,
    rows: int,
    labels: int,
    block_size: int,
    window: int = 0,
    *,
    context: int = 0,
    page_size: int = 1,
) -> PackedInputs:
    """An all-padding batch of shape (T, S, L), for compiling that program ahead of traffic
    (with the sliding-window metadata a model of `window` needs), with a context region of
    `context` keys read from pool pages of `page_size` tokens (whole pages and blocks)."""
    if context % block_size or context % page_size:
        raise ValueError(f"context {context} is not whole blocks of {block_size} and pages")
    pad = np.arange(context, context + tokens, dtype=np.int32)  # each attends only to itself
    meta = make_meta(
        pad,
        pad,
        pad,
        block_size=block_size,
        width_buckets=((context + tokens) // block_size,),
        context_pages=np.zeros(context // page_size, np.int32),
        page_size=page_size,
    )
    zeros = np.zeros(tokens, np.int32)
    return PackedInputs(
        zeros,
        zeros,
        meta,
        np.zeros(rows, np.int32),
        np.zeros((rows, labels), np.int32),
        np.array(rows, np.int32),  # every row computed, as when a caller fills them in
        np.array(tokens, np.int32),  # every token too
        np.full(tokens, -1, np.int32),
        meta if window else None,  # padding alone: the window changes nothing
    )
