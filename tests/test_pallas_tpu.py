"""The TPU form of the Pallas kernel in Pallas' TPU interpret mode, at the TPU's tuned tiles:
equal to the reference on the attention and paging scenario tables, free of races with the
parallel grid axes split over two cores; and deliberate kernel bugs caught by these checks or by
the export to TPU and CUDA (`tests/test_export.py`)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic.interpret import interpret_pallas_call
from jax.experimental.pallas import tpu as pltpu

import score_kernels.pallas as pallas
from score_kernels import attention_reference, tuning
from score_kernels.pallas import attention_pallas
from tests.test_attention import SCENARIOS, TOLERANCE, layout_meta, random_qkv
from tests.test_export import lowered, shapes
from tests.test_paging import PAGES, groups_layout, paged_layout, run_whole
from tests.test_paging import SCENARIOS as PAGED_SCENARIOS
from tests.test_pallas import run_reference

BLOCK = 256  # at least every tuned TPU tile, so the tuned tiles are the ones used
SCALE = 6  # the attention scenarios' lengths times this: several query tiles and key steps
# Two cores: Mosaic's megacore splitting of the "parallel" axes, checked for races.
TPU = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)


def scaled_meta(name: str):
    """The attention scenario with its lengths (and window) times SCALE, in blocks of BLOCK."""
    groups, extra_pad, _, heads, kv_heads, head_dim, window_size = SCENARIOS[name]
    groups = [(prefix * SCALE, [n * SCALE for n in items]) for prefix, items in groups]
    meta = layout_meta(groups, BLOCK, extra_pad, window=window_size * SCALE)
    return meta, (heads, kv_heads, head_dim)


def run_tpu_interpret(q, k, v, meta, pool=None, softcap: float = 0.0) -> np.ndarray:
    interpret_pallas_call.reset_tpu_interpret_mode_state()
    out = attention_pallas(
        q, k, v, meta, scale=q.shape[-1] ** -0.5, softcap=softcap, pool=pool,
        interpret=TPU, platform="tpu",
    )  # fmt: skip
    out = np.asarray(out, np.float32)
    assert not interpret_pallas_call.races.races_found
    return out


def scenario_error(name: str, dtype) -> float:
    """Largest deviation of the TPU form from the reference on the scaled scenario."""
    meta, shape = scaled_meta(name)
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, dtype)
    want = np.asarray(run_reference(q, k, v, meta), np.float32)
    return float(np.abs(run_tpu_interpret(q, k, v, meta) - want).max())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_tpu_interpret_mode_matches_reference(scenario: str, dtype) -> None:
    assert scenario_error(scenario, dtype) <= TOLERANCE[dtype]


def test_the_tuned_tpu_tiles_are_the_ones_run(monkeypatch) -> None:
    seen = []
    run_tpu = pallas._run_tpu

    def spy(*args, tiles, **kwargs):
        seen.append(tiles)
        return run_tpu(*args, tiles=tiles, **kwargs)

    monkeypatch.setattr(pallas, "_run_tpu", spy)
    jax.clear_caches()
    for dtype, head_dim in [(jnp.bfloat16, 64), (jnp.float32, 128)]:
        meta, _ = scaled_meta("long_sequence")
        q, k, v = random_qkv(meta.prefix_start.shape[0], 4, 4, head_dim, dtype)
        run_tpu_interpret(q, k, v, meta)
        tuned = tuning.lookup(head_dim, dtype, "tpu")
        assert (seen[-1].block_q, seen[-1].block_k) == (tuned.block_q, tuned.block_k)
    jax.clear_caches()


def test_soft_capped_scores_in_tpu_interpret_mode() -> None:
    meta, shape = scaled_meta("window_mixed_groups")
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, jnp.float32, seed=3)
    got = run_tpu_interpret(q * 4, k, v, meta, softcap=3.0)
    want = attention_reference(q * 4, k, v, meta, scale=q.shape[-1] ** -0.5, softcap=3.0)
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 20], ids=["global", "window20"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(PAGED_SCENARIOS))
def test_paged_context_in_tpu_interpret_mode(scenario: str, dtype, window: int) -> None:
    groups, _, page, heads, kv_heads, head_dim = PAGED_SCENARIOS[scenario]
    whole_meta = layout_meta(groups_layout(groups), BLOCK, window=window)
    whole = random_qkv(whole_meta.prefix_start.shape[0], heads, kv_heads, head_dim, dtype)
    paged = paged_layout(groups, *whole, block=BLOCK, page=page, pages=PAGES, window=window)
    got = run_tpu_interpret(paged.q, paged.k, paged.v, paged.meta, paged.pool)
    want = np.asarray(run_whole(*whole, whole_meta), np.float32)
    real = paged.full_rows >= 0
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got[real], want[paged.full_rows[real]], atol=tol, rtol=tol)


def test_tpu_interpret_mode_runs_only_the_tpu_form() -> None:
    meta, shape = scaled_meta("plain")
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, jnp.float32)
    with pytest.raises(ValueError, match="TPU interpret mode"):
        attention_pallas(q, k, v, meta, scale=0.125, interpret=TPU, platform="gpu")


# --- Deliberate bugs -------------------------------------------------------------------------

# name -> (kernel function, its text, the buggy text)
MUTATIONS = {
    "own_span_drops_the_diagonal": ("_visible", "key < own_end", "key < own_end - 1"),
    "accumulator_not_rescaled": ("_fold_tile", "state.acc * rescale + pv", "state.acc + pv"),
    "scratch_never_initialised": ("_tpu_kernel", "@pl.when(step == 0)", "@pl.when(step < 0)"),
    "key_steps_split_over_cores": (
        "_run_tpu",
        "dimension_semantics=_TPU_SEMANTICS",
        'dimension_semantics=("parallel",) * 3',
    ),
    # Interpreted it is only more accurate, and Mosaic accepts it; Triton's dot does not.
    "probabilities_not_cast_for_pv": ("_fold_tile", "probs.astype(v.dtype)", "probs"),
}


@pytest.fixture
def mutate(monkeypatch):
    """Replace one kernel function by its source with one edit, recompiled in the module."""

    def apply(name: str) -> None:
        function, text, bug = MUTATIONS[name]
        source = inspect.getsource(getattr(pallas, function))
        assert source.count(text) == 1, f"{function} no longer contains {text!r}"
        namespace = dict(vars(pallas))
        exec(compile(source.replace(text, bug), pallas.__file__, "exec"), namespace)
        monkeypatch.setattr(pallas, function, namespace[function])
        jax.clear_caches()

    yield apply
    monkeypatch.undo()
    jax.clear_caches()


def checks_pass() -> bool:
    """Whether the kernel passes TPU interpret mode on two scenarios and exports for TPU and
    CUDA at the tuned tiles in f32 and bf16."""
    try:
        for scenario in ("mixed_gqa8", "window_mixed_groups"):
            if not scenario_error(scenario, jnp.float32) <= TOLERANCE[jnp.float32]:
                return False
        meta = layout_meta([(300, [20] * 10), (0, [150])], BLOCK)
        for platform in ("tpu", "gpu"):
            for dtype in (jnp.float32, jnp.bfloat16):
                lowered(platform, *shapes(meta.prefix_start.shape[0], 3, 64, dtype), meta)
    except ValueError:  # what lowering raises
        return False
    return True


def test_the_checks_pass_the_kernel_as_it_is() -> None:
    assert checks_pass()


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_deliberate_bug_is_caught(name: str, mutate) -> None:
    mutate(name)
    assert not checks_pass()
