"""Host-side construction of the block schedule for packed two-span attention (numpy only).

For each block of B queries the schedule lists the key blocks (of the key space: the context
region of C keys, then the batch; see `score_kernels.metadata`) that any of its tokens' two spans
touch. It is built from per-token intervals of key blocks, merged per query block and expanded,
so the cost follows the size of the schedule rather than (T/B)^2. The compiled twin
(`_native._schedule`) does the same in one pass over each query block's tokens and is used when
built; `IMPLEMENTATIONS` holds both so tests run each.
"""

from collections.abc import Sequence

import numpy as np

from score_kernels.metadata import AttentionMeta

try:
    from _native import _schedule
except ImportError:  # not built: the numpy form
    _schedule = None


def build_block_schedule(
    prefix_start: np.ndarray,  # i32[T]
    prefix_end: np.ndarray,  # i32[T]
    own_start: np.ndarray,  # i32[T]
    *,
    block_size: int,
    width_buckets: Sequence[int],
    context: int = 0,
    own_end: np.ndarray | None = None,  # i32[T]; None: causal, C + t + 1
) -> tuple[np.ndarray, np.ndarray]:
    """Key blocks each query block must visit, with `context` keys (C) before the batch.

    Returns `block_kv` i32[T//B, K] (ascending unique key blocks per query block, padded by
    repeating the last valid entry) and `block_count` i32[T//B]. K is the smallest entry of
    `width_buckets` that holds the widest row. Raises ValueError when T or C is not a multiple of
    `block_size`, when the spans are malformed, or when no bucket is wide enough.
    """
    return _CHOSEN(
        prefix_start,
        prefix_end,
        own_start,
        block_size=block_size,
        width_buckets=width_buckets,
        context=context,
        own_end=own_end,
    )


def _numpy_block_schedule(
    prefix_start: np.ndarray,  # i32[T]
    prefix_end: np.ndarray,  # i32[T]
    own_start: np.ndarray,  # i32[T]
    *,
    block_size: int,
    width_buckets: Sequence[int],
    context: int = 0,
    own_end: np.ndarray | None = None,  # i32[T]; None: causal, C + t + 1
) -> tuple[np.ndarray, np.ndarray]:
    spans = _validated_spans(prefix_start, prefix_end, own_start, own_end, block_size, context)
    ps = spans[0]
    n = (context + ps.shape[0]) // block_size
    q, lo, hi = _block_intervals(*spans, block_size)
    q, lo, hi = _merge_intervals(q, lo, hi, n)
    n = ps.shape[0] // block_size
    length = hi - lo + 1
    count = np.bincount(q, weights=length, minlength=n).astype(np.int32)
    width = _pick_width(int(count.max()), width_buckets)
    return _pack_rows(lo, length, count, width), count


def make_meta(
    prefix_start: np.ndarray,  # i32[T]
    prefix_end: np.ndarray,  # i32[T]
    own_start: np.ndarray,  # i32[T]
    *,
    block_size: int,
    width_buckets: Sequence[int],
    context_pages: np.ndarray | None = None,  # i32[C // page]
    page_size: int = 0,
    window: int = 0,
    own_end: np.ndarray | None = None,  # i32[T]; None: causal
) -> AttentionMeta:
    """Build the schedule and bundle it with the spans as numpy-backed int32 AttentionMeta.

    `context_pages` (pages of `page_size` tokens) make the context region; none: C = 0.
    `own_end` makes own spans that end there (bidirectional: an encoder's); None makes them
    causal. `window` > 0 makes the metadata of a sliding-window layer: causal spans keep their
    last `window` keys (`window_spans`), bidirectional ones the keys within `window // 2` of the
    token (`local_spans`).
    """
    pages = np.zeros(0, np.int32) if context_pages is None else np.asarray(context_pages, np.int32)
    context = pages.shape[0] * page_size
    if own_end is not None and window:
        own_start, own_end = local_spans(own_start, own_end, window=window, context=context)
    elif window:
        prefix_start, own_start = window_spans(
            prefix_start, prefix_end, own_start, window=window, context=context
        )
    block_kv, block_count = build_block_schedule(
        prefix_start,
        prefix_end,
        own_start,
        block_size=block_size,
        width_buckets=width_buckets,
        context=context,
        own_end=own_end,  # None (causal) spares the schedule a distinct span per token
    )
    if own_end is None:
        own_end = np.arange(context + 1, context + len(own_start) + 1, dtype=np.int32)
    return AttentionMeta(
        prefix_start=np.asarray(prefix_start, dtype=np.int32),
        prefix_end=np.asarray(prefix_end, dtype=np.int32),
        own_start=np.asarray(own_start, dtype=np.int32),
        own_end=np.asarray(own_end, dtype=np.int32),
        block_kv=block_kv,
        block_count=block_count,
        context_pages=pages,
    )


def window_spans(
    prefix_start: np.ndarray,  # i32[T]
    prefix_end: np.ndarray,  # i32[T]
    own_start: np.ndarray,  # i32[T]
    *,
    window: int,
    context: int = 0,
) -> tuple[np.ndarray, np.ndarray]:  # prefix_start, own_start i32[T]
    """The spans of a sliding-window layer: each token sees only its last `window` keys.

    A token's visible keys, its prefix span then its own span, are its sequence's positions
    0..p in order (the packed layout keeps them so), and a window of W keeps those above
    p - W (Hugging Face's `kv > q - W`): the first `max(0, n - W)` of its n visible keys are
    dropped, from the prefix span first, by moving the span starts. Every kernel then honours
    the window with no change, and the schedule built from these spans skips what it drops.
    """
    if window < 1:
        raise ValueError(f"window must be positive, got {window}")
    ps, pe, os_ = (np.asarray(a, np.int64) for a in (prefix_start, prefix_end, own_start))
    key = context + np.arange(ps.shape[0])
    prefix = pe - ps
    drop = np.maximum(0, prefix + key - os_ + 1 - window)
    from_prefix = np.minimum(drop, prefix)
    return (ps + from_prefix).astype(np.int32), (os_ + drop - from_prefix).astype(np.int32)


def local_spans(
    own_start: np.ndarray,  # i32[T]
    own_end: np.ndarray,  # i32[T]
    *,
    window: int,
    context: int = 0,
) -> tuple[np.ndarray, np.ndarray]:  # own_start, own_end i32[T]
    """The own spans of a bidirectional sliding-window layer: each token sees the keys of its
    span within `window // 2` positions of its own on either side (ModernBERT's local attention,
    `|q - k| <= local_attention // 2`), by narrowing the span."""
    if window < 2:
        raise ValueError(f"a bidirectional window must be at least 2, got {window}")
    os_, oe = np.asarray(own_start, np.int64), np.asarray(own_end, np.int64)
    key = context + np.arange(os_.shape[0])
    half = window // 2
    return (
        np.maximum(os_, key - half).astype(np.int32),
        np.minimum(oe, key + half + 1).astype(np.int32),
    )


def _validated_spans(
    prefix_start: np.ndarray,  # i32[T]
    prefix_end: np.ndarray,  # i32[T]
    own_start: np.ndarray,  # i32[T]
    own_end: np.ndarray | None,  # i32[T]; None: causal
    block_size: int,
    context: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # i64[T] each
    given = (prefix_start, prefix_end, own_start) + (() if own_end is None else (own_end,))
    spans = [np.asarray(a, dtype=np.int64) for a in given]
    if any(a.ndim != 1 for a in spans) or len({a.shape for a in spans}) != 1:
        raise ValueError(f"spans must be 1-D of equal length, got {[a.shape for a in spans]}")
    ps, pe, os_ = spans[:3]
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    t = ps.shape[0]
    if t == 0 or t % block_size:
        raise ValueError(f"token count {t} is not a positive multiple of block size {block_size}")
    if context < 0 or context % block_size:
        raise ValueError(f"context {context} is not a multiple of block size {block_size}")
    pos = context + np.arange(t)
    oe = spans[3] if own_end is not None else pos + 1
    if np.any((os_ < 0) | (os_ > pos) | (oe <= os_) | (oe > context + t)):
        raise ValueError(
            "own spans must satisfy 0 <= own_start[t] <= C + t, own_start[t] < own_end[t] <= C + T"
        )
    if np.any((ps < 0) | (ps > pe) | (pe > context + t)):
        raise ValueError("prefix spans must satisfy 0 <= prefix_start <= prefix_end <= C + T")
    return ps, pe, os_, oe


def _block_intervals(
    ps: np.ndarray,  # i64[T]
    pe: np.ndarray,  # i64[T]
    os_: np.ndarray,  # i64[T]
    oe: np.ndarray,  # i64[T]
    block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query block, first key block, last key block) of every non-empty span, runs collapsed."""
    q_block = np.arange(ps.shape[0]) // block_size
    has_prefix = pe > ps
    q = np.concatenate([q_block, q_block[has_prefix]])
    lo = np.concatenate([os_ // block_size, ps[has_prefix] // block_size])
    hi = np.concatenate([(oe - 1) // block_size, (pe[has_prefix] - 1) // block_size])
    # A linear pass instead of a sort: tokens of one sequence in one block share their intervals,
    # so dropping adjacent repeats leaves few enough intervals for the sort that follows.
    keep = np.ones(q.shape[0], dtype=bool)
    keep[1:] = (q[1:] != q[:-1]) | (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return q[keep], lo[keep], hi[keep]


def _merge_intervals(
    q: np.ndarray,  # i64[N]
    lo: np.ndarray,  # i64[N]
    hi: np.ndarray,  # i64[N]
    n: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of the intervals of each query block as sorted, disjoint, non-touching intervals."""
    # Offsetting each query block by n + 1 keeps blocks apart (never touching) on one number
    # line, so a single running maximum merges every row at once.
    stride = n + 1
    order = np.argsort(q * stride + lo, kind="stable")
    lo_key = q[order] * stride + lo[order]
    hi_key = q[order] * stride + hi[order]
    reach = np.maximum.accumulate(hi_key)
    starts = np.flatnonzero(np.concatenate([[True], lo_key[1:] > reach[:-1] + 1]))
    ends = np.maximum.reduceat(hi_key, starts)
    q_merged = lo_key[starts] // stride
    return q_merged, lo_key[starts] - q_merged * stride, ends - q_merged * stride


def _pick_width(widest: int, width_buckets: Sequence[int]) -> int:
    fitting = [w for w in width_buckets if w >= widest]
    if not fitting:
        raise ValueError(
            f"schedule width {widest} exceeds the largest width bucket "
            f"{max(width_buckets, default=None)}"
        )
    return min(fitting)


def _pack_rows(
    lo: np.ndarray,  # i64[M]
    length: np.ndarray,  # i64[M]
    count: np.ndarray,  # i32[NQB]
    width: int,
) -> np.ndarray:  # i32[NQB, K]
    """Expand the disjoint sorted intervals into rows of `width` padded with the last entry."""
    total = int(length.sum())
    first = np.cumsum(length) - length
    cols = (np.repeat(lo - first, length) + np.arange(total)).astype(np.int32)
    valid = np.arange(width) < count[:, None]
    last = cols[np.cumsum(count, dtype=np.int64) - 1]
    block_kv = np.repeat(last[:, None], width, axis=1)
    # Boolean-mask assignment fills row-major, which is exactly the order of `cols`.
    block_kv[valid] = cols
    return block_kv


def _compiled_block_schedule(
    *spans: np.ndarray,
    block_size: int,
    width_buckets: Sequence[int],
    context: int = 0,
    own_end: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`build_block_schedule` in compiled code (`_native._schedule`)."""
    blocks, count = _schedule.block_lists(*spans, own_end, block_size, context)
    width = _pick_width(int(count.max()), width_buckets)
    return _schedule.block_rows(blocks, count, width), count


IMPLEMENTATIONS = {"numpy": _numpy_block_schedule}
if _schedule is not None:
    IMPLEMENTATIONS["native"] = _compiled_block_schedule
_CHOSEN = IMPLEMENTATIONS.get("native", _numpy_block_schedule)
