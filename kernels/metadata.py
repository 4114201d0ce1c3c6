"""Metadata every attention implementation consumes for a packed prefix batch.

A batch is one flat token array of length T (a multiple of the block size B). Token t attends to
at most two key spans: `[prefix_start[t], prefix_end[t])` (the shared prefix of its group, empty
when `prefix_start == prefix_end`) and `[own_start[t], t]` (its own sequence so far, causal).
Padding tokens attend only to themselves, so no row is ever fully masked.

The block schedule lists, for each block of B queries, the key blocks its spans touch:
`block_kv[i, :block_count[i]]` ascending; entries past the count repeat the last valid one and
are masked. Its width is bucketed so the compiled shape grid stays small. Work is proportional to
the keys each query block really sees, not to T^2.
"""

from typing import NamedTuple

import jax


class AttentionMeta(NamedTuple):
    """Per-token spans and the host-built block schedule (a jax pytree)."""

    prefix_start: jax.Array  # i32[T]
    prefix_end: jax.Array  # i32[T]
    own_start: jax.Array  # i32[T]
    block_kv: jax.Array  # i32[T // B, K]
    block_count: jax.Array  # i32[T // B]

    @property
    def block_size(self) -> int:
        return self.prefix_start.shape[0] // self.block_kv.shape[0]
