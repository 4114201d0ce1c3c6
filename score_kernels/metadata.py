"""Metadata every attention implementation consumes for a packed prefix batch.

A batch is one flat array of T query tokens (a multiple of the block size B). Their keys live in
one key space of C + T positions: `[0, C)` is the batch's *context region*, keys computed by
earlier batches and read from the paged KV pool (`context_pages`, C a multiple of B), and
`[C, C + T)` are the batch's own tokens, query t sitting at key C + t. Token t attends to at most
two key spans: `[prefix_start[t], prefix_end[t])` (the shared prefix of its group, in the context
region or the batch; empty when `prefix_start == prefix_end`) and `[own_start[t], own_end[t])`
(its own sequence in this batch). A decoder's own span is causal, `own_end[t] = C + t + 1`: its
sequence so far. An encoder's is the whole sequence, keys after the token's own included
(bidirectional), with no prefix span; or its first tokens alone, where the rest are padding
no token of it sees (a ColBERT query's hidden expansion: `engine.host.packing`), so the padding's
own span need not hold its own key. Every own span starts at or before the token's key C + t
and is not empty. A sequence
computed in chunks sees its earlier chunks as its prefix span, in the context region.
Padding tokens attend only to themselves, so no row is ever fully masked. Without a cache C = 0
and the key space is the batch.

The block schedule lists, for each block of B queries, the key blocks (of the key space) that
any of its tokens' spans touch: `block_kv[i, :block_count[i]]` ascending; entries past the count
repeat the last valid one and are masked. Work is proportional to the keys each query block
really sees, not to (C + T) * T.
"""

from typing import NamedTuple

import jax


class AttentionMeta(NamedTuple):
    """Per-token spans, the host-built block schedule and the context pages (a jax pytree)."""

    prefix_start: jax.Array  # i32[T], key space
    prefix_end: jax.Array  # i32[T], key space
    own_start: jax.Array  # i32[T], key space
    own_end: jax.Array  # i32[T], key space, exclusive: C + t + 1 when causal
    block_kv: jax.Array  # i32[T // B, K]
    block_count: jax.Array  # i32[T // B]
    context_pages: jax.Array  # i32[C // page]: pool pages laid end to end as keys [0, C)

    @property
    def block_size(self) -> int:
        return self.prefix_start.shape[0] // self.block_kv.shape[0]


def context_length(q: jax.Array, k: jax.Array) -> int:
    """C, from queries [T, ...] and keys [C + T, ...]."""
    return k.shape[0] - q.shape[0]
