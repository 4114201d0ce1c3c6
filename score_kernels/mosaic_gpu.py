"""Packed two-span attention on Pallas' Mosaic GPU backend: Hopper (sm90) and newer, bfloat16.

It consumes the metadata and block schedule `score_kernels.pallas` consumes and computes the same
function, the way a Hopper kernel does: one warpgroup per (query head, 64-row query tile).

- The query tile and its rows' spans arrive in shared memory by TMA.
- The scheduled key tiles stream through two shared-memory slots: the copy of step s + 1 is
  issued before step s is multiplied, so the load of one tile overlaps the products of the
  last. Both slots are free by then: step s - 1's products were awaited before it returned.
- The products are warpgroup matmuls (wgmma): S = Q K^T with both operands in shared memory,
  then O += P V with P straight from registers.
- The online softmax keeps f32 statistics in registers (the WGMMA layout's rows).
- The output leaves through the query tile's shared memory by TMA.

bfloat16 only: wgmma multiplies f32 operands only as TF32, which is not exact, so f32 stays on
the Triton form (`score_kernels.pallas`, full-f32 dots). Query head h reads kv head h // G, as in
the Triton form.

`interpret=True` runs it in Pallas' GPU interpret mode on any host. That mode simulates shared
memory, TMA copies and barriers, and reads uninitialised memory as NaN. It models neither
register nor transposed wgmma operands, so there the two products are dots over the same
shared-memory tiles; every copy, barrier and index is the compiled form's.
"""

import functools
import importlib.util
import sys
from types import ModuleType
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from score_kernels import devices, tuning
from score_kernels.metadata import AttentionMeta
from score_kernels.paging import LayerPool, with_context
from score_kernels.pallas import MASKED, Tiles, check_inputs, key_tile, span_columns, tiles_of
from score_kernels.softcap import soft_cap
from score_kernels.tuning import BlockSizes


def _imported_on_first_use(name: str) -> ModuleType:
    """Module `name`, its body run at its first attribute access (the standard library's lazy
    import recipe)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# JAX's Mosaic GPU backend takes ~120 ms to import (a quiet 2-core machine; more under load),
# which no run that does not call this form (every CPU and TPU run) should pay
plgpu = _imported_on_first_use("jax.experimental.pallas.mosaic_gpu")

BACKEND = "mosaic_gpu"  # its key in `score_kernels.tuning`
ROWS = 64  # query rows per tile: one warpgroup's wgmma (M = 64)
_SLOTS = 2  # K/V tiles in flight


@functools.partial(jax.jit, static_argnames=("scale", "softcap", "interpret", "block_sizes"))
def attention_mosaic_gpu(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
    interpret: bool = False,
    block_sizes: BlockSizes | None = None,
) -> jax.Array:  # [T, H, D] bfloat16
    """Attention over the prefix span and own span, visiting only scheduled key blocks, as
    `score_kernels.pallas.attention_pallas` computes it.

    q, k and v are bfloat16 with a head dim that is a multiple of 64; the schedule block B is a
    multiple of 64. `softcap` > 0 soft-caps the scaled scores (Gemma 2). `block_sizes` overrides
    the tuned key tile (a multiple of 64 that divides B, at most 256); the query tile is always
    64 rows. `interpret=True` runs the GPU interpret mode (any host). Raises ValueError on
    inputs this form cannot run (`supports`) or malformed metadata. The context region's keys
    are gathered from `pool`'s pages first (`score_kernels.paging`).
    """
    k, v = with_context(k, v, meta, pool)
    check_inputs(q, k, v, meta)
    sizes = block_sizes or tuning.lookup(q.shape[-1], q.dtype, BACKEND)
    tiles = tiles_of(
        BlockSizes(ROWS, sizes.block_k),
        meta.block_kv.shape,
        meta.block_size,
        tuned=block_sizes is None,
    )
    _check(q, meta.block_size, tiles)
    group = q.shape[1] // k.shape[1]
    body = functools.partial(
        _kernel, scale=scale, softcap=softcap, tiles=tiles, group=group, interpret=interpret
    )
    t, num_heads, _ = q.shape
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(num_heads, t // ROWS),
        grid_names=("heads", "q"),
        interpret=_interpret_params() if interpret else None,
    )(
        meta.block_kv.reshape(-1),
        meta.block_count,
        jnp.concatenate(span_columns(meta), axis=1).T,  # i32[4, T]
        q,
        k,
        v,
    )


def attention_mosaic_gpu_auto(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
) -> jax.Array:  # [T, H, D]
    """`attention_mosaic_gpu` compiled on a GPU and interpreted elsewhere (for debugging: the
    interpreter is slow)."""
    return attention_mosaic_gpu(
        q, k, v, meta, scale=scale, softcap=softcap, pool=pool, interpret=interpreted()
    )


def interpreted() -> bool:
    """Whether `attention_mosaic_gpu_auto` runs the interpreter here (no GPU). The interpreter
    serves one device at a time: two devices running it at once (a mesh's shards) fail, then
    hang."""
    return devices.backend() != "gpu"


def supports(head_dim: int | None, dtype, block_size: int | None = None) -> bool:
    """Whether this form runs this head dim, dtype and schedule block (each None: unknown,
    assumed supported): bfloat16, head dims in whole 64-column swizzle tiles, blocks in whole
    `ROWS`-row query tiles."""
    bf16 = dtype is None or jnp.dtype(dtype) == jnp.bfloat16
    tiled = block_size is None or block_size % ROWS == 0
    return bf16 and tiled and (head_dim is None or head_dim % 64 == 0)


def _kernel(
    block_kv_ref,  # GMEM i32[n * K]: the schedule, row-major
    count_ref,  # GMEM i32[n]
    spans_ref,  # GMEM i32[4, T]: prefix_start, prefix_end, own_start, own_end
    q_ref,  # GMEM [T, H, D]
    k_ref,  # GMEM [C + T, Hkv, D]
    v_ref,  # GMEM [C + T, Hkv, D]
    o_ref,  # GMEM [T, H, D]
    *,
    scale: float,
    softcap: float,
    tiles: Tiles,
    group: int,
    interpret: bool,
):
    head, q_tile = lax.axis_index("heads"), lax.axis_index("q")
    rows = pl.ds(q_tile * ROWS, ROWS)
    kv_head = lax.div(head, jnp.int32(group))
    steps = count_ref[lax.div(q_tile, jnp.int32(tiles.q_split))] * tiles.k_split
    head_dim = q_ref.shape[-1]

    def key_start(step):
        return key_tile(block_kv_ref, count_ref, q_tile, step, tiles) * tiles.block_k

    def scoped(q_smem, k_smem, v_smem, spans_smem, barriers):
        q_bar, spans_bar, k_bars, v_bars = barriers

        def fetch(step, slot):
            keys = (pl.ds(key_start(step), tiles.block_k), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[slot], k_bars.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[slot], v_bars.at[slot])

        plgpu.copy_gmem_to_smem(q_ref.at[rows, head], q_smem, q_bar)
        plgpu.copy_gmem_to_smem(spans_ref.at[:, rows], spans_smem, spans_bar)
        pl.when(steps > 0)(lambda: fetch(0, 0))
        plgpu.barrier_wait(spans_bar)
        layout = _Layouts(interpret)
        spans = [layout.rows(spans_smem[i]) for i in range(4)]  # 4 x i32[64]
        plgpu.barrier_wait(q_bar)

        def step_body(step, state):
            slot = lax.rem(step, _SLOTS)
            pl.when(step + 1 < steps)(lambda: fetch(step + 1, 1 - slot))
            plgpu.barrier_wait(k_bars.at[slot])
            scores = _scores(q_smem, k_smem.at[slot], interpret)  # f32[64, Bk]
            visible = _visible(spans, key_start(step), tiles.block_k, layout)
            probs, state = _fold(state, soft_cap(scores * scale, softcap), visible)
            plgpu.barrier_wait(v_bars.at[slot])
            return state._replace(acc=state.acc + _values(probs, v_smem.at[slot], interpret))

        state = lax.fori_loop(0, steps, step_body, _empty(head_dim, layout))
        q_smem[...] = _finish(state).astype(q_smem.dtype)  # the query tile is spent: reuse it
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, o_ref.at[rows, head])
        plgpu.wait_smem_to_gmem(0)

    dtype = q_ref.dtype
    # 128-byte swizzled tiles of 64 bf16 columns, as wgmma reads shared memory
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    pl.run_scoped(
        scoped,
        plgpu.SMEM((ROWS, head_dim), dtype, transforms=swizzled),
        plgpu.SMEM((_SLOTS, tiles.block_k, head_dim), dtype, transforms=swizzled),
        plgpu.SMEM((_SLOTS, tiles.block_k, head_dim), dtype, transforms=swizzled),
        plgpu.SMEM((4, ROWS), jnp.int32),
        (
            plgpu.Barrier(),
            plgpu.Barrier(),
            plgpu.Barrier(num_barriers=_SLOTS),
            plgpu.Barrier(num_barriers=_SLOTS),
        ),
    )


class _Layouts:
    """Register layouts for the compiled form: a row statistic lives where the WGMMA layout
    keeps its row. The interpreter has no layouts, so there they are the identity."""

    def __init__(self, interpret: bool):
        self.interpret = interpret

    def rows(self, x: jax.Array) -> jax.Array:  # [64]
        return self._cast(x, plgpu.Layout.WGMMA.reduce(1))

    def tile(self, x: jax.Array) -> jax.Array:  # [64, N]
        return self._cast(x, plgpu.Layout.WGMMA)

    def columns(self, width: int) -> jax.Array:  # i32[64, width]: each element's column
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, (ROWS, width), 1)
        return plgpu.broadcasted_iota(jnp.int32, (ROWS, width), 1, layout=plgpu.Layout.WGMMA)

    def _cast(self, x, layout):
        return x if self.interpret else plgpu.layout_cast(x, layout)


class _Softmax(NamedTuple):
    """Online-softmax state of the tile's 64 rows."""

    running_max: jax.Array  # f32[64]
    total: jax.Array  # f32[64]
    acc: jax.Array  # f32[64, D]


def _empty(head_dim: int, layout: _Layouts) -> _Softmax:
    return _Softmax(
        layout.rows(jnp.full((ROWS,), MASKED, jnp.float32)),
        layout.rows(jnp.zeros((ROWS,), jnp.float32)),
        layout.tile(jnp.zeros((ROWS, head_dim), jnp.float32)),
    )


def _visible(
    spans: list[jax.Array],  # 4 x i32[64]: prefix_start, prefix_end, own_start, own_end
    key_start: jax.Array,  # i32[]
    block_k: int,
    layout: _Layouts,
) -> jax.Array:  # bool[64, Bk]: query row may see key column
    prefix_start, prefix_end, own_start, own_end = (_by_row(x, block_k) for x in spans)
    key = key_start + layout.columns(block_k)
    return ((key >= prefix_start) & (key < prefix_end)) | ((key >= own_start) & (key < own_end))


def _fold(
    state: _Softmax,
    scores: jax.Array,  # f32[64, Bk], scaled (and capped)
    visible: jax.Array,  # bool[64, Bk]
) -> tuple[jax.Array, _Softmax]:  # the tile's probabilities f32[64, Bk], the state before P V
    """One key tile into the online softmax, as `score_kernels.pallas` folds it; the caller adds the
    tile's P V to the rescaled accumulator."""
    scores = jnp.where(visible, scores, MASKED)
    new_max = jnp.maximum(state.running_max, scores.max(axis=1))
    # Zeroed where masked: a row with nothing visible yet must not count exp(0) per masked key.
    probs = jnp.where(visible, jnp.exp(scores - _by_row(new_max, scores.shape[1])), 0.0)
    rescale = jnp.exp(state.running_max - new_max)
    total = state.total * rescale + probs.sum(axis=1)
    acc = state.acc * _by_row(rescale, state.acc.shape[1])
    return probs, _Softmax(new_max, total, acc)


def _finish(state: _Softmax) -> jax.Array:  # f32[64, D]
    # A row that saw no key (only with a malformed schedule) has total 0 and acc 0: it yields 0.
    total = jnp.maximum(state.total, jnp.finfo(jnp.float32).tiny)
    return state.acc / _by_row(total, state.acc.shape[1])


def _by_row(x: jax.Array, width: int) -> jax.Array:  # [64] -> [64, width]
    return lax.broadcast_in_dim(x, (ROWS, width), [0])


def _scores(q_smem, k_smem, interpret: bool) -> jax.Array:  # f32[64, Bk] = Q K^T
    if interpret:
        dims = (((1,), (1,)), ((), ()))
        return lax.dot_general(q_smem[...], k_smem[...], dims, preferred_element_type=jnp.float32)

    def product(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
        return acc_ref[...]  # awaits the wgmma: the K slot is free after this

    return pl.run_scoped(product, plgpu.ACC((ROWS, k_smem.shape[0]), jnp.float32))


def _values(
    probs: jax.Array,  # f32[64, Bk]
    v_smem,  # [Bk, D]
    interpret: bool,
) -> jax.Array:  # f32[64, D] = P V, P rounded to V's dtype
    probs = probs.astype(v_smem.dtype)
    if interpret:
        return jnp.dot(probs, v_smem[...], preferred_element_type=jnp.float32)

    def product(acc_ref):
        plgpu.wgmma(acc_ref, probs, v_smem)
        return acc_ref[...]  # awaits the wgmma: the V slot is free after this

    return pl.run_scoped(product, plgpu.ACC((ROWS, v_smem.shape[1]), jnp.float32))


def _check(q: jax.Array, block: int, tiles: Tiles) -> None:
    if not supports(q.shape[-1], q.dtype):
        raise ValueError(
            "the Mosaic GPU form runs bfloat16 with a head dim that is a multiple of 64 (wgmma "
            f"multiplies f32 only as TF32; 'pallas' runs f32 exactly), got {q.dtype}, head "
            f"dim {q.shape[-1]}"
        )
    if not supports(None, None, block) or tiles.block_k % 64 or tiles.block_k > 256:
        raise ValueError(
            f"the Mosaic GPU form needs a schedule block that is a multiple of {ROWS} and a key "
            f"tile that is a multiple of 64 up to 256, got block {block}, key tile "
            f"{tiles.block_k}"
        )


def _interpret_params():
    # JAX exports GPU interpret mode's parameters from no public module yet (0.10).
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams(detect_races=True, uninitialized_memory="nan")
