"""Calibrated roundings kept between starts (`engine.rounding_cache`): a second start of the
same checkpoint reads them (GPTQ's, or smoothed ones with their divisors) instead of calibrating
and scores exactly as the first; a missing entry calibrates again and fills it in; another
checkpoint or method has a directory of its own."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import engine.engine
from engine import load_model
from engine.loaders import load_checkpoint
from engine.rounding_cache import FOLDER, RoundingCache, RoundingMiss, fingerprint
from score_kernels import quant
from score_kernels.calibration import Hessians, digest, recording


def recorded(rng, w, alpha: float = 0.0) -> Hessians:
    """Hessians with sums for every layer of the stack w (smoothing by `alpha`)."""
    hessians = Hessians(alpha=alpha)
    strategy = recording(hessians)
    prepared = strategy.prepare(w, jnp.float32)
    for layer in range(len(w)):
        strategy.matmul(rng.standard_normal((64, w.shape[1])).astype(np.float32), prepared, layer)
    jax.effects_barrier()  # every recording landed
    return hessians


@pytest.mark.parametrize("alpha", [0.0, 0.5], ids=["gptq", "smoothed"])
def test_a_rounding_is_written_once_and_read_back(tmp_path, alpha):
    rng = np.random.default_rng(0)
    w, unseen = (rng.standard_normal((2, 128, 32)).astype(np.float32) for _ in range(2))
    hessians = recorded(rng, w, alpha)
    cache = RoundingCache(tmp_path / "model")
    assert cache.empty()
    with pytest.raises(RoundingMiss):
        cache.rounded(w)
    first = cache.calibrated(hessians).rounded(w)
    assert cache.calibrated(hessians).rounded(unseen) is unseen  # no sums: nearest rounding
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == sorted(
        [f"{digest(w)}.npz", f"{digest(unseen)}.none"]
    )
    again = RoundingCache(tmp_path / "model")  # a later start: no Hessians
    read = again.rounded(w)
    assert isinstance(read, quant.Rounded) and not again.empty()
    np.testing.assert_array_equal(read.q, first.q)
    np.testing.assert_array_equal(read.scale, first.scale)
    assert read.q.dtype == np.int8 and read.scale.dtype == np.float32
    if alpha:
        assert read.smooth.shape == (2, 128) and read.smooth.dtype == np.float32
        np.testing.assert_array_equal(read.smooth, first.smooth)
    else:
        assert read.smooth is None and first.smooth is None
    assert again.rounded(unseen) is unseen


@pytest.fixture()
def calibrations(monkeypatch) -> list:
    """The engine's calibration passes, counted."""
    passes = []
    calibrate = engine.engine._calibrated

    async def counted(config, checkpoint):
        passes.append(config.model)
        return await calibrate(config, checkpoint)

    monkeypatch.setattr(engine.engine, "_calibrated", counted)
    return passes


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch) -> str:
    """A compile cache directory of the test's own for the roundings; JAX's compile cache,
    the process's, is left where it is."""
    monkeypatch.setattr(engine.engine, "enable_compile_cache", lambda directory: None)
    return str(tmp_path)


@pytest.mark.parametrize("method", [("gptq", 0.0), ("nearest", 0.5)], ids=["gptq", "smoothed"])
def test_a_restart_reads_the_roundings_instead_of_calibrating(
    tiny_checkpoints, cache_dir, calibrations, method
):
    path = str(tiny_checkpoints["llama-untied"])
    rng = np.random.default_rng(5)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (5, 20, 60)]
    rounding, alpha = method
    options = dict(
        dtype="int8",
        int8_rounding=rounding,
        int8_smoothing=alpha,
        progress=False,
        compile_cache_dir=cache_dir,
    )

    def scores():
        return load_model(path, **options).score(query, items, [1, 2, 3])

    first = scores()
    assert calibrations == [path]
    checkpoint = load_checkpoint(path, progress=False)
    directory = Path(cache_dir) / FOLDER / fingerprint(checkpoint, method)
    entries = sorted(directory.glob("*.npz"))
    assert len(entries) >= 4  # q/k/v, o, the gated pair's two, down: each a stack
    with np.load(entries[0]) as entry:
        assert ("smooth" in entry) == bool(alpha)
    assert scores() == first
    assert calibrations == [path]  # read, not calibrated
    entries[0].unlink()  # a start that died before writing it
    assert scores() == first
    assert calibrations == [path, path] and entries[0].exists()
    nearest = load_model(path, dtype="int8", progress=False, compile_cache_dir=cache_dir)
    assert nearest.score(query, items, [1, 2, 3]) != first


def test_each_checkpoint_has_its_own_roundings(tiny_checkpoints):
    prints = {
        fingerprint(load_checkpoint(str(tiny_checkpoints[n]), progress=False))
        for n in ("llama-untied", "qwen2")
    }
    assert len(prints) == 2
    same = load_checkpoint(str(tiny_checkpoints["qwen2"]), progress=False)
    assert fingerprint(same) in prints
    assert fingerprint(same, ("nearest", 0.5)) not in prints  # another method: its own


def test_without_a_compile_cache_nothing_is_kept(tiny_checkpoints, calibrations):
    path = str(tiny_checkpoints["llama-untied"])
    options = dict(dtype="int8", int8_rounding="gptq", progress=False, compile_cache_dir=None)
    for _ in range(2):
        load_model(path, **options).score([5, 6, 7], [[8, 9]], [1, 2])
    assert calibrations == [path, path]
