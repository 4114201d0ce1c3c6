"""The Pallas attention kernel against the dense oracle: both kernel forms (TPU's and GPU's) in the
Pallas interpreter on CPU, compiled only where a GPU or TPU is present."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from engine.offline import load_model
from score_kernels import (
    ATTENTION,
    attention_reference,
    devices,
    make_meta,
    select_attention,
    tuning,
)
from score_kernels.pallas import attention_pallas, attention_pallas_auto, supports
from score_kernels.tuning import BlockSizes
from tests.test_attention import (
    PROPERTY_BLOCK,
    PROPERTY_T,
    SCENARIOS,
    TOLERANCE,
    layout_meta,
    layout_spans,
    packings,
    random_qkv,
    scenario_meta,
)

PLATFORMS = ["tpu", "gpu"]


def run_pallas(q, k, v, meta, *, platform, block_sizes=None, interpret=True):
    scale = q.shape[-1] ** -0.5
    return attention_pallas(
        q,
        k,
        v,
        meta,
        scale=scale,
        interpret=interpret,
        block_sizes=block_sizes,
        platform=platform,
    )


@jax.jit
def run_reference(q, k, v, meta):
    return attention_reference(q, k, v, meta, scale=q.shape[-1] ** -0.5)


def assert_matches_reference(q, k, v, meta, **kwargs) -> np.ndarray:
    got = run_pallas(q, k, v, meta, **kwargs)
    assert got.shape == q.shape
    assert got.dtype == q.dtype
    tol = TOLERANCE[q.dtype.type]
    got = np.asarray(got, np.float32)
    want = np.asarray(run_reference(q, k, v, meta), np.float32)
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    return got


def scenario_inputs(name: str, dtype, **meta_kwargs):
    meta, shape = scenario_meta(name, **meta_kwargs)
    return (*random_qkv(meta.prefix_start.shape[0], *shape, dtype), meta)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_reference(scenario: str, dtype, platform: str) -> None:
    assert_matches_reference(*scenario_inputs(scenario, dtype), platform=platform)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("block_q,block_k", [(8, 32), (32, 8), (16, 16)])
def test_tiles_smaller_than_the_schedule_block(block_q: int, block_k: int, platform: str) -> None:
    # B = 32: a query tile reads its block's schedule row, a key block is visited in pieces.
    q, k, v, meta = scenario_inputs("mixed_groups", jnp.float32)
    sizes = BlockSizes(block_q, block_k)
    assert_matches_reference(q, k, v, meta, platform=platform, block_sizes=sizes)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_schedule_padding_is_not_counted_twice(platform: str) -> None:
    # Width 2n: every row ends in repeats of its last key block, which must be skipped.
    groups, _, block, *_ = SCENARIOS["shared_prefix"]
    n = layout_meta(groups, block).block_kv.shape[0]
    q, k, v, meta = scenario_inputs("shared_prefix", jnp.float32, width_buckets=(2 * n,))
    assert meta.block_kv.shape[1] == 2 * n
    assert_matches_reference(q, k, v, meta, platform=platform)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_padding_rows_attend_only_to_themselves(platform: str) -> None:
    meta = layout_meta([(10, [3, 4])], 16, extra_pad=40)
    t = meta.prefix_start.shape[0]
    q, k, v = random_qkv(t, 6, 2, 64, jnp.float32, seed=2)
    out = np.asarray(run_pallas(q, k, v, meta, platform=platform))
    padding = np.arange(17, t)
    expected = np.repeat(np.asarray(v)[padding], 3, axis=1)  # query head h reads kv head h // 3
    np.testing.assert_allclose(out[padding], expected, atol=1e-6)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_rows_that_see_no_key_give_zeros_not_nan(platform: str) -> None:
    # A malformed schedule: query block 0 visits only key block 3, which its tokens cannot see
    # (causal), and query block 1 visits nothing.
    meta = layout_meta([(0, [64])], 16)
    block_kv = np.asarray(meta.block_kv).copy()  # i32[4, 4]
    block_kv[0] = 3
    meta = meta._replace(block_kv=block_kv, block_count=np.asarray([1, 0, 3, 4], np.int32))
    q, k, v = random_qkv(64, 4, 2, 64, jnp.float32, seed=6)
    out = np.asarray(run_pallas(q, k, v, meta, platform=platform))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:32], 0.0)
    want = np.asarray(run_reference(q, k, v, meta))
    np.testing.assert_allclose(out[32:], want[32:], atol=1e-5)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_soft_capped_scores_match_reference(platform: str) -> None:
    q, k, v, meta = scenario_inputs("window_in_prefix", jnp.float32)
    got = attention_pallas(
        q * 4, k, v, meta, scale=0.125, softcap=3.0, interpret=True, platform=platform
    )
    want = attention_reference(q * 4, k, v, meta, scale=0.125, softcap=3.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(groups=packings(), seed=st.integers(0, 2**16), platform=st.sampled_from(PLATFORMS))
def test_matches_reference_on_random_packings(groups, seed: int, platform: str) -> None:
    # Fixed T and width keep one compiled shape per platform across examples.
    used = sum(p + sum(items) for p, items in groups)
    spans = layout_spans(groups, PROPERTY_BLOCK, PROPERTY_T - used)
    n = PROPERTY_T // PROPERTY_BLOCK
    meta = make_meta(*spans, block_size=PROPERTY_BLOCK, width_buckets=(n,))
    q, k, v = random_qkv(PROPERTY_T, 6, 2, 64, jnp.float32, seed=seed)
    assert_matches_reference(q, k, v, meta, platform=platform)


def test_registered_kernel_is_interpreted_on_cpu() -> None:
    assert ATTENTION["pallas"] is attention_pallas_auto
    assert select_attention("pallas", "cpu") is attention_pallas_auto
    q, k, v, meta = scenario_inputs("shared_prefix", jnp.bfloat16)
    got = jax.jit(lambda *a: attention_pallas_auto(*a, scale=0.125))(q, k, v, meta)
    want = attention_reference(q, k, v, meta, scale=0.125)
    tol = TOLERANCE[jnp.bfloat16]
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
    )


def test_forced_in_the_model(tiny_checkpoints) -> None:
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7] * 70]
    pallas = load_model(tiny_checkpoints["qwen3"], dtype="float32", attention="pallas")
    xla = load_model(tiny_checkpoints["qwen3"], dtype="float32", attention="xla")
    assert pallas.program.attention is attention_pallas_auto
    np.testing.assert_allclose(
        pallas.row_outputs(seqs, [[1, 2]] * 3), xla.row_outputs(seqs, [[1, 2]] * 3), atol=1e-5
    )


def bad_inputs():
    q, k, v, meta = scenario_inputs("plain", jnp.float32)
    yield (q, k.astype(jnp.bfloat16), v, meta), {}, "must share float32 or bfloat16"
    yield (q[:, :3], k, v, meta), {}, "does not fit q shape"
    yield (q, k, v[:, :2], meta), {}, r"q must be \[T, H, D\]"
    yield (q, k, v, meta._replace(own_start=meta.own_start[:-16])), {}, "spans must be i32"
    yield (q, k, v, meta._replace(block_count=meta.block_count[:2])), {}, "schedule shapes"
    floats = meta._replace(block_kv=meta.block_kv.astype(np.float32))
    yield (q, k, v, floats), {}, "must be int32"
    yield (q, k, v, meta), {"block_sizes": BlockSizes(12, 16)}, "must divide the schedule block"
    yield (q, k, v, meta), {"platform": "cuda"}, "platform must be one of"


@pytest.mark.parametrize("args,kwargs,match", list(bad_inputs()))
def test_invalid_inputs_are_refused(args, kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        attention_pallas(*args, scale=1.0, interpret=True, **kwargs)


def test_lowering_limits_are_checked_before_lowering() -> None:
    meta = layout_meta([(0, [64])], 64)
    q, k, v = random_qkv(64, 2, 1, 80, jnp.float32)
    with pytest.raises(ValueError, match="Triton lowering needs head_dim and tiles"):
        attention_pallas(q, k, v, meta, scale=1.0, platform="gpu")
    q, k, v = random_qkv(64, 2, 1, 64, jnp.float32)
    with pytest.raises(ValueError, match="TPU tiles must be multiples of 8"):
        attention_pallas(q, k, v, meta, scale=1.0, platform="tpu", block_sizes=BlockSizes(4, 64))
    assert supports(64, jnp.bfloat16, "gpu") and supports(None, None, "tpu")
    assert not supports(80, jnp.float32, "gpu") and supports(80, jnp.float32, "tpu")
    assert not supports(64, jnp.float16, "tpu") and not supports(64, jnp.float32, "cpu")


def test_tuned_block_sizes() -> None:
    assert tuning.lookup(128, jnp.bfloat16, "gpu") == tuning.TUNED[(128, "bfloat16", "gpu")]
    assert tuning.lookup(96, jnp.float32, "tpu") == tuning.DEFAULT["tpu"]
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        tuning.lookup(64, jnp.float32, "cuda")
    for (head_dim, dtype, backend), sizes in tuning.TUNED.items():
        assert backend in tuning.BACKENDS and dtype in ("float32", "bfloat16")
        # Powers of two, so gcd with any schedule block divides it.
        assert all(n & (n - 1) == 0 for n in (head_dim, sizes.block_q, sizes.block_k))


def _on_device(platform: str):
    missing = devices.backend() != platform
    return pytest.param(platform, marks=pytest.mark.skipif(missing, reason=f"needs a {platform}"))


@pytest.mark.parametrize("platform", [_on_device(p) for p in PLATFORMS])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", ["shared_prefix", "one_token_items", "mixed_gqa8"])
def test_compiled_on_device(platform: str, scenario: str, dtype) -> None:
    q, k, v, meta = scenario_inputs(scenario, dtype)
    assert_matches_reference(q, k, v, meta, platform=platform, interpret=False)
