"""Packed two-span attention as a Pallas kernel: TPU through Mosaic, GPU through Triton.

It consumes the metadata `attention_xla` consumes (per-token spans, the host-built block
schedule). Both lowerings share the per-tile math (`_visible`, `_fold_tile`, `_finish`: the span
mask, an online softmax with f32 statistics, the final normalisation) and differ in how key tiles
reach it:

- TPU (`_tpu_kernel`): grid (kv head, query tile, key step). The schedule is scalar-prefetched
  into SMEM and chooses each step's K/V tile in the BlockSpec index map, so Mosaic's pipeline
  fetches only scheduled tiles. Steps past `block_count` keep the last tile index (no new copy)
  and skip the compute. The softmax state lives in VMEM scratch along the step axis. The G query
  heads of a kv head are folded into the tile's rows, so one K/V tile feeds G * block_q MXU rows
  and K/V are read once per kv head.
- GPU (`_gpu_kernel`, the Triton form): Triton has no scalar prefetch and no scratch carried
  across grid steps, so the grid is (query head, query tile) and the body loops over the
  scheduled key tiles, loading each from the kv head `h // G` of the unrepeated K/V.

Hopper and newer GPUs also have the Mosaic GPU form (`score_kernels.mosaic_gpu`, bfloat16), built on
the tiles, schedule walk and checks shared from here (`Tiles`, `key_tile`, `check_inputs`).

`interpret=True` runs either form with the Pallas interpreter, which is how the CPU tests run it.
`interpret=pltpu.InterpretParams(...)` runs the TPU form in Pallas' TPU interpret mode instead: it
models TPU memory spaces, DMAs and megacore splitting of "parallel" grid axes (uninitialised
scratch reads NaN; `detect_races=True` checks the pipeline's copies), at the TPU's tuned tiles.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from score_kernels import devices, tuning
from score_kernels.metadata import AttentionMeta, context_length
from score_kernels.paging import LayerPool, with_context
from score_kernels.precision import dot_precision
from score_kernels.softcap import soft_cap
from score_kernels.tuning import BlockSizes

PLATFORMS = ("tpu", "gpu")
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

# Finite, so a row with no visible key so far keeps a finite max and rescales by exp(0) instead
# of computing inf - inf = NaN; its masked probabilities are zeroed explicitly.
MASKED = -1e30


class Tiles(NamedTuple):
    """Static tiling of one call: tiles, and how they divide the schedule's blocks of B."""

    block_q: int
    block_k: int
    q_split: int  # query tiles per schedule block: B // block_q
    k_split: int  # key tiles per scheduled key block: B // block_k
    width: int  # schedule entries per query block (K)


class _Softmax(NamedTuple):
    """Online-softmax state of R query rows."""

    running_max: jax.Array  # f32[R, 1]
    total: jax.Array  # f32[R, 1]
    acc: jax.Array  # f32[R, D]


@functools.partial(
    jax.jit, static_argnames=("scale", "softcap", "interpret", "block_sizes", "platform")
)
def attention_pallas(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
    interpret: bool | pltpu.InterpretParams = False,
    block_sizes: BlockSizes | None = None,
    platform: str | None = None,
) -> jax.Array:  # [T, H, D] in q's dtype
    """Attention over the prefix span and own span, visiting only scheduled key blocks.

    Query head h reads kv head `h // (H // Hkv)`; q, k and v share a dtype (float32 or bfloat16);
    scores and softmax statistics are f32; `softcap` > 0 soft-caps the scaled scores (Gemma 2).
    `platform` ("tpu" or "gpu") picks the kernel form,
    None the default backend's (the GPU form when that is the CPU). `interpret=True` runs it with
    the Pallas interpreter (required on CPU) at the largest tiles; `pltpu.InterpretParams` runs
    the TPU form in TPU interpret mode at the TPU's tiles. `block_sizes` overrides the tuned
    tiles; each tile must divide the schedule block B (larger tiles are clamped to B). Raises
    ValueError on malformed inputs. The context region's keys are gathered from `pool`'s pages
    first (`score_kernels.paging`).
    """
    k, v = with_context(k, v, meta, pool)
    platform = platform or _default_platform()
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    if isinstance(interpret, pltpu.InterpretParams) and platform != "tpu":
        raise ValueError(f"TPU interpret mode runs the TPU form, not platform {platform!r}")
    check_inputs(q, k, v, meta)
    # The plain interpreter's cost is per step, so it takes the "cpu" entry: the largest tiles.
    sizes = block_sizes or tuning.lookup(
        q.shape[-1], q.dtype, "cpu" if interpret is True else platform
    )
    tiles = tiles_of(sizes, meta.block_kv.shape, meta.block_size, tuned=block_sizes is None)
    _check_lowering(q.shape[-1], tiles, platform, interpret)
    if platform == "tpu":
        return _run_tpu(
            q, k, v, meta, scale=scale, softcap=softcap, tiles=tiles, interpret=interpret
        )
    return _run_gpu(
        q, k, v, meta, scale=scale, softcap=softcap, tiles=tiles, interpret=interpret, sizes=sizes
    )


def attention_pallas_auto(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
) -> jax.Array:  # [T, H, D] in q's dtype
    """`attention_pallas` for the default backend: compiled on TPU and GPU, interpreted elsewhere
    (the CPU has no Pallas lowering; the interpreter is slow and meant for debugging)."""
    interpret = devices.backend() not in PLATFORMS
    return attention_pallas(
        q, k, v, meta, scale=scale, softcap=softcap, interpret=interpret, pool=pool
    )


def supports(head_dim: int | None, dtype, backend: str) -> bool:
    """Whether the compiled kernel handles this head dim and dtype on `backend` (None: unknown,
    assumed supported). Triton loads need power-of-two shapes of at least 16."""
    if backend not in PLATFORMS:
        return False
    if dtype is not None and jnp.dtype(dtype) not in DTYPES:
        return False
    return head_dim is None or backend == "tpu" or _triton_size(head_dim)


# --- Shared per-tile math -------------------------------------------------------------------


def _visible(
    spans: tuple[jax.Array, ...],  # 4 x i32[R, 1]: prefix_start, prefix_end, own_start, own_end
    key_start: jax.Array,  # i32[]
    block_k: int,
) -> jax.Array:  # bool[R, block_k]: query row may see key column
    prefix_start, prefix_end, own_start, own_end = spans
    key = key_start + lax.broadcasted_iota(jnp.int32, (own_end.shape[0], block_k), 1)
    in_prefix = (key >= prefix_start) & (key < prefix_end)
    in_own = (key >= own_start) & (key < own_end)
    return in_prefix | in_own


def _empty_state(rows: int, head_dim: int) -> _Softmax:
    return _Softmax(
        jnp.full((rows, 1), MASKED, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, head_dim), jnp.float32),
    )


def _fold_tile(
    state: _Softmax,
    q: jax.Array,  # [R, D]
    k: jax.Array,  # [Bk, D]
    v: jax.Array,  # [Bk, D]
    visible: jax.Array,  # bool[R, Bk]
    scale: float,
    softcap: float = 0.0,
) -> _Softmax:
    """Fold one key tile into the online softmax of R query rows."""
    precision = dot_precision(q.dtype)
    scores = lax.dot_general(
        q, k, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )  # f32[R, Bk]
    scores = soft_cap(scores * scale, softcap)
    scores = jnp.where(visible, scores, MASKED)
    new_max = jnp.maximum(state.running_max, scores.max(axis=1, keepdims=True))
    # Zeroed where masked: a row with nothing visible yet must not count exp(0) per masked key.
    probs = jnp.where(visible, jnp.exp(scores - new_max), 0.0)
    rescale = jnp.exp(state.running_max - new_max)
    total = state.total * rescale + probs.sum(axis=1, keepdims=True)
    pv = jnp.dot(
        probs.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32
    )  # f32[R, D]
    return _Softmax(new_max, total, state.acc * rescale + pv)


def _finish(state: _Softmax) -> jax.Array:  # f32[R, D]
    # A row that saw no key (only possible with a malformed schedule) has total 0 and acc 0:
    # it yields 0, not NaN.
    return state.acc / jnp.maximum(state.total, jnp.finfo(jnp.float32).tiny)


def key_tile(
    block_kv_ref,  # i32[n * K], the schedule flattened row-major
    count_ref,  # i32[n]
    q_tile: jax.Array,  # i32[]
    step: jax.Array,  # i32[]
    tiles: Tiles,
) -> jax.Array:  # i32[]: index of the key tile visited at `step`
    """Steps past the schedule's count stay on its last tile (no new copy on TPU)."""
    row = _div(q_tile, tiles.q_split)
    last = count_ref[row] * tiles.k_split - 1
    step = jnp.maximum(jnp.minimum(step, last), 0)
    block = block_kv_ref[row * tiles.width + _div(step, tiles.k_split)]
    if tiles.k_split == 1:
        return block
    return block * tiles.k_split + lax.rem(step, tiles.k_split)


def _div(x: jax.Array, d: int) -> jax.Array:
    return x if d == 1 else lax.div(x, d)


# --- TPU: scalar-prefetched schedule, one key tile per grid step ----------------------------

# Heads and query tiles are independent (a megacore may split them); the key steps of one tile
# carry its softmax state in scratch, so they must run in order on one core.
_TPU_SEMANTICS = ("parallel", "parallel", "arbitrary")


def _tpu_kernel(
    block_kv_ref,  # SMEM i32[n * K]
    count_ref,  # SMEM i32[n]
    q_ref,  # [R, D], R = G * block_q: row g * block_q + b is head g of token b
    prefix_start_ref,  # i32[R, 1]
    prefix_end_ref,  # i32[R, 1]
    own_start_ref,  # i32[R, 1]
    own_end_ref,  # i32[R, 1]
    k_ref,  # [Bk, D]
    v_ref,  # [Bk, D]
    o_ref,  # [R, D]
    max_ref,  # VMEM f32[R, 1]
    total_ref,  # VMEM f32[R, 1]
    acc_ref,  # VMEM f32[R, D]
    *,
    scale: float,
    softcap: float = 0.0,
    tiles: Tiles,
):
    q_tile, step = pl.program_id(1), pl.program_id(2)
    state_refs = (max_ref, total_ref, acc_ref)

    @pl.when(step == 0)
    def _init():
        for ref, value in zip(state_refs, _empty_state(*acc_ref.shape), strict=True):
            ref[...] = value

    row = _div(q_tile, tiles.q_split)

    @pl.when(step < count_ref[row] * tiles.k_split)
    def _fold():
        key_start = key_tile(block_kv_ref, count_ref, q_tile, step, tiles) * tiles.block_k
        spans = tuple(ref[...] for ref in (prefix_start_ref, prefix_end_ref, own_start_ref))
        visible = _visible((*spans, own_end_ref[...]), key_start, tiles.block_k)
        state = _Softmax(*(ref[...] for ref in state_refs))
        state = _fold_tile(state, q_ref[...], k_ref[...], v_ref[...], visible, scale, softcap)
        for ref, value in zip(state_refs, state, strict=True):
            ref[...] = value

    @pl.when(step == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = _finish(_Softmax(*(ref[...] for ref in state_refs))).astype(o_ref.dtype)


def _run_tpu(
    q,
    k,
    v,
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float,
    tiles: Tiles,
    interpret: bool | pltpu.InterpretParams,
):
    t, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    group = num_heads // num_kv
    q_tiles = t // tiles.block_q
    rows = group * tiles.block_q
    row_spec = pl.BlockSpec((None, None, rows, head_dim), lambda h, i, s, *_: (h, i, 0, 0))
    span_spec = pl.BlockSpec((rows, 1), lambda h, i, s, *_: (i, 0))

    def kv_index(h, i, s, block_kv_ref, count_ref):
        return h, key_tile(block_kv_ref, count_ref, i, s, tiles), 0

    kv_spec = pl.BlockSpec((None, tiles.block_k, head_dim), kv_index)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(num_kv, q_tiles, tiles.width * tiles.k_split),
        in_specs=[row_spec, *[span_spec] * 4, kv_spec, kv_spec],
        out_specs=row_spec,
        scratch_shapes=[
            pltpu.VMEM((rows, 1), jnp.float32),
            pltpu.VMEM((rows, 1), jnp.float32),
            pltpu.VMEM((rows, head_dim), jnp.float32),
        ],
    )
    q_rows = _fold_heads(q, num_kv, tiles.block_q)  # [Hkv, T // block_q, R, D]
    out = pl.pallas_call(
        functools.partial(_tpu_kernel, scale=scale, softcap=softcap, tiles=tiles),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=_TPU_SEMANTICS),
        interpret=interpret,
    )(
        meta.block_kv.reshape(-1),
        meta.block_count,
        q_rows,
        *(_row_column(x, group, tiles.block_q) for x in span_columns(meta)),
        k.transpose(1, 0, 2),  # [Hkv, C + T, D]
        v.transpose(1, 0, 2),  # [Hkv, C + T, D]
    )
    return _unfold_heads(out, t)


def _fold_heads(
    q: jax.Array,  # [T, H, D]
    num_kv: int,
    block_q: int,
) -> jax.Array:  # [Hkv, T // block_q, G * block_q, D]
    t, num_heads, head_dim = q.shape
    group = num_heads // num_kv
    tiled = q.reshape(t // block_q, block_q, num_kv, group, head_dim).transpose(2, 0, 3, 1, 4)
    return tiled.reshape(num_kv, t // block_q, group * block_q, head_dim)


def _unfold_heads(
    out: jax.Array,  # [Hkv, T // block_q, G * block_q, D]
    t: int,
) -> jax.Array:  # [T, H, D]
    num_kv, q_tiles, rows, head_dim = out.shape
    block_q = t // q_tiles
    group = rows // block_q
    out = out.reshape(num_kv, q_tiles, group, block_q, head_dim).transpose(1, 3, 0, 2, 4)
    return out.reshape(t, num_kv * group, head_dim)


def _row_column(
    x: jax.Array,  # i32[T, 1]
    group: int,
    block_q: int,
) -> jax.Array:  # i32[T * G, 1]: the value of each folded row's token
    tiled = x.reshape(-1, 1, block_q)
    return jnp.broadcast_to(tiled, (tiled.shape[0], group, block_q)).reshape(-1, 1)


# --- GPU: one program per (query head, query tile), looping over scheduled key tiles ---------


def _gpu_kernel(
    block_kv_ref,  # i32[n * K]
    count_ref,  # i32[n]
    q_ref,  # [Bq, D]
    prefix_start_ref,  # i32[Bq, 1]
    prefix_end_ref,  # i32[Bq, 1]
    own_start_ref,  # i32[Bq, 1]
    own_end_ref,  # i32[Bq, 1]
    k_ref,  # [C + T, D], the whole kv head
    v_ref,  # [C + T, D]
    o_ref,  # [Bq, D]
    *,
    scale: float,
    softcap: float = 0.0,
    tiles: Tiles,
):
    q_tile = pl.program_id(1)
    refs = (prefix_start_ref, prefix_end_ref, own_start_ref, own_end_ref)
    spans = tuple(ref[...] for ref in refs)
    q = q_ref[...]

    def fold(step, state: _Softmax) -> _Softmax:
        key_start = key_tile(block_kv_ref, count_ref, q_tile, step, tiles) * tiles.block_k
        keys = pl.ds(pl.multiple_of(key_start, tiles.block_k), tiles.block_k)
        visible = _visible(spans, key_start, tiles.block_k)
        return _fold_tile(state, q, k_ref[keys, :], v_ref[keys, :], visible, scale, softcap)

    steps = count_ref[_div(q_tile, tiles.q_split)] * tiles.k_split
    state = lax.fori_loop(0, steps, fold, _empty_state(*q.shape))
    o_ref[...] = _finish(state).astype(o_ref.dtype)


def _run_gpu(
    q,
    k,
    v,
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float,
    tiles: Tiles,
    interpret: bool,
    sizes,
):
    t, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    q_spec = pl.BlockSpec((tiles.block_q, None, head_dim), lambda h, i: (i, h, 0))
    span_spec = pl.BlockSpec((tiles.block_q, 1), lambda h, i: (i, 0))
    kv_spec = pl.BlockSpec((k.shape[0], None, head_dim), lambda h, i: (0, lax.div(h, group), 0))
    return pl.pallas_call(
        functools.partial(_gpu_kernel, scale=scale, softcap=softcap, tiles=tiles),
        grid=(num_heads, t // tiles.block_q),
        in_specs=[pl.no_block_spec, pl.no_block_spec, q_spec, *[span_spec] * 4, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltriton.CompilerParams(
            num_warps=sizes.num_warps, num_stages=sizes.num_stages
        ),
        interpret=interpret,
    )(
        meta.block_kv.reshape(-1),
        meta.block_count,
        q,
        *span_columns(meta),
        k,
        v,
    )


def span_columns(meta: AttentionMeta) -> tuple[jax.Array, ...]:  # 4 x i32[T, 1]
    t = meta.prefix_start.shape[0]
    return tuple(
        jnp.asarray(x, jnp.int32).reshape(t, 1)
        for x in (meta.prefix_start, meta.prefix_end, meta.own_start, meta.own_end)
    )


# --- Validation -----------------------------------------------------------------------------


def _default_platform() -> str:
    return "tpu" if devices.backend() == "tpu" else "gpu"


def check_inputs(q, k, v, meta: AttentionMeta) -> None:
    if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape:
        raise ValueError(
            f"q must be [T, H, D] and k, v [C + T, Hkv, D], got {q.shape}, {k.shape}, {v.shape}"
        )
    t, num_heads, head_dim = q.shape
    if k.shape[0] < t or k.shape[2] != head_dim or num_heads % k.shape[1]:
        raise ValueError(f"k/v shape {k.shape} does not fit q shape {q.shape}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share float32 or bfloat16, got {q.dtype}/{k.dtype}")
    spans = (meta.prefix_start, meta.prefix_end, meta.own_start, meta.own_end)
    if any(x.shape != (t,) for x in spans):
        raise ValueError(f"spans must be i32[{t}], got {[x.shape for x in spans]}")
    n = meta.block_kv.shape[0] if meta.block_kv.ndim == 2 else 0
    if not n or t % n or meta.block_count.shape != (n,):
        raise ValueError(
            f"schedule shapes {meta.block_kv.shape}, {meta.block_count.shape} do not fit T={t}"
        )
    if context_length(q, k) % meta.block_size:
        raise ValueError(f"context {context_length(q, k)} is not a multiple of {meta.block_size}")
    if any(jnp.dtype(x.dtype) != jnp.int32 for x in (*spans, meta.block_kv, meta.block_count)):
        raise ValueError("attention metadata must be int32")


def tiles_of(
    sizes: BlockSizes, schedule_shape: tuple[int, int], block: int, *, tuned: bool
) -> Tiles:
    if tuned:
        # Tuned tiles are powers of two; gcd keeps them dividing any schedule block.
        block_q, block_k = math.gcd(sizes.block_q, block), math.gcd(sizes.block_k, block)
    else:
        block_q, block_k = min(sizes.block_q, block), min(sizes.block_k, block)
        if block_q <= 0 or block_k <= 0 or block % block_q or block % block_k:
            raise ValueError(
                f"block sizes {sizes.block_q}/{sizes.block_k} must divide the schedule "
                f"block {block}"
            )
    return Tiles(block_q, block_k, block // block_q, block // block_k, schedule_shape[1])


def _check_lowering(
    head_dim: int, tiles: Tiles, platform: str, interpret: bool | pltpu.InterpretParams
) -> None:
    if interpret is True:
        return
    if platform == "gpu" and not all(map(_triton_size, (head_dim, tiles.block_q, tiles.block_k))):
        raise ValueError(
            "the Triton lowering needs head_dim and tiles that are powers of two >= 16, got "
            f"head_dim {head_dim}, tiles {tiles.block_q}/{tiles.block_k}"
        )
    if platform == "tpu" and (tiles.block_q % 8 or tiles.block_k % 8):
        raise ValueError(f"TPU tiles must be multiples of 8, got {tiles.block_q}/{tiles.block_k}")


def _triton_size(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0
