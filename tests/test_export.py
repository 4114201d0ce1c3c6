"""The Pallas kernel and the whole scoring program lowered for TPU (Mosaic), GPU (Triton) and
Hopper GPUs (Mosaic GPU, bf16 only) on a machine that has none: `jax.export` of the compiled
form, at the tiles `score_kernels.tuning` gives each platform, for head dims 64/128, f32/bf16 and
GQA groups 1/3/8, with paged context, sliding windows and soft-capped scores. A lowering error on
any platform fails here."""

import math
import re
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax import export

from engine.device.export import KERNEL_CALLS, KERNELS, TARGETS, export_program
from engine.device.program import DeviceProgram
from engine.loaders import load_checkpoint
from engine.models.rows import HEAD_ROWS
from score_kernels import ATTENTION, tuning
from tests.conftest import write_tiny_checkpoint
from tests.test_attention import layout_meta, random_qkv
from tests.test_paging import Group, groups_layout, paged_layout

# our platform name -> jax.export's, and the custom call that carries the compiled kernel
PLATFORMS = {p: (TARGETS[p], KERNEL_CALLS[p]) for p in TARGETS}
TRITON = export.DisabledSafetyCheck.custom_call(KERNEL_CALLS["gpu"])
BLOCK = 256  # the schedule block: at least every tuned tile, so the tuned tiles are the ones used
HEADS = {1: (4, 4), 3: (6, 2), 8: (8, 1)}  # GQA group -> (heads, kv heads)
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
# the dtypes each platform's kernel compiles (wgmma has no exact f32 product)
RUNS = {"tpu": ("f32", "bf16"), "gpu": ("f32", "bf16"), "mosaic_gpu": ("bf16",)}
CASES = [(p, d) for p in sorted(PLATFORMS) for d in RUNS[p]]


def lowered(platform: str, q, k, v, meta, pool=None, **kwargs) -> str:
    """The kernel exported for `platform`, as MLIR text."""
    target, _ = PLATFORMS[platform]
    scale = q.shape[-1] ** -0.5
    run = partial(KERNELS[platform], scale=scale, **kwargs)
    f = jax.jit(lambda q, k, v, meta, pool: run(q, k, v, meta, pool=pool))
    checks = [TRITON] if platform == "gpu" else []
    exported = export.export(f, platforms=[target], disabled_checks=checks)(q, k, v, meta, pool)
    assert exported.platforms == (target,)
    assert exported.out_avals[0].shape == q.shape and exported.out_avals[0].dtype == q.dtype
    return exported.mlir_module()


def shapes(tokens: int, group: int, head_dim: int, dtype):
    heads, kv_heads = HEADS[group]
    q = jax.ShapeDtypeStruct((tokens, heads, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((tokens, kv_heads, head_dim), dtype)
    return q, kv, kv


@pytest.mark.parametrize("group", sorted(HEADS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("platform,dtype", CASES)
def test_the_kernel_lowers_at_the_tuned_tiles(platform, dtype, head_dim, group):
    dtype = DTYPES[dtype]
    tiles = tuning.lookup(head_dim, dtype, platform)
    assert math.gcd(tiles.block_q, BLOCK) == tiles.block_q
    assert math.gcd(tiles.block_k, BLOCK) == tiles.block_k
    meta = layout_meta([(300, [20] * 10), (0, [150]), (0, [1])], BLOCK)
    text = lowered(platform, *shapes(meta.prefix_start.shape[0], group, head_dim, dtype), meta)
    assert text.count(PLATFORMS[platform][1]) == 1  # one kernel launch, compiled for the target


@pytest.mark.parametrize("window", [0, 20], ids=["global", "window20"])
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_paged_context_lowers(platform, window):
    """Keys gathered from scattered pool pages, then the kernel: both in the exported program."""
    groups = [Group(96, 130, [11, 6]), Group(24, 24, [17]), Group(0, 0, [40])]
    whole_meta = layout_meta(groups_layout(groups), BLOCK, window=window)
    whole = random_qkv(whole_meta.prefix_start.shape[0], 6, 2, 64, jnp.bfloat16)
    paged = paged_layout(groups, *whole, block=BLOCK, page=16, pages=64, window=window)
    assert paged.meta.context_pages.shape[0] > 0
    text = lowered(platform, paged.q, paged.k, paged.v, paged.meta, paged.pool)
    assert text.count(PLATFORMS[platform][1]) == 1


def kernel_call(text: str, marker: str) -> str:
    """The exported program's kernel launch: the custom call's line, its location dropped."""
    (line,) = [x for x in text.splitlines() if marker in x and "custom_call" in x]
    return re.sub(r"loc\(#loc\d+\)", "", line)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_soft_capped_scores_lower(platform):
    """Gemma 2's soft-capping and a sliding window: a kernel of its own (the cap in its body)."""
    meta = layout_meta([(40, [7] * 10), (0, [30])], BLOCK, window=16)
    args = shapes(meta.prefix_start.shape[0], 3, 128, jnp.bfloat16)
    marker = PLATFORMS[platform][1]
    capped = kernel_call(lowered(platform, *args, meta, softcap=50.0), marker)
    assert capped != kernel_call(lowered(platform, *args, meta), marker)


FAMILIES = ["qwen3", "gemma2", "gemma3"]


@pytest.fixture(scope="module")
def head_dim_64(tmp_path_factory):
    """The families at head dim 64, the smallest the Mosaic GPU form runs."""
    root = tmp_path_factory.mktemp("head-dim-64")
    return {name: write_tiny_checkpoint(root, name, head_dim=64) for name in FAMILIES}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("platform,dtype", CASES)
def test_the_scoring_program_lowers(platform, dtype, name, tiny_checkpoints, head_dim_64):
    """The whole forward (q/k norms; Gemma's windows, soft-capping, sandwich norms, local RoPE)
    with a context region read from the pool and the batch's K/V written back, and two steps of
    score rows (`engine.models.rows`: a loop whose trip count the batch gives)."""
    dtype = jnp.dtype(DTYPES[dtype]).name
    checkpoints = head_dim_64 if platform == "mosaic_gpu" else tiny_checkpoints
    checkpoint = load_checkpoint(checkpoints[name], progress=False)
    program = DeviceProgram(
        checkpoint, dtype=dtype, attention="xla", dense="xla", kv_cache_bytes=2**20
    )
    rows = 2 * HEAD_ROWS
    exported = export_program(program, platform, (2 * rows, rows, 4), 64, context=128)
    logprobs, pool = exported.out_avals[0], exported.out_avals[1:]
    assert (logprobs.shape, logprobs.dtype) == ((rows, 4), jnp.float32)
    assert [(x.shape, x.dtype) for x in pool] == [(x.shape, x.dtype) for x in program.kv.arrays]
    text = exported.mlir_module()
    assert text.count("stablehlo.while") == 2  # the layers' scan, the score rows' steps
    assert KERNEL_CALLS[platform] in text
    others = {call for p, call in KERNEL_CALLS.items() if p != platform}
    assert not any(call in text for call in others)
    # f32 is exact on every backend: no dot left to the device's default (TF32 on a GPU, bf16
    # passes on a TPU); bf16 keeps the default
    precisions = xla_dot_precisions(text)
    assert len(precisions) >= 4  # the layer scan's projections and MLP, the head
    assert set(precisions) == ({"HIGHEST"} if dtype == "float32" else {"DEFAULT"})
    if platform == "gpu":
        assert set(triton_dot_precisions(text)) == ({"ieee"} if dtype == "float32" else {"tf32"})


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_the_gpu_kernel_multiplies_f32_in_full_precision(dtype):
    """Triton multiplies f32 operands in TF32 unless told otherwise (1e-3 off the reference on
    an H100); the kernel asks for IEEE f32. bf16 operands keep the fast path."""
    meta = layout_meta([(300, [20] * 10), (0, [150]), (0, [1])], BLOCK)
    text = lowered("gpu", *shapes(meta.prefix_start.shape[0], 3, 128, dtype), meta)
    expected = "ieee" if dtype == jnp.float32 else "tf32"  # tf32 is how bf16 is passed: exact
    assert triton_dot_precisions(text) == [expected, expected]  # scores, then probs @ V


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_the_xla_kernel_multiplies_f32_in_full_precision(dtype):
    """The XLA attention asks for full f32 itself, so it is exact on a GPU outside the engine's
    program too (on an H100 its paged f32 scores were 1e-3 off the reference in TF32)."""
    groups = [Group(32, 48, [9, 4]), Group(0, 0, [20])]
    whole_meta = layout_meta(groups_layout(groups), 16)
    whole = random_qkv(whole_meta.prefix_start.shape[0], 6, 2, 64, dtype)
    paged = paged_layout(groups, *whole, block=16, page=8, pages=32)
    run = partial(ATTENTION["xla"], scale=0.125)
    f = jax.jit(lambda q, k, v, meta, pool: run(q, k, v, meta, pool=pool))
    exported = export.export(f, platforms=["cuda"])(
        paged.q, paged.k, paged.v, paged.meta, paged.pool
    )
    precisions = xla_dot_precisions(exported.mlir_module())
    assert len(precisions) == 2  # scores, then probs @ V
    assert set(precisions) == ({"HIGHEST"} if dtype == jnp.float32 else {"DEFAULT"})


def xla_dot_precisions(text: str) -> list[str]:
    """The precision of each XLA dot in an exported program (DEFAULT where none is named)."""
    dots = [x for x in text.splitlines() if "stablehlo.dot_general" in x]
    named = [re.search(r"precision = \[(\w+), (\w+)\]", x) for x in dots]
    return [m[1] if m and m[1] == m[2] else "DEFAULT" if not m else "mixed" for m in named]


def triton_dot_precisions(text: str) -> list[str]:
    """The input precision of each `tt.dot` in the Triton kernels of an exported program (the
    kernel travels as MLIR bytecode in its custom call; IEEE, Triton's default, is not named)."""
    from jax._src.interpreters import mlir
    from jax._src.lib import triton
    from jax._src.lib.mlir import ir

    out = []
    for kernel in _triton_kernels(text):
        with mlir.make_ir_context() as context:
            triton.dialect.register_dialect(context)
            body = str(ir.Module.parse(kernel))
        for line in body.splitlines():
            if "tt.dot " in line:
                named = re.search(r"inputPrecision = (\w+)", line)
                out.append(named[1] if named else "ieee")
    return out


def _triton_kernels(text: str) -> list[bytes]:
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    kernels = []
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        for op in _walk(module.operation):
            call = op.operation.name == "stablehlo.custom_call"
            target = op.attributes["call_target_name"] if call else ""
            if "triton" in str(target):
                config = ir.DictAttr(op.attributes["mhlo.backend_config"])
                kernels.append(ir.StringAttr(config["ir"]).value_bytes)
    return kernels


def _walk(op):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _walk(inner)


def test_export_refuses_what_cannot_lower(tiny_checkpoints):
    checkpoint = load_checkpoint(tiny_checkpoints["qwen3"], progress=False)
    no_pool = DeviceProgram(checkpoint, dtype="float32", attention="xla", dense="xla")
    with pytest.raises(ValueError, match="needs a KV pool"):
        export_program(no_pool, "tpu", (256, 16, 4), 64, context=128)
    with pytest.raises(ValueError, match="platform must be one of"):
        export_program(no_pool, "rocm", (256, 16, 4), 64)
    pooled = DeviceProgram(
        checkpoint, dtype="float32", attention="xla", dense="xla", kv_cache_bytes=2**20
    )
    with pytest.raises(ValueError, match="not whole blocks"):
        export_program(pooled, "gpu", (256, 16, 4), 64, context=40)


def test_the_mosaic_form_refuses_f32(head_dim_64):
    """wgmma multiplies f32 only as TF32: an f32 program is not lowered inexact."""
    checkpoint = load_checkpoint(head_dim_64["qwen3"], progress=False)
    program = DeviceProgram(checkpoint, dtype="float32", attention="xla", dense="xla")
    with pytest.raises(ValueError, match="wgmma multiplies f32 only as TF32"):
        export_program(program, "mosaic_gpu", (256, 16, 4), 64)
    q, kv, _ = shapes(256, 3, 64, jnp.float32)
    with pytest.raises(ValueError, match="bfloat16"):
        lowered("mosaic_gpu", q, kv, kv, layout_meta([(0, [200])], BLOCK))
