"""The dense strategy chosen by measurement (score_kernels/dense_choice.py): the choice logic on
fake timings (so it is checked on every CPU), the cache, the accuracy check on real kernels, and
models on the measured strategy against the f32 model."""

import jax.numpy as jnp
import msgspec
import numpy as np
import pytest

from engine import load_model
from score_kernels import cpu, dense, dense_choice, dense_runs, onednn, select_dense
from score_kernels.dense_choice import Chooser, Timing, fastest

# the most a bf16 model's label log-probs may move from its f32 twin on these tiny checkpoints,
# whatever the strategy: every one measured 0.021-0.028 here (XLA, native, measured); twice that
BF16_BOUND = 0.05


def timing(*seconds: float, error: float = 0.0) -> Timing:
    per_count = dict(zip(("256", "2048"), seconds, strict=False))
    return Timing(seconds=per_count, gflops=1.0, error=error, eligible=error <= 1)


def test_the_fastest_eligible_candidate_wins():
    assert fastest({"xla": timing(1.0, 8.0), "cpu": timing(1.2, 6.0)}) == "cpu"
    assert fastest({"cpu": timing(1.0, 8.0), "xla": timing(0.5, 7.0)}) == "xla"
    assert fastest({"xla": timing(1.0, 8.0), "cpu": timing(0.5, 11.0)}) == "xla"  # the work, summed
    assert fastest({"cpu": timing(1.0, 8.0), "onednn": timing(0.5, 4.0)}) == "onednn"
    # far off the accuracy bound: never chosen, however fast
    assert fastest({"xla": timing(1.0, 8.0), "cpu": timing(0.1, 0.8, error=3.0)}) == "xla"
    # one not timed at the larger count (far slower at the smaller) cannot win on a partial sum
    assert fastest({"xla": timing(1.0, 8.0), "cpu": timing(2.5)}) == "xla"
    # none eligible: the one nearest its bound
    both_off = {"xla": timing(1.0, 8.0, error=4.0), "cpu": timing(0.5, 4.0, error=2.0)}
    assert fastest(both_off) == "cpu"


def test_within_the_margin_the_preferred_candidate_wins():
    within = 1 + dense_choice.MARGIN * 0.9
    beyond = 1 + dense_choice.MARGIN * 1.1
    assert dense_choice.PREFERENCE.index("cpu") < dense_choice.PREFERENCE.index("xla")
    assert dense_choice.PREFERENCE.index("xla") < dense_choice.PREFERENCE.index("onednn")
    assert dense_choice.PREFERENCE.index("int8") < dense_choice.PREFERENCE.index("int8-xla")
    for fast, slow in [("xla", "cpu"), ("onednn", "cpu"), ("onednn", "xla"), ("int8-xla", "int8")]:
        near = {fast: timing(1.0, 8.0), slow: timing(within, 8.0 * within)}
        assert fastest(near) == slow, near
        far = {fast: timing(1.0, 8.0), slow: timing(beyond, 8.0 * beyond)}
        assert fastest(far) == fast, far
    # the preferred one must itself be eligible and timed at every count
    off = {"onednn": timing(1.0, 8.0), "cpu": timing(1.0, 8.0, error=2.0)}
    assert fastest(off) == "onednn"
    assert fastest({"xla": timing(1.0, 8.0), "cpu": timing(1.0)}) == "xla"


class FakeMeasure:
    """Measurements by table: (kind, k, n) -> {name: Timing}; counts its calls."""

    def __init__(self, table: dict):
        self.table, self.calls = table, []

    def __call__(self, mode, kind, k, n, names):
        self.calls.append((mode, kind, k, n, tuple(names)))
        return {name: self.table[kind, k, n][name] for name in names}


@pytest.fixture
def two_candidates(monkeypatch):
    """XLA and the native kernel as the bf16 candidates, the latter for every even K and N a
    multiple of 16 (as on a CPU with AVX512-BF16), whatever this CPU has."""
    supports = lambda k, n, dtype=jnp.bfloat16: k % 2 == 0 and n % 16 == 0
    monkeypatch.setattr(cpu, "dense_supports", supports)
    monkeypatch.setattr(onednn, "supports", lambda k, n: False)


def test_a_chooser_measures_each_shape_once_and_caches_it(tmp_path, two_candidates):
    fake = FakeMeasure(
        {
            ("matmul", 64, 96): {"xla": timing(1, 8), "cpu": timing(2, 16)},
            ("gated", 64, 128): {"xla": timing(2, 16), "cpu": timing(1, 8)},
        }
    )
    chooser = Chooser("bfloat16", measure=fake)
    chooser.use(str(tmp_path))
    assert chooser.pick("matmul", 64, 96) == "xla"
    assert chooser.pick("gated", 64, 128) == "cpu"
    assert chooser.pick("matmul", 64, 96) == "xla"
    assert [c[1:4] for c in fake.calls] == [("matmul", 64, 96), ("gated", 64, 128)]
    # a shape only one strategy takes (N not a multiple of 16) is not measured
    assert chooser.pick("matmul", 64, 90) == "xla" and len(fake.calls) == 2
    # a later start reads the file and measures nothing
    later = FakeMeasure({})
    again = Chooser("bfloat16", measure=later)
    again.use(str(tmp_path))
    assert again.pick("gated", 64, 128) == "cpu" and again.pick("matmul", 64, 96) == "xla"
    assert later.calls == [] and again.seconds == 0
    [file] = (tmp_path / "dense-choice").iterdir()
    assert file.name.startswith("bfloat16-") and file.suffix == ".json"


def test_another_machine_or_a_broken_file_measures_again(tmp_path, two_candidates, monkeypatch):
    table = {("matmul", 64, 96): {"xla": timing(1, 8), "cpu": timing(2, 16)}}
    first = Chooser("bfloat16", measure=FakeMeasure(table))
    first.use(str(tmp_path))
    first.pick("matmul", 64, 96)
    [file] = (tmp_path / "dense-choice").iterdir()
    file.write_text("{not json")
    fake = FakeMeasure(table)
    broken = Chooser("bfloat16", measure=fake)
    broken.use(str(tmp_path))
    assert broken.pick("matmul", 64, 96) == "xla" and len(fake.calls) == 1
    assert msgspec.json.decode(file.read_bytes())["shapes"][0]["chosen"] == "xla"  # rewritten
    facts = {**dense_choice.machine(), "cpu": "Another CPU"}
    monkeypatch.setattr(dense_choice, "machine", lambda: facts)
    fake = FakeMeasure(table)
    other = Chooser("bfloat16", measure=fake)
    other.use(str(tmp_path))
    other.pick("matmul", 64, 96)
    assert len(fake.calls) == 1 and len(list((tmp_path / "dense-choice").iterdir())) == 2


@pytest.mark.parametrize("kind", dense_choice.FUSED_KINDS)
def test_a_fused_kind_is_its_own_only_where_a_strategy_fuses_it(two_candidates, kind):
    table = {
        ("matmul", 64, 96): {"xla": timing(1, 8), "cpu": timing(2, 16)},
        (kind, 64, 96): {"xla": timing(3, 24), "cpu": timing(1, 8)},
    }
    fake = FakeMeasure(table)
    assert Chooser("bfloat16", measure=fake).pick(kind, 64, 96) == "cpu"
    assert [call[1] for call in fake.calls] == [kind]
    fake = FakeMeasure(table)
    f32 = Chooser("float32", measure=fake)  # no fused form in f32: the product's choice
    assert f32.pick(kind, 64, 96) == f32.pick("matmul", 64, 96) == "xla"
    assert [call[1] for call in fake.calls] == ["matmul"]


def test_the_report_names_the_shapes_of_one_model(two_candidates):
    table = {
        ("matmul", 64, 96): {"xla": timing(1, 8), "cpu": timing(2, 16)},
        ("head", 64, 384): {"xla": timing(3, 24), "cpu": timing(1, 8)},
    }
    chooser = Chooser("bfloat16", measure=FakeMeasure(table))
    first, second = dense_choice.Picks(chooser), dense_choice.Picks(chooser)
    assert first("matmul", 64, 96) == "xla" and first("head", 64, 384) == "cpu"
    assert second("head", 64, 384) == "cpu"
    report = first.report()
    assert [(s.kind, s.k, s.n, s.chosen) for s in report.shapes] == [
        ("matmul", 64, 96, "xla"),
        ("head", 64, 384, "cpu"),
    ]
    assert report.mode == "bfloat16" and not report.cached and report.seconds >= 0
    assert set(report.shapes[0].candidates) == {"xla", "cpu"}
    assert second.report().cached  # its one shape was known already
    assert "head 64x384: cpu" in report.summary() and report.cpu in report.summary()


def test_chosen_prepares_each_shape_as_picked(two_candidates, monkeypatch):
    monkeypatch.setattr(cpu, "pack_dense", lambda w, dtype: ("packed", np.shape(w)))
    monkeypatch.setattr(cpu, "pack_qkv", lambda w, heads, kv_heads: ("packed", np.shape(w)))
    monkeypatch.setattr(dense.jax, "device_put", lambda x: x)
    picks = {("matmul", 64, 96): "cpu", ("matmul", 96, 64): "xla", ("head", 64, 384): "cpu"}
    picks |= {("activated", 64, 96): "xla", ("activated", 96, 64): "cpu"}
    picks |= {("residual", 64, 96): "cpu", ("residual", 96, 64): "xla"}
    picks |= {("qkv", 64, 96): "cpu", ("qkv", 96, 64): "xla"}
    strategy = dense.chosen(lambda kind, k, n: picks[kind, k, n])
    assert strategy.name == "measured"
    ones = np.ones
    assert isinstance(strategy.prepare(ones((2, 64, 96)), jnp.bfloat16), dense.Packed)
    plain = strategy.prepare(ones((2, 96, 64)), jnp.bfloat16)
    assert not isinstance(plain, dense.Packed) and plain.shape == (2, 96, 64)
    assert isinstance(strategy.prepare_head(ones((384, 64)), jnp.bfloat16), dense.Packed)
    # a matrix multiplied by `activated` is picked as its own kind
    assert isinstance(strategy.prepare_activated(ones((2, 96, 64)), jnp.bfloat16), dense.Packed)
    assert not isinstance(strategy.prepare_activated(ones((2, 64, 96)), jnp.bfloat16), dense.Packed)
    # and one added onto the residual stream by `residual`
    assert isinstance(strategy.prepare_residual(ones((2, 64, 96)), jnp.bfloat16), dense.Packed)
    assert not isinstance(strategy.prepare_residual(ones((2, 96, 64)), jnp.bfloat16), dense.Packed)
    # a q/k/v stack as the q/k/v form (its bias, split and RoPE fused where packed for it)
    assert isinstance(strategy.prepare_qkv(ones((2, 64, 96)), jnp.bfloat16, 1, 1), dense.PackedQkv)
    assert not isinstance(strategy.prepare_qkv(ones((2, 96, 64)), jnp.bfloat16, 2, 1), dense.Packed)
    # the int8 mode's forms, each multiplied by its own strategy
    int8 = dense.chosen(lambda kind, k, n: "int8-xla")
    prepared = int8.prepare(ones((2, 64, 96)), jnp.bfloat16)
    assert isinstance(prepared, dense.Int8)
    assert dense.FORMS[type(prepared)] is dense.INT8_XLA and dense._owner(plain) is dense.XLA


def test_qkv_is_timed_as_heads_turned_by_rope():
    """The layout a q/k/v shape is timed with, and the float64 turn its check applies: q and k
    heads turned, the v head as it is, position 0 unturned."""
    assert dense_choice.qkv_layout(960) == (13, 1, 64)
    assert dense_choice.qkv_layout(96) == (1, 1, 32)
    assert dense_choice.qkv_layout(32) is None  # fewer than three heads: timed as "activated"
    y = np.arange(3 * 4 * 96, dtype=np.float64).reshape(3 * 4, 96)[:3]  # [3 rows, 3 heads of 32]
    turned = dense_choice._rotated(y, 96)
    cos, sin = (np.asarray(t, np.float64) for t in dense_choice._rope_table(3, 32))
    a, b = y[:, :16], y[:, 16:32]
    np.testing.assert_allclose(turned[:, :32], np.hstack([a * cos - b * sin, b * cos + a * sin]))
    np.testing.assert_array_equal(turned[0], y[0])  # position 0: cos 1, sin 0
    np.testing.assert_array_equal(turned[:, 64:], y[:, 64:])  # v
    assert not np.array_equal(turned[1:, 32:64], y[1:, 32:64])  # k


def test_a_qkv_form_that_drops_rope_is_ineligible():
    """A strategy whose q/k/v are not turned fails the check of the "qkv" kind."""
    unturned = dense.XLA._replace(
        name="unturned",
        qkv=lambda x, w, layer, bias, heads, kv_heads, rows=None, rope=None: dense.XLA.qkv(
            x, w, layer, bias, heads, kv_heads, rows, None
        ),
    )
    monkey = {**dense_choice.STRATEGIES, "unturned": unturned}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dense_choice, "STRATEGIES", monkey)
        timings = dense_choice.measure_shape("bfloat16", "qkv", 64, 96, ("xla", "unturned"))
    assert timings["xla"].eligible and not timings["unturned"].eligible


def broken_strategy(rounding) -> dense.Dense:
    """XLA's strategy with its products passed through `rounding`."""
    xla = dense.XLA
    return xla._replace(
        name="broken",
        matmul=lambda x, w, layer, rows=None: rounding(xla.matmul(x, w, layer, rows)),
        gated=lambda x, w, layer, rows=None: rounding(xla.gated(x, w, layer, rows)),
        head=lambda h, w: rounding(xla.head(h, w)),
    )


def test_measuring_real_kernels_checks_their_products(monkeypatch):
    names = dense_choice.candidates("bfloat16", "matmul", 64, 96)
    assert ("cpu" in names) == cpu.DENSE_AVAILABLE and ("onednn" in names) == onednn.AVAILABLE
    for kind in dense_choice.KINDS:
        timings = dense_choice.measure_shape("bfloat16", kind, 64, 96, names)
        assert set(timings) == set(names)
        for t in timings.values():
            assert t.eligible and 0 <= t.error <= 1, (kind, t)
            assert t.gflops > 0 and set(t.seconds) <= {"64", "256", "8192"}
    # products rounded to bf16 (a bf16 accumulation would be worse) are out of bounds
    to_bf16 = lambda y: y.astype(jnp.bfloat16).astype(jnp.float32)
    monkeypatch.setitem(dense.STRATEGIES, "broken", broken_strategy(to_bf16))
    timings = dense_choice.measure_shape("bfloat16", "matmul", 256, 96, ("xla", "broken"))
    assert timings["xla"].eligible and not timings["broken"].eligible
    assert timings["broken"].error > 1
    # a residual form that drops the stream it is given is out of bounds too
    product = lambda x, w, layer, residual, bias=None, rows=None: dense.XLA.matmul(x, w, layer)
    monkeypatch.setitem(dense.STRATEGIES, "dropped", dense.XLA._replace(residual=product))
    timings = dense_choice.measure_shape("bfloat16", "residual", 256, 96, ("xla", "dropped"))
    assert timings["xla"].eligible and not timings["dropped"].eligible


def test_measuring_in_f32_holds_the_native_kernel_to_the_f32_bound(monkeypatch):
    names = dense_choice.candidates("float32", "matmul", 64, 96)
    assert names == ("xla", "cpu") if cpu.F32_AVAILABLE else names == ("xla",)
    assert dense_choice.candidates("float32", "matmul", 60, 96) == names  # any K
    assert dense_choice.candidates("float32", "matmul", 64, 100) == ("xla",)  # N: groups of 16
    for kind in dense_choice.KINDS:
        timings = dense_choice.measure_shape("float32", kind, 64, 96, names)
        assert set(timings) == set(names)
        for t in timings.values():
            assert t.eligible and 0 <= t.error <= 1, (kind, t)
    # products rounded to bf16 are out of the f32 bound
    to_bf16 = lambda y: y.astype(jnp.bfloat16).astype(jnp.float32)
    monkeypatch.setitem(dense.STRATEGIES, "broken", broken_strategy(to_bf16))
    timings = dense_choice.measure_shape("float32", "matmul", 256, 96, ("xla", "broken"))
    assert timings["xla"].eligible and not timings["broken"].eligible


def test_native_paths_are_candidates_exactly_where_they_run():
    """On every CPU. Where a native path does not run (neither AVX2 nor AVX512-BF16 for the
    native kernel; no extension, or no bf16 matmul in oneDNN on a CPU with AVX2 and no AVX-512,
    for oneDNN), forcing it is refused naming why, and it is never measured."""
    names = dense_choice.candidates("bfloat16", "matmul", 576, 1536)
    assert onednn.isa() if onednn.BUILT else onednn.isa() is None
    if onednn.AVAILABLE:
        assert select_dense("onednn", "cpu", dtype=jnp.bfloat16) is dense.ONEDNN
        assert onednn.pack(np.ones((1, 64, 96), np.float32)).shape[0] == 1
    else:
        with pytest.raises(ValueError, match=r"needs .* an AVX-512 CPU .* oneDNN built: "):
            select_dense("onednn", "cpu", dtype=jnp.bfloat16)
    if not cpu.DENSE_AVAILABLE:
        with pytest.raises(ValueError, match=r"needs .* an AVX2 or AVX512-BF16 CPU"):
            select_dense("cpu", "cpu", dtype=jnp.bfloat16)
    assert ("onednn" in names) == onednn.AVAILABLE and ("cpu" in names) == cpu.DENSE_AVAILABLE
    if not (cpu.DENSE_AVAILABLE or onednn.AVAILABLE):  # XLA alone: nothing to measure
        assert select_dense(None, "cpu", dtype=jnp.bfloat16) is dense.XLA


def test_forcing_the_native_kernel_without_it_names_what_it_needs(monkeypatch):
    """As on a CPU with neither AVX2 nor AVX512-BF16, or a checkout without the extension."""
    monkeypatch.setattr(cpu, "DENSE_AVAILABLE", False)
    needs = r"needs .* an AVX2 or AVX512-BF16 CPU .* native kernels: bf16 False"
    with pytest.raises(ValueError, match=needs):
        select_dense("cpu", "cpu", dtype=jnp.bfloat16)
    assert not dense_runs("cpu", "cpu", dtype=jnp.bfloat16)


@pytest.mark.skipif(not cpu.INT8_AVAILABLE, reason="needs the native int8 kernel")
def test_measuring_int8_holds_the_native_kernel_to_its_xla_twin():
    for kind in ("matmul", "gated", "activated", "residual", "qkv"):
        timings = dense_choice.measure_shape("int8", kind, 128, 96, ("int8-xla", "int8"))
        assert timings["int8-xla"].error == 0  # the reference itself
        assert timings["int8"].eligible, timings


@pytest.mark.parametrize("family", ["llama-untied", "qwen2", "qwen3", "gemma2"])
@pytest.mark.parametrize("strategy", [None, "xla", "cpu", "onednn"])
def test_every_strategy_scores_within_the_bf16_bound_of_f32(tiny_checkpoints, family, strategy):
    if strategy == "cpu" and not cpu.DENSE_AVAILABLE:
        pytest.skip("needs the native bf16 kernel")
    if strategy == "onednn" and not onednn.AVAILABLE:
        pytest.skip(f"needs oneDNN's bf16 matmul (built: {onednn.BUILT}, on {onednn.isa()})")
    f32 = load_model(tiny_checkpoints[family], dtype="float32", progress=False)
    model = load_model(tiny_checkpoints[family], dtype="bfloat16", dense=strategy, progress=False)
    several = cpu.DENSE_AVAILABLE or onednn.AVAILABLE  # beside XLA
    assert (model.program.dense_choice is not None) == (strategy is None and several)
    rng = np.random.default_rng(7)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (1, 9, 40, 70)]
    got, want = (np.log(m.score(query, items, [1, 2, 3])) for m in (model, f32))
    deviation = np.abs(got - want).max()
    assert 0 < deviation < BF16_BOUND  # bf16, and no further from f32 than bf16 goes
