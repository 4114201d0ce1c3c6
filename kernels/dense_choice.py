"""The dense strategy chosen by measurement: each weight shape multiplied by the fastest strategy
that computes it within the accuracy bound, timed on this machine once and remembered.

No fixed choice is right on every CPU. On AMD Zen 4/5 the native AVX512-BF16 kernel leads; on
Intel CPUs with AMX its `vdpbf16ps` is slow, and oneDNN on the AMX tiles (`kernels.onednn`) and
XLA's dot run several times faster. So the default strategy (`dense=None`)
times every strategy that can run each of the model's matrix shapes, at a small and a large
batch, and takes the one that multiplies both in the least time.

Speed is not the only criterion: a candidate is eligible only if its products stay within the
bound that any f32 accumulation of the bf16 inputs keeps, `K * 2^-23 * (|x| @ |w|)` per element
(checked against float64 on a few rows of each timed call; the gated pair also allows its one
bf16 rounding). In the int8 mode the int8 strategies are held to the XLA twin, which defines the
arithmetic (`kernels.quant`).

The choices are kept in `<cache_dir>/dense-choice/<mode>-<key>.json`, keyed by the CPU model
and flags, the cores this process may use, the native builds and the JAX version, so a later
start reads them instead of measuring. Within a process a mode's choices are measured once.
"""

import functools
import hashlib
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from kernels import cpu, onednn
from kernels.dense import STRATEGIES, Dense, chosen

ROWS = (256, 2048)  # token rows the layer matrices are timed at: a small batch and a large one
HEAD_ROWS = (64, 256)  # score rows the LM head is timed at
SLOWER = 2.0  # a candidate this many times slower than the best at fewer rows is not timed at more
CHECK_ROWS, CHECK_COLUMNS = 8, 1024  # of each timed call's output, compared with float64
MIN_CALLS, MAX_CALLS, MIN_SECONDS = 2, 20, 0.05  # timed calls per candidate and row count
U = 2.0**-24  # f32 unit roundoff
MATRIX_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2")
MODES = ("bfloat16", "int8")
KINDS = ("matmul", "gated", "head")


class Timing(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate on one weight shape."""

    # best call per row count (keys are row counts; one far slower than the best at the smaller
    # count is not timed at the larger)
    seconds: dict[str, float]
    gflops: float  # at the largest row count timed
    error: float  # worst |y - exact| over its bound: at most 1 is within it
    eligible: bool


class ShapeChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The strategy chosen for one weight shape, and what each candidate measured (empty when
    only one could run)."""

    kind: str  # "matmul" [K, N] | "gated" (gate and up, each [K, N]) | "head" ([N, K])
    k: int
    n: int
    chosen: str
    candidates: dict[str, Timing]


class DenseChoice(msgspec.Struct, frozen=True, kw_only=True):
    """What the measured strategy chose for a model's matrices on this machine."""

    mode: str  # "bfloat16" | "int8"
    cpu: str  # the CPU model
    matrix_isa: str  # the CPU's widest matrix instructions ("amx", "avx512_bf16", ...)
    cores: int  # cores this process may use
    seconds: float  # spent measuring for this model (0 when every choice was known)
    cached: bool  # every choice was known (the cache file, or an earlier model of the process)
    shapes: list[ShapeChoice]

    def summary(self) -> str:
        """One line for a log: each shape's choice and each candidate's GFLOP/s."""
        how = "from the cache" if self.cached else f"measured in {self.seconds:.1f} s"
        shapes = "; ".join(
            f"{s.kind} {s.k}x{s.n}: {s.chosen}"
            + (" (" + ", ".join(f"{n} {t.gflops:.0f}" for n, t in s.candidates.items()) + ")")
            * bool(s.candidates)
            for s in self.shapes
        )
        where = f"{self.cpu} ({self.matrix_isa or 'no matrix ISA'}, {self.cores} cores)"
        return f"dense {self.mode} {how} on {where}, GFLOP/s: {shapes}"


class _CacheFile(msgspec.Struct):
    machine: dict[str, str]
    shapes: list[ShapeChoice]


def machine() -> dict[str, str]:
    """What a measured choice depends on: CPU model and matrix flags, usable cores, the native
    builds and the JAX version."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name", platform.processor() or platform.machine()),
        "flags": " ".join(f for f in MATRIX_FLAGS if f in flags),
        "cores": str(len(os.sched_getaffinity(0))),
        "native": _build(cpu._cpu if cpu.AVAILABLE else None),
        "onednn_build": _build(onednn._onednn),
        "isa": cpu.isa() if cpu.AVAILABLE else "none",
        "int8_isa": (cpu.int8_isa() or "none") if cpu.AVAILABLE else "none",
        "onednn": onednn.isa() or "none",
        "jax": f"{jax.__version__}/{jax.lib.__version__}",
    }


def _build(module) -> str:
    """An extension module's build, by its file's size and time ("none" without it)."""
    if module is None:
        return "none"
    stat = Path(module.__file__).stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def matrix_isa(flags: str) -> str:
    """The widest matrix instructions among `machine()["flags"]`."""
    order = ("amx_bf16", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2")
    widest = next((f for f in order if f in flags), "")
    return "amx" if widest == "amx_bf16" else widest


def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields}


def candidates(mode: str, kind: str, k: int, n: int) -> tuple[str, ...]:
    """The strategies that can run this shape in `mode`; the reference (XLA) form first."""
    bf16 = ("xla", *("cpu",) * cpu.dense_supports(k, n), *("onednn",) * onednn.supports(k, n))
    if mode == "bfloat16" or kind == "head":  # the int8 mode's head is bf16
        return bf16
    return ("int8-xla", "int8") if cpu.int8_supports(k, n) else ("int8-xla",)


def fastest(timings: dict[str, Timing]) -> str:
    """The eligible candidate with the least time for a batch of each row count together (the
    large batch weighs as the work it is), among those timed at every row count (none eligible:
    the one closest to its bound)."""
    eligible = [name for name, t in timings.items() if t.eligible]
    if not eligible:
        return min(timings, key=lambda name: timings[name].error)
    counts = max(len(timings[name].seconds) for name in eligible)
    finalists = [name for name in eligible if len(timings[name].seconds) == counts]
    return min(finalists, key=lambda name: sum(timings[name].seconds.values()))


Measure = Callable[[str, str, int, int, tuple[str, ...]], dict[str, Timing]]


class Chooser:
    """The choices of one mode on this machine: read from the cache files of the directories it
    is given (`use`), measured for a shape not known yet (`measure`, replaceable in tests), and
    written back to each."""

    def __init__(self, mode: str, measure: Measure | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.machine = machine()
        self.measure = measure or measure_shape
        self.paths: list[Path] = []
        self.table: dict[tuple[str, int, int], ShapeChoice] = {}
        self.seconds = 0.0  # spent measuring
        self.measured = 0  # shapes measured

    def use(self, cache_dir: str | None) -> None:
        """Keep the choices in `cache_dir` too (None: nowhere): those it holds are adopted
        where this process has not chosen yet, and all are written back."""
        path = _cache_path(cache_dir, self.mode, self.machine)
        if path is None or path in self.paths:
            return
        self.paths.append(path)
        for key, choice in _load(path, self.machine).items():
            self.table.setdefault(key, choice)
        self._save()

    def pick(self, kind: str, k: int, n: int) -> str:
        """The strategy for weights of this kind and shape (measured if not known yet)."""
        key = (kind, k, n)
        if key not in self.table:
            self.table[key] = self._choose(kind, k, n)
            self._save()
        return self.table[key].chosen

    def _choose(self, kind: str, k: int, n: int) -> ShapeChoice:
        names = candidates(self.mode, kind, k, n)
        if len(names) == 1:
            return ShapeChoice(kind=kind, k=k, n=n, chosen=names[0], candidates={})
        start = time.perf_counter()
        timings = self.measure(self.mode, kind, k, n, names)
        self.seconds += time.perf_counter() - start
        self.measured += 1
        return ShapeChoice(kind=kind, k=k, n=n, chosen=fastest(timings), candidates=timings)

    def _save(self) -> None:
        body = msgspec.json.format(
            msgspec.json.encode(_CacheFile(self.machine, list(self.table.values())))
        )
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(body)
            partial.replace(path)  # whole or not at all, also with concurrent writers

    def report(self, keys, seconds: float, cached: bool) -> DenseChoice:
        """The choices for `keys` ((kind, k, n) triples), with the machine they hold on, the
        `seconds` measuring them took, and whether all were known (`cached`)."""
        shapes = [self.table[key] for key in keys]
        return DenseChoice(
            mode=self.mode,
            cpu=self.machine["cpu"],
            matrix_isa=matrix_isa(self.machine["flags"]),
            cores=int(self.machine["cores"]),
            seconds=round(seconds, 3),
            cached=cached,
            shapes=shapes,
        )


def _load(path: Path, facts: dict[str, str]) -> dict[tuple[str, int, int], ShapeChoice]:
    try:
        cached = msgspec.json.decode(path.read_bytes(), type=_CacheFile)
    except (OSError, msgspec.DecodeError):
        return {}  # none yet, or unreadable: measured again and rewritten
    if cached.machine != facts:
        return {}
    return {(s.kind, s.k, s.n): s for s in cached.shapes}


def _cache_path(cache_dir: str | None, mode: str, facts: dict[str, str]) -> Path | None:
    if cache_dir is None:
        return None
    key = hashlib.sha256(msgspec.json.encode([mode, facts])).hexdigest()[:16]
    return Path(cache_dir) / "dense-choice" / f"{mode}-{key}.json"


class Picks:
    """A model's picks through a `Chooser`: the callable `kernels.dense.chosen` asks, and the
    report of the shapes it asked about."""

    def __init__(self, chooser: Chooser):
        self.chooser = chooser
        self.keys: list[tuple[str, int, int]] = []
        self.seconds = 0.0  # spent measuring for these picks
        self.measured = 0  # shapes these picks measured

    def __call__(self, kind: str, k: int, n: int) -> str:
        if (kind, k, n) not in self.keys:
            self.keys.append((kind, k, n))
        seconds, measured = self.chooser.seconds, self.chooser.measured
        name = self.chooser.pick(kind, k, n)
        self.seconds += self.chooser.seconds - seconds
        self.measured += self.chooser.measured - measured
        return name

    def report(self) -> DenseChoice:
        return self.chooser.report(self.keys, self.seconds, cached=self.measured == 0)


@functools.cache
def chooser(mode: str) -> Chooser:
    """The process's chooser for `mode`: a shape is measured once, so every program in the
    process multiplies it the same way."""
    return Chooser(mode)


def measured(mode: str, cache_dir: str | None) -> Dense:
    """The strategy that multiplies each shape as measured fastest in `mode` ("bfloat16", or
    "int8" for the int8 compute mode), the choices kept in `cache_dir` (None: in this process
    only)."""
    choices = chooser(mode)
    choices.use(cache_dir)
    return chosen(Picks(choices))


def measure_shape(mode: str, kind: str, k: int, n: int, names) -> dict[str, Timing]:
    """Time each of `names` on random weights of this kind and shape at each row count, and
    check its products against the reference on a few rows of each call."""
    rng = np.random.default_rng(k * 65_537 + n)
    rows = HEAD_ROWS if kind == "head" else ROWS
    x = jnp.asarray(rng.standard_normal((max(rows), k), np.float32) / math.sqrt(k), jnp.bfloat16)
    ws = [_weights(rng, k, n, kind) for _ in range(2 if kind == "gated" else 1)]
    apply = {name: _program(STRATEGIES[name], kind, ws) for name in names}
    reference = _reference(mode, kind, x[:CHECK_ROWS], [w[:, :CHECK_COLUMNS] for w in ws], apply)
    seconds = {name: {} for name in names}
    error = dict.fromkeys(names, 0.0)
    for r in rows:
        for name, (best, y) in _time(apply, x[:r]).items():
            seconds[name][str(r)] = best
            error[name] = max(error[name], reference(y))
        fast = min(min(seconds[name].values()) for name in apply)
        apply = {name: f for name, f in apply.items() if seconds[name][str(r)] <= SLOWER * fast}
    return {name: _timing(seconds[name], error[name], kind, k, n) for name in names}


def _timing(seconds: dict[str, float], error: float, kind: str, k: int, n: int) -> Timing:
    rows = max(map(int, seconds))
    flops = 2 * rows * k * n * (2 if kind == "gated" else 1)
    gflops = round(flops / seconds[str(rows)] / 1e9, 1)
    return Timing(seconds=seconds, gflops=gflops, error=error, eligible=error <= 1)


def _weights(rng: np.random.Generator, k: int, n: int, kind: str) -> np.ndarray:
    """f32 [K, N] of exactly bf16 values (float64 then sees what the strategies see): a block of
    `CHECK_COLUMNS` random columns repeated (a vocabulary's worth of random numbers would cost
    more than timing them). A head's is the transpose of a [N, K] array, as a head is stored."""
    block = rng.standard_normal((min(n, CHECK_COLUMNS), k), np.float32)
    block = np.asarray(jnp.asarray(block, jnp.bfloat16), np.float32)
    rows = np.tile(block, (-(-n // block.shape[0]), 1))[:n]  # [N, K]
    return rows.T if kind == "head" else np.ascontiguousarray(rows.T)


def _program(dense: Dense, kind: str, ws) -> Callable:
    """x [M, K] -> the strategy's product with the prepared weights (passed to the jitted
    function as an argument: a closed-over array would be compiled in as a constant)."""
    if kind == "matmul":
        w = dense.prepare(ws[0][None], jnp.bfloat16)
        f = jax.jit(lambda x, w: dense.matmul(x, w, jnp.int32(0)))
    elif kind == "gated":
        w = dense.prepare_gated(ws[0][None], ws[1][None], jnp.bfloat16)
        f = jax.jit(lambda x, w: dense.gated(x, w, jnp.int32(0)))
    else:
        w = dense.prepare_head(ws[0].T, jnp.bfloat16)  # [N, K], as a head is stored
        f = jax.jit(dense.head)
    return lambda x: f(x, w)


def _time(apply: dict[str, Callable], x: jax.Array) -> dict[str, tuple[float, np.ndarray]]:
    """Each function's best call on x and its first `CHECK_ROWS` output rows. The candidates
    take turns, so that a passing load on the machine slows them alike."""
    out = {name: jax.block_until_ready(f(x)) for name, f in apply.items()}  # compiles
    best = dict.fromkeys(apply, math.inf)
    spent, calls = 0.0, 0
    while calls < MIN_CALLS or (spent < MIN_SECONDS * len(apply) and calls < MAX_CALLS):
        for name, f in apply.items():
            start = time.perf_counter()
            jax.block_until_ready(f(x))
            took = time.perf_counter() - start
            best[name], spent = min(best[name], took), spent + took
        calls += 1
    return {
        name: (best[name], np.asarray(y[:CHECK_ROWS, :CHECK_COLUMNS], np.float64))
        for name, y in out.items()
    }


def _reference(mode: str, kind: str, x: jax.Array, ws, apply: dict) -> Callable:
    """y [CHECK_ROWS, N] -> its worst error over the bound (see the module docstring)."""
    xf = np.asarray(x, np.float64)
    k = xf.shape[1]
    g, u = xf @ ws[0], xf @ ws[-1]  # gate and up (the same matrix but for the gated pair)
    gb, ub = (k * 2 * U * (np.abs(xf) @ np.abs(w)) for w in (ws[0], ws[-1]))
    if mode == "int8" and kind != "head":  # the int8 arithmetic as its XLA twin defines it
        exact = np.asarray(apply["int8-xla"](x)[:, :CHECK_COLUMNS], np.float64)
    elif kind == "gated":
        exact = g / (1 + np.exp(-g)) * u
    else:
        exact = g
    if kind == "gated":  # the bound of each product through silu(g) * u, and one bf16 rounding
        silu = g / (1 + np.exp(-g))
        bound = 1.1 * np.abs(u) * gb + np.abs(silu) * ub + 2.0**-8 * np.abs(exact)
    else:
        bound = gb
    bound = bound + 1e-30
    return lambda y: float(np.max(np.abs(y - exact) / bound))
