"""The Mosaic GPU attention form against the dense oracle: compiled where a Hopper or newer GPU
is present, and in Pallas' GPU interpret mode on any other host (simulated shared memory, TMA
copies and barriers, race detection on, uninitialised memory reading NaN). Its lowering for CUDA
is checked in tests/test_export.py."""

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from engine.device.program import DeviceProgram
from engine.errors import InvalidInput
from engine.loaders import load_checkpoint
from engine.offline import load_model
from score_kernels import ATTENTION, devices, make_meta, mosaic_gpu, select_attention, tuning
from score_kernels.mosaic_gpu import attention_mosaic_gpu, attention_mosaic_gpu_auto
from score_kernels.tuning import BlockSizes
from tests.conftest import write_tiny_checkpoint
from tests.test_attention import (
    PROPERTY_T,
    SCENARIOS,
    TOLERANCE,
    layout_meta,
    layout_spans,
    packings,
    random_qkv,
)
from tests.test_paging import SCENARIOS as PAGED
from tests.test_paging import groups_layout, paged_layout, run_whole
from tests.test_pallas import run_reference

BLOCK = 64  # the schedule block: the form's 64-row query tile must divide it
TOL = TOLERANCE[jnp.bfloat16]
# the attention scenario tables' layouts at this form's block; head dim 32 is not its shape
RUNS = sorted(name for name, spec in SCENARIOS.items() if spec[5] % 64 == 0)
COMPILED = devices.hopper_or_newer()  # each scenario compiled on the GPU, else interpreted


def scenario(name: str, seed: int = 0):
    groups, extra_pad, _, heads, kv_heads, head_dim, window = SCENARIOS[name]
    meta = layout_meta(
        groups, BLOCK, extra_pad, window=window, bidirectional=name.startswith("bidirectional")
    )
    q, k, v = random_qkv(meta.prefix_start.shape[0], heads, kv_heads, head_dim, jnp.bfloat16, seed)
    return q, k, v, meta


def run(q, k, v, meta, *, interpret=not COMPILED, **kwargs) -> np.ndarray:
    out = attention_mosaic_gpu(
        q, k, v, meta, scale=q.shape[-1] ** -0.5, interpret=interpret, **kwargs
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    return np.asarray(out, np.float32)


def assert_matches_reference(q, k, v, meta, **kwargs) -> np.ndarray:
    got = run(q, k, v, meta, **kwargs)
    want = np.asarray(run_reference(q, k, v, meta), np.float32)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
    return got


@pytest.mark.parametrize("name", RUNS)
def test_matches_reference(name: str) -> None:
    assert_matches_reference(*scenario(name))


@settings(max_examples=10, deadline=None)
@given(groups=packings(), seed=st.integers(0, 2**16))
def test_matches_reference_on_random_packings(groups, seed: int) -> None:
    # PROPERTY_T tokens and one schedule width: one compiled shape across examples
    used = sum(p + sum(items) for p, items in groups)
    spans = layout_spans(groups, BLOCK, PROPERTY_T - used)
    n = PROPERTY_T // BLOCK
    meta = make_meta(*spans, block_size=BLOCK, width_buckets=(n,))
    assert_matches_reference(*random_qkv(PROPERTY_T, 6, 2, 64, jnp.bfloat16, seed=seed), meta)


def test_wide_key_tiles_visit_whole_schedule_blocks() -> None:
    """A 128-token schedule block read as one 128-key tile and as two 64-key tiles."""
    groups, extra_pad, *_ = SCENARIOS["mixed_groups"]
    meta = layout_meta(groups, 128, extra_pad)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 6, 2, 128, jnp.bfloat16, seed=3)
    wide = assert_matches_reference(q, k, v, meta, block_sizes=BlockSizes(64, 128))
    narrow = assert_matches_reference(q, k, v, meta, block_sizes=BlockSizes(64, 64))
    # the same keys in the same order of tiles' sums: only the softmax's rescaling steps differ
    np.testing.assert_allclose(wide, narrow, atol=TOL, rtol=TOL)


def test_soft_capped_scores_match_reference() -> None:
    q, k, v, meta = scenario("window_in_prefix", seed=4)
    scale = q.shape[-1] ** -0.5
    got = run(q * 4, k, v, meta, softcap=3.0)
    want = ATTENTION["reference"](q * 4, k, v, meta, scale=scale, softcap=3.0)
    np.testing.assert_allclose(got, np.asarray(want, np.float32), atol=TOL, rtol=TOL)
    plain = np.asarray(run_reference(q * 4, k, v, meta), np.float32)
    assert np.abs(got - plain).max() > 0.1  # the cap bites


def test_padding_rows_attend_only_to_themselves() -> None:
    meta = layout_meta([(10, [3, 4])], BLOCK, extra_pad=100)
    t = meta.prefix_start.shape[0]
    q, k, v = random_qkv(t, 6, 2, 64, jnp.bfloat16, seed=2)
    out = run(q, k, v, meta)
    padding = np.arange(17, t)
    expected = np.repeat(np.asarray(v, np.float32)[padding], 3, axis=1)  # head h reads kv h // 3
    np.testing.assert_array_equal(out[padding], expected)


def test_rows_that_see_no_key_give_zeros_not_nan() -> None:
    q, k, v, meta = scenario("plain")
    empty = meta._replace(block_count=jnp.zeros_like(meta.block_count))
    assert np.array_equal(run(q, k, v, empty), np.zeros(q.shape, np.float32))


@pytest.mark.parametrize("name", ["partial_last_page", "gqa8_long_context", "mixed_groups"])
def test_paged_context_equals_one_batch(name: str) -> None:
    groups, _, page, heads, kv_heads, head_dim = PAGED[name]
    whole_meta = layout_meta(groups_layout(groups), BLOCK)
    whole = random_qkv(whole_meta.prefix_start.shape[0], heads, kv_heads, head_dim, jnp.bfloat16)
    paged = paged_layout(groups, *whole, block=BLOCK, page=page, pages=64)
    assert paged.meta.context_pages.shape[0] > 0
    got = run(paged.q, paged.k, paged.v, paged.meta, pool=paged.pool)
    want = np.asarray(run_whole(*whole, whole_meta), np.float32)
    real = paged.full_rows >= 0
    np.testing.assert_allclose(got[real], want[paged.full_rows[real]], atol=TOL, rtol=TOL)


def test_forced_in_the_model(tmp_path) -> None:
    """A Qwen3 of head dim 64 in bfloat16: the engine's packed batch through this form equals
    the same program with XLA's attention."""
    path = write_tiny_checkpoint(tmp_path, "qwen3", head_dim=64)
    seqs, labels = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7] * 70], [[1, 2]] * 3
    mosaic = load_model(path, dtype="bfloat16", attention="mosaic", dense="xla")
    xla = load_model(path, dtype="bfloat16", attention="xla", dense="xla")
    assert mosaic.program.attention is attention_mosaic_gpu_auto
    got, want = mosaic.row_outputs(seqs, labels), xla.row_outputs(seqs, labels)
    np.testing.assert_allclose(got, want, atol=0.02)


def test_a_program_whose_blocks_it_cannot_tile_is_refused(tmp_path) -> None:
    path = write_tiny_checkpoint(tmp_path, "qwen3", head_dim=64)
    with pytest.raises(InvalidInput, match="multiple of 64, not 32") as raised:
        DeviceProgram(load_checkpoint(path), attention="mosaic", dense="xla", block_size=32)
    assert raised.value.field == "attention"


def bad_inputs():
    q, k, v, meta = scenario("plain")
    yield (q.astype(jnp.float32), *(x.astype(jnp.float32) for x in (k, v)), meta), {}, "TF32"
    small = random_qkv(q.shape[0], 4, 4, 32, jnp.bfloat16)
    yield (*small, meta), {}, "head dim that is a multiple of 64"
    blocks_of_32 = layout_meta([(0, [40])], 32)
    yield (*random_qkv(64, 4, 4, 64, jnp.bfloat16), blocks_of_32), {}, "multiple of 64 and a key"
    yield (q, k, v, meta), {"block_sizes": BlockSizes(64, 32)}, "key tile that is a multiple"
    yield (q, k[:, :3], v[:, :3], meta), {}, "does not fit q shape"


@pytest.mark.parametrize("args,kwargs,match", list(bad_inputs()))
def test_inputs_it_cannot_run_are_refused(args, kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        attention_mosaic_gpu(*args, scale=1.0, interpret=True, **kwargs)


def test_selected_by_name_and_by_default_on_hopper(monkeypatch) -> None:
    assert ATTENTION["mosaic"] is attention_mosaic_gpu_auto
    bf16 = {"head_dim": 128, "dtype": jnp.bfloat16}
    assert select_attention("mosaic", "gpu", **bf16) is attention_mosaic_gpu_auto
    with pytest.raises(ValueError, match="attention 'mosaic' runs bfloat16"):
        select_attention("mosaic", "gpu", head_dim=128, dtype=jnp.float32)
    with pytest.raises(ValueError, match="head dim 96"):
        select_attention("mosaic", "gpu", head_dim=96, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="multiple of 64, not 32"):
        select_attention("mosaic", "gpu", block_size=32, **bf16)
    monkeypatch.setattr(mosaic_gpu, "interpreted", lambda: True)
    assert select_attention("mosaic", "cpu", **bf16) is attention_mosaic_gpu_auto
    with pytest.raises(ValueError, match="serves one device at a time"):
        select_attention("mosaic", "cpu", sharded=True, **bf16)
    monkeypatch.setattr(devices, "hopper_or_newer", lambda: False)
    assert select_attention(None, "gpu", **bf16) is ATTENTION["pallas"]
    monkeypatch.setattr(devices, "hopper_or_newer", lambda: True)
    assert select_attention(None, "gpu", block_size=64, **bf16) is attention_mosaic_gpu_auto
    # f32 (wgmma is TF32 there) and a block the 64-row tile does not divide stay on Triton
    assert select_attention(None, "gpu", head_dim=128, dtype=jnp.float32) is ATTENTION["pallas"]
    assert select_attention(None, "gpu", block_size=32, **bf16) is ATTENTION["pallas"]
    assert mosaic_gpu.supports(None, None) and not mosaic_gpu.supports(64, jnp.float32)
    assert mosaic_gpu.supports(64, jnp.bfloat16, 128) and not mosaic_gpu.supports(64, None, 96)
    assert tuning.lookup(64, jnp.bfloat16, "mosaic_gpu").block_q == mosaic_gpu.ROWS
