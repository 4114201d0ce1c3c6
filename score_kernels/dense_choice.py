"""The dense strategy chosen by measurement: each weight shape multiplied by the fastest strategy
that computes it within the accuracy bound, timed on this machine once and remembered.

No fixed choice is right on every CPU. On AMD Zen 4/5 the native AVX512-BF16 kernel leads; on
Intel CPUs with AMX `vdpbf16ps` is slow, and the native kernel's AMX build, oneDNN on the AMX
tiles (`score_kernels.onednn`) and XLA's dot run several times faster; which of those leads depends
on the shape and the batch. So the default strategy (`dense=None`)
times every strategy that can run each of the model's matrix shapes (a layer matrix as the
forward multiplies it, out of a stack indexed by a scanned layer), and takes the fastest, or
the preferred of those within a margin of it (`MARGIN`, `PREFERENCE`).

Speed is not the only criterion: a candidate is eligible only if its products stay within the
bound that any f32 accumulation of the inputs keeps (bf16 inputs in the "bfloat16" mode, f32 in
"float32"), `K * 2^-23 * (|x| @ |w|)` per element (checked against float64 on a few rows of each
timed call; the gated pair also allows one bf16 rounding, the bf16 kernel's). In the int8 mode
the int8 strategies are held to the XLA twin, which defines the arithmetic (`score_kernels.quant`).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from score_kernels import cpu, onednn
from score_kernels.dense import STRATEGIES, Dense, chosen

# token rows the layer matrices are timed at: a batch's work is in its large ones, and there an
# unfused form's f32 product and XLA's pass over it leave the caches, which 2,048 rows hid (the
# q/k/v of MiniLM on AMX tiles: oneDNN 1.05x the fused form alone at 2,048 rows, 0.65x at 8,192)
ROWS = (8192,)
HEAD_ROWS = (64, 256)  # score rows the LM head is timed at
HEAD_COLUMNS = 8192  # of a vocabulary, the head timed on (its GFLOP/s hold for the rest)
SLOWER = 2.0  # a candidate this many times slower than the best is timed no more (nor at more rows)
CHECK_ROWS, CHECK_COLUMNS = 8, 1024  # of each timed call's output, compared with float64
FIRST_CALL = 4.0  # how much slower a first call has run than the next (XLA's dot, here)
MIN_CALLS, MAX_CALLS, MIN_SECONDS = 3, 20, 0.05  # timed calls per candidate and row count
LAYERS = 2  # copies of a layer matrix each timed call multiplies, in turn, as the forward does
U = 2.0**-24  # f32 unit roundoff
# A shape's product is one of many in a forward, between XLA's own ops: a strategy outside
# XLA's thread pool, or one XLA cannot fuse with its neighbours, costs more there than alone,
# and one shape timed alone varies by up to ~12% run to run on a shared machine. So among the
# candidates within MARGIN of the fastest alone, the first in PREFERENCE is taken: the native
# kernels (on XLA's pool), then XLA, then oneDNN (its own OpenMP threads). Measured on a 2-core
# AMD EPYC (Zen 4), SmolLM2 W1: the shapes' strategies within 10% of each other alone, yet
# all-oneDNN 7.2 items/s and XLA for the attention projections 8.0, against 8.4 all-native.
MARGIN = 0.15
PREFERENCE = ("cpu", "int8", "xla", "int8-xla", "onednn")
METHOD = "4"  # how candidates are timed and compared: a change retires the cached choices
MATRIX_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2")
MODES = ("bfloat16", "float32", "int8")
KINDS = ("matmul", "gated", "activated", "qkv", "residual", "head")
# the kinds a strategy fuses with what follows the product, bf16 only: elsewhere the product
# alone decides ("matmul")
FUSED_KINDS = ("activated", "qkv", "residual")
# the activation an "activated" shape is timed and checked with (the costliest: one choice per
# shape serves every activation)
ACTIVATION = "gelu"


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

    # "matmul" [K, N] | "gated" (gate and up, each [K, N]) | "activated" ([K, N], with the bias
    # and activation after it: `Dense.activated`) | "qkv" (a fused q/k/v stack [K, N], split
    # into heads and turned by RoPE: `Dense.qkv`, timed with `qkv_layout`) | "residual" ([K, N],
    # added onto a residual stream: `Dense.residual`) | "head" ([N, K])
    kind: str
    k: int
    n: int
    chosen: str
    candidates: dict[str, Timing]


class DenseChoice(msgspec.Struct, frozen=True, kw_only=True):
    """What the measured strategy chose for a model's matrices on this machine."""

    mode: str  # "bfloat16" | "float32" | "int8"
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
    builds, the JAX version and the way of measuring."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name", platform.processor() or platform.machine()),
        "flags": " ".join(f for f in MATRIX_FLAGS if f in flags),
        "cores": str(len(os.sched_getaffinity(0))),
        "native": _build(cpu._cpu if cpu.AVAILABLE else None),
        "onednn_build": _build(onednn._onednn),
        "isa": cpu.isa() if cpu.AVAILABLE else "none",
        "dense_isa": (cpu.dense_isa() or "none") if cpu.AVAILABLE else "none",
        "f32_isa": (cpu.f32_isa() or "none") if cpu.AVAILABLE else "none",
        "int8_isa": (cpu.int8_isa() or "none") if cpu.AVAILABLE else "none",
        "onednn": onednn.isa() or "none",
        "jax": f"{jax.__version__}/{jax.lib.__version__}",
        "method": METHOD,
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


def input_dtype(mode: str):
    """The dtype a dense mode's weights and inputs take: f32 in "float32", else bf16 (the int8
    mode's activations and head are bf16)."""
    return jnp.float32 if mode == "float32" else jnp.bfloat16


def candidates(mode: str, kind: str, k: int, n: int) -> tuple[str, ...]:
    """The strategies that can run this shape in `mode`; the reference (XLA) form first."""
    if mode == "float32":
        return ("xla", *("cpu",) * cpu.dense_supports(k, n, jnp.float32))
    bf16 = ("xla", *("cpu",) * cpu.dense_supports(k, n), *("onednn",) * onednn.supports(k, n))
    if mode == "bfloat16" or kind == "head":  # the int8 mode's head is bf16
        return bf16
    return ("int8-xla", "int8") if cpu.int8_supports(k, n) else ("int8-xla",)


def fastest(timings: dict[str, Timing]) -> str:
    """The eligible candidate with the least time for a batch of each row count together (the
    large batch weighs as the work it is), among those timed at every row count (none eligible:
    the one closest to its bound); where several come within `MARGIN` of the least, the first
    of them in `PREFERENCE`."""
    eligible = [name for name, t in timings.items() if t.eligible]
    if not eligible:
        return min(timings, key=lambda name: timings[name].error)
    counts = max(len(timings[name].seconds) for name in eligible)
    total = {
        n: sum(timings[n].seconds.values()) for n in eligible if len(timings[n].seconds) == counts
    }
    least = min(total.values())
    close = [name for name, t in total.items() if t <= least * (1 + MARGIN)]
    return min(
        close, key=lambda name: PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)
    )


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

    def kind(self, kind: str) -> str:
        """The kind a shape is measured as: a fused kind in the bf16 mode, whose candidates
        differ in what they fuse; elsewhere the product alone decides ("matmul"): in the int8
        mode only the native kernel fuses, and what it fuses it saves on top of its product."""
        return "matmul" if kind in FUSED_KINDS and self.mode != "bfloat16" else kind

    def pick(self, kind: str, k: int, n: int) -> str:
        """The strategy for weights of this kind and shape (measured if not known yet)."""
        key = (self.kind(kind), k, n)
        if key not in self.table:
            self.table[key] = self._choose(*key)
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
    """A model's picks through a `Chooser`: the callable `score_kernels.dense.chosen` asks, and the
    report of the shapes it asked about."""

    def __init__(self, chooser: Chooser):
        self.chooser = chooser
        self.keys: list[tuple[str, int, int]] = []
        self.seconds = 0.0  # spent measuring for these picks
        self.measured = 0  # shapes these picks measured

    def __call__(self, kind: str, k: int, n: int) -> str:
        kind = self.chooser.kind(kind)
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
    """The strategy that multiplies each shape as measured fastest in `mode` ("bfloat16",
    "float32", or "int8" for the int8 compute mode), the choices kept in `cache_dir` (None: in
    this process only)."""
    choices = chooser(mode)
    choices.use(cache_dir)
    return chosen(Picks(choices))


def measure_shape(mode: str, kind: str, k: int, n: int, names) -> dict[str, Timing]:
    """Time each of `names` on random weights of this kind and shape (a head on `HEAD_COLUMNS`
    of its columns) at each row count, and check its products against the reference on a few
    rows of each."""
    rng = np.random.default_rng(k * 65_537 + n)
    if kind == "qkv" and qkv_layout(n) is None:
        kind = "activated"
    rows = HEAD_ROWS if kind == "head" else ROWS
    n = min(n, HEAD_COLUMNS) if kind == "head" else n
    dtype = input_dtype(mode)
    x = jnp.asarray(rng.standard_normal((max(rows), k), np.float32) / math.sqrt(k), dtype)
    ws = [_weights(rng, k, n, kind) for _ in range(2 if kind == "gated" else 1)]
    apply = {name: _program(STRATEGIES[name], kind, ws, dtype) for name in names}
    check = [w[:, :CHECK_COLUMNS] for w in ws]
    reference = _reference(mode, kind, x[:CHECK_ROWS], check, apply, n)
    seconds = {name: {} for name in names}
    error = dict.fromkeys(names, 0.0)
    for r in rows:
        for name, (best, y) in _time(apply, x[:r]).items():
            seconds[name][str(r)] = best / (1 if kind == "head" else LAYERS)  # one product
            error[name] = max(error[name], reference(y))
        fast = min(seconds[name][str(r)] for name in apply)
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


class _Program(NamedTuple):
    """A candidate's product, x [M, K] -> f32[M, N], with its prepared weights (passed to the
    jitted function as an argument: a closed-over array would be compiled in as a constant)."""

    jitted: Callable  # (x, w) -> f32[M, N], or f32[LAYERS, M, N] through a layer stack
    w: Any
    # what `jitted` answers -> the first layer's [M, N], outside the timed call
    view: Callable = lambda y: _first(y)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.view(self.jitted(x, self.w))

    def compiled(self, x: jax.Array) -> Callable[[], jax.Array]:
        """`jitted` on x, compiled for its shape now: calling it only runs it."""
        run = self.jitted.lower(x, self.w).compile()
        return lambda: run(x, self.w)


def _first(y: jax.Array) -> jax.Array:
    """The first layer's product of a layer stack's [LAYERS, M, N]; a head's or a residual
    stream's [M, N] as it is."""
    return y[0] if y.ndim == 3 else y


def _program(dense: Dense, kind: str, ws, dtype) -> _Program:
    """The strategy's product with weights `ws` prepared as it prepares them in `dtype`.

    Layer matrices are multiplied as the forward multiplies them: a stack of `LAYERS` copies
    indexed by the layer a `lax.scan` carries, not a constant index (XLA folds a constant
    slice away, but copies a traced one out of the stack, which costs it up to half its speed
    at a few hundred rows)."""
    if kind == "head":
        w = dense.prepare_head(ws[0].T, dtype)  # [N, K], as a head is stored
        return _Program(jax.jit(dense.head), w)
    stack = [np.stack([w] * LAYERS) for w in ws]  # [L, K, N] each
    if kind == "matmul":
        w, product = dense.prepare(stack[0], dtype), dense.matmul
    elif kind == "activated":
        bias = jnp.zeros(ws[0].shape[1], jnp.float32)
        w = dense.prepare_activated(stack[0], dtype)
        product = lambda x, w, i: dense.activated(x, w, i, bias, ACTIVATION)
    elif kind == "residual":
        stream = functools.partial(_stream, dense, ws[0].shape[1])
        return _Program(jax.jit(stream), dense.prepare_residual(stack[0], dtype))
    elif kind == "qkv":
        return _qkv_program(dense, stack[0], dtype)
    else:
        w, product = dense.prepare_gated(*stack, dtype), dense.gated

    def layers(x, w):  # f32[L, M, N]
        return jax.lax.scan(lambda _, i: (None, product(x, w, i)), None, jnp.arange(LAYERS))[1]

    return _Program(jax.jit(layers), w)


def qkv_layout(n: int) -> tuple[int, int, int] | None:
    """(heads, kv_heads, D) that a q/k/v stack of N columns is timed with: heads of D = 64
    columns (32 or 16 where N is not a multiple), one kv head and the rest query heads; None
    where N splits into no three heads (then it is timed as "activated"). A choice is per shape:
    how the columns split moves only which of them RoPE turns."""
    for d in (64, 32, 16):
        if n % d == 0 and n // d >= 3:
            return n // d - 2, 1, d
    return None


def _qkv_program(dense: Dense, stack: np.ndarray, dtype) -> _Program:
    """The q/k/v projection as the forward runs it: bias, split into heads, q and k turned by
    RoPE at positions 0..M-1, and q, k and v cast to the attention's dtype (`view` joins them
    into the stack's columns again, untimed)."""
    n = stack.shape[-1]
    heads, kv_heads, d = qkv_layout(n)
    bias = jnp.zeros(n, jnp.float32)
    w = dense.prepare_qkv(stack, dtype, heads, kv_heads)

    def product(x, w, i, rope):
        q, k, v = dense.qkv(x, w, i, bias, heads, kv_heads, None, rope)
        return tuple(t.astype(dtype) for t in (q, k, v))

    def layers(x, w):  # q, k and v of each layer; the table once, as the forward makes it
        rope = _rope_table(x.shape[0], d)
        step = lambda _, i: (None, product(x, w, i, rope))
        return jax.lax.scan(step, None, jnp.arange(LAYERS))[1]

    def view(qkv) -> jax.Array:  # f32[M, N]: layer 0's heads in the stack's column order
        q, k, v = (t[0].astype(jnp.float32) for t in qkv)
        m = q.shape[0]
        q = q.reshape(m, kv_heads, heads // kv_heads, d)
        return jnp.concatenate([q, k[:, :, None], v[:, :, None]], axis=2).reshape(m, n)

    return _Program(jax.jit(layers), w, view)


def _rope_table(m: int, d: int) -> tuple[jax.Array, jax.Array]:
    """cos and sin f32[M, D/2] of positions 0..M-1 (base 10,000), as `decoder.Rope` makes them."""
    inv = 1.0 / 10_000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d)  # [D/2]
    angles = jnp.arange(m, dtype=jnp.float32)[:, None] * inv[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def _rotated(y: np.ndarray, n: int, bound: bool = False) -> np.ndarray:
    """y [R, C] (the first C of N q/k/v columns, rows at positions 0..R-1) with the q and k
    heads of `qkv_layout(n)` turned by RoPE in float64; `bound`: each turned value's bound from
    its pair's, |a| |cos| + |b| |sin|."""
    heads, kv_heads, d = qkv_layout(n)
    cos, sin = (np.asarray(t, np.float64) for t in _rope_table(y.shape[0], d))  # [R, D/2]
    out = y.copy()
    for c in range(0, y.shape[1], d):
        if (c // d) % (heads // kv_heads + 2) > heads // kv_heads:
            continue  # a v head
        a, b = y[:, c : c + d // 2], y[:, c + d // 2 : c + d]
        if bound:
            turned = [a * abs(cos) + b * abs(sin), b * abs(cos) + a * abs(sin)]
            out[:, c : c + d] = np.concatenate(turned, axis=1)
        else:
            out[:, c : c + d] = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=1)
    return out


def _stream(dense: Dense, n: int, x: jax.Array, w) -> jax.Array:
    """f32[M, N]: a residual stream of zeros after the `LAYERS` products added onto it, carried
    as the forward carries its stream (a strategy may write each sum over it)."""
    zeros = jnp.zeros((x.shape[0], n), jnp.float32)
    step = lambda stream, i: (dense.residual(x, w, i, stream), None)
    return jax.lax.scan(step, zeros, jnp.arange(LAYERS))[0]


def _time(apply: dict[str, _Program], x: jax.Array) -> dict[str, tuple[float, np.ndarray]]:
    """Each program's best call on x and its first `CHECK_ROWS` output rows. The programs are
    compiled first (in parallel), then take turns, so that a passing load on the machine slows
    them alike; one `SLOWER` than the fastest after `MIN_CALLS` (or `SLOWER * FIRST_CALL`
    after one) is called no more."""
    with ThreadPoolExecutor(min(len(apply), len(os.sched_getaffinity(0)))) as compiling:
        runs = dict(zip(apply, compiling.map(lambda p: p.compiled(x), apply.values()), strict=True))
    best, out = dict.fromkeys(apply, math.inf), {}
    spent, calls = 0.0, 0
    while calls < MIN_CALLS or (spent < MIN_SECONDS * len(runs) and calls < MAX_CALLS):
        for name, run in runs.items():
            start = time.perf_counter()
            y = jax.block_until_ready(run())
            took = time.perf_counter() - start
            best[name], spent = min(best[name], took), spent + took
            out.setdefault(name, y)
        calls += 1
        limit = SLOWER * (1 if calls >= MIN_CALLS else FIRST_CALL)
        runs = {name: run for name, run in runs.items() if best[name] <= limit * min(best.values())}
    return {
        name: (best[name], np.asarray(apply[name].view(y)[:CHECK_ROWS, :CHECK_COLUMNS], np.float64))
        for name, y in out.items()
    }


def _reference(mode: str, kind: str, x: jax.Array, ws, apply: dict, n: int) -> Callable:
    """y [CHECK_ROWS, N] -> its worst error over the bound (see the module docstring); ws: the
    first `CHECK_COLUMNS` of the N columns."""
    xf = np.asarray(x, np.float64)
    k = xf.shape[1]
    g, u = xf @ ws[0], xf @ ws[-1]  # gate and up (the same matrix but for the gated pair)
    gb, ub = (k * 2 * U * (np.abs(xf) @ np.abs(w)) for w in (ws[0], ws[-1]))
    if mode == "int8" and kind != "head":  # the int8 arithmetic as its XLA twin defines it
        exact = np.asarray(apply["int8-xla"](x)[:, :CHECK_COLUMNS], np.float64)
    elif kind == "gated":
        exact = g / (1 + np.exp(-g)) * u
    elif kind == "activated":
        exact = 0.5 * g * np.vectorize(math.erfc)(-g / math.sqrt(2))  # GELU (`ACTIVATION`)
    elif kind == "residual":
        exact = LAYERS * g
    elif kind == "qkv":
        exact, gb = _rotated(g, n), _rotated(gb, n, bound=True)
    else:
        exact = g
    if kind == "gated":  # the bound of each product through silu(g) * u, and one bf16 rounding
        silu = g / (1 + np.exp(-g))
        bound = 1.1 * np.abs(u) * gb + np.abs(silu) * ub + 2.0**-8 * np.abs(exact)
    elif kind == "activated":  # through GELU (|GELU'| < 1.13), and one bf16 rounding
        bound = 1.13 * gb + 2.0**-8 * np.abs(exact)
    elif kind == "qkv":  # the turned pairs' bounds, f32 roundings of the turn, one bf16 rounding
        bound = gb + 4 * U * _rotated(np.abs(g), n, bound=True) + 2.0**-8 * np.abs(exact)
    elif kind == "residual":  # each product's bound, and an f32 rounding of each addition
        bound = LAYERS * (gb + U * np.abs(exact))
    else:
        bound = gb
    bound = bound + 1e-30
    return lambda y: float(np.max(np.abs(y - exact) / bound))
