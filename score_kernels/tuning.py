"""Tile sizes of the Pallas attention kernel, as data, looked up by (head_dim, dtype, backend).

`block_q` and `block_k` are the query and key tile of one kernel step. The host-built schedule
works in blocks of B tokens (`AttentionMeta.block_size`), so a tile is clamped to a divisor of B
at call time: a query tile reads the schedule row of the block it lies in, and a scheduled key
block is visited as B // block_k tiles. On TPU the schedule block B should therefore be at least
the tuned tile (128 or 256 fills the MXU); on GPU 64 is enough.

The entries are starting points taken from the public Pallas flash-attention defaults (MXU-sized
tiles on TPU; 64-128 row tiles with 4 warps on GPU), not yet measured on this kernel:
`python -m bench.bench_attention --backend gpu --kernels pallas --block-q ... --block-k ...`
measures a candidate, and a better one goes here.
"""

from typing import NamedTuple

import numpy as np

BACKENDS = ("tpu", "gpu", "mosaic_gpu", "cpu")


class BlockSizes(NamedTuple):
    """Tiles of one kernel step; the Triton fields are ignored elsewhere."""

    block_q: int  # query rows per tile (times the GQA group on TPU, which folds it in)
    block_k: int  # keys per tile
    num_warps: int | None = None  # Triton only
    num_stages: int | None = None  # Triton only


# (head_dim, dtype name, backend) -> tiles. "cpu" is the interpreter: tile size only changes the
# number of interpreted steps, so it takes the largest tile the schedule allows.
TUNED: dict[tuple[int, str, str], BlockSizes] = {
    (64, "bfloat16", "tpu"): BlockSizes(256, 256),
    (64, "float32", "tpu"): BlockSizes(128, 256),
    (128, "bfloat16", "tpu"): BlockSizes(128, 256),
    (128, "float32", "tpu"): BlockSizes(128, 128),
    (64, "bfloat16", "gpu"): BlockSizes(128, 64, num_warps=4, num_stages=3),
    (64, "float32", "gpu"): BlockSizes(64, 64, num_warps=4, num_stages=2),
    (128, "bfloat16", "gpu"): BlockSizes(64, 64, num_warps=4, num_stages=3),
    (128, "float32", "gpu"): BlockSizes(64, 32, num_warps=4, num_stages=2),
    # the Mosaic GPU form (score_kernels.mosaic_gpu): 64-row query tiles, one warpgroup's wgmma
    (64, "bfloat16", "mosaic_gpu"): BlockSizes(64, 128),
    (128, "bfloat16", "mosaic_gpu"): BlockSizes(64, 64),
}

# For shapes the table does not list.
DEFAULT: dict[str, BlockSizes] = {
    "tpu": BlockSizes(128, 128),
    "gpu": BlockSizes(64, 64, num_warps=4, num_stages=2),
    "mosaic_gpu": BlockSizes(64, 64),
    "cpu": BlockSizes(1024, 1024),
}


def lookup(head_dim: int, dtype, backend: str) -> BlockSizes:
    """The tuned tiles for this head dim, dtype and backend ("tpu", "gpu" (Triton),
    "mosaic_gpu" or "cpu").

    Falls back to the backend's default for shapes not in `TUNED`; raises ValueError for an
    unknown backend.
    """
    if backend not in DEFAULT:
        raise ValueError(f"unknown backend {backend!r}; known: {list(BACKENDS)}")
    return TUNED.get((head_dim, np.dtype(dtype).name, backend), DEFAULT[backend])
