"""What one packed batch costs in FLOPs and bytes moved, from XLA's cost analysis.

XLA's cost analysis counts a loop's body once, whatever its trip count, and the forward loops
over layers (`lax.scan`), over chunks of `HEAD_ROWS` real score rows, and (inside attention) over
the schedule's key blocks. So a batch shape is analysed in parts whose counts are known:

- the forward compiled with one layer and with two (unrolled): their difference is one layer's
  dense work (projections, norms, RoPE, MLP), counted once per layer, and the one-layer program
  less it the rest (embedding, one step of the score rows). Attention is left out of both (a
  stand-in that returns its queries);
- one step of `HEAD_ROWS` score rows (the last layer past its attention, the final norm, the
  head), counted once per step of the batch's real rows past the first: its rows' work from the
  one-layer program at `HEAD_ROWS` rows less the same at one (the work is linear in the rows),
  and the weights it reads again;
- attention from the batch's block schedule (each layer's own, sliding or global): every
  visited (query block, key block) pair costs what the kernels compute on it, 4 B^2 D H FLOPs,
  and reads a block of keys and values.

Programs take the XLA dense path, so every matmul is visible to the analysis.
"""

from typing import NamedTuple

import jax
import msgspec
import numpy as np

from engine.device.program import DTYPES, DeviceProgram
from engine.host.packing import empty_batch
from engine.loaders import Checkpoint
from engine.models import ModelConfig, PackedInputs
from engine.models.rows import HEAD_ROWS, steps
from engine.tasks import task_for
from score_kernels.dense import XLA


class Cost(NamedTuple):
    flops: float
    bytes: float

    def plus(self, other: "Cost", times: float = 1.0) -> "Cost":
        return Cost(self.flops + times * other.flops, self.bytes + times * other.bytes)


class ShapeCost(NamedTuple):
    """The parts of one batch shape (T, S, L) whose counts the batch decides."""

    outside: Cost  # embedding, one step of score rows
    layer: Cost  # one layer without attention
    row_step: Cost  # one more step of HEAD_ROWS score rows
    temp_bytes: int  # XLA's temporary buffers of the one-layer program


class Analyser:
    """XLA costs of a model's batch shapes, each compiled once (two small programs). Only the
    weights' shapes are used: `params` is the layout of the XLA dense path, of arrays or
    `jax.ShapeDtypeStruct`s (`of_checkpoint`, `of_program` make it)."""

    def __init__(
        self, config: ModelConfig, params: dict, dtype: str, block_size: int, weight_bytes: int
    ):
        self.config = config
        self.dtype = dtype
        self.block_size = block_size
        self.weight_bytes = weight_bytes  # the whole model's device weights
        self._programs = [_layers(config, _abstract(params), n) for n in (1, 2)]
        self._shapes: dict[tuple[int, int, int], ShapeCost] = {}

    @classmethod
    def of_checkpoint(cls, checkpoint: Checkpoint, dtype: str, block_size: int) -> "Analyser":
        """From a loaded checkpoint: only one layer is placed on the device."""
        one = _one_layer(checkpoint, dtype)
        cfg = checkpoint.config
        params = _layers(one.config, _abstract(one.params), cfg.num_layers)[1]
        layer = sum(_nbytes(x) for x in jax.tree.leaves(_stacks(params))) // cfg.num_layers
        weights = one.weight_bytes + (cfg.num_layers - 1) * layer
        return cls(cfg, params, dtype, block_size, weights)

    @classmethod
    def of_program(cls, program: DeviceProgram, block_size: int) -> "Analyser":
        """From a device program, whichever dense path it takes (the XLA one's shapes are
        analysed: the native kernel's work is the same matmuls)."""
        return cls(
            program.config, xla_layout(program), program.dtype, block_size, program.weight_bytes
        )

    def shape(self, shape: tuple[int, int, int]) -> ShapeCost:
        if shape not in self._shapes:
            self._shapes[shape] = self._analyse(shape)
        return self._shapes[shape]

    def batch(self, inputs: PackedInputs) -> Cost:
        """The cost of one packed batch (numpy inputs, as `engine.host.packing.pack` makes them)."""
        t, s, labels = len(inputs.tokens), len(inputs.score_rows), inputs.label_ids.shape[1]
        parts = self.shape((t, s, labels))
        cost = parts.outside.plus(parts.layer, self.config.num_layers)
        cost = cost.plus(parts.row_step, max(0, steps(int(inputs.row_count)) - 1))
        return cost.plus(self._attention(inputs))

    def _analyse(self, shape: tuple[int, int, int]) -> ShapeCost:
        t, s, labels = shape
        one, two = self._programs
        rows = min(s, HEAD_ROWS)
        (first, temp), (second, _) = (self._compiled(p, t, rows, labels) for p in (one, two))
        layer = second.plus(first, -1)
        step = self._row_step(t, labels, first) if s > HEAD_ROWS else Cost(0.0, 0.0)
        return ShapeCost(first.plus(layer, -1), layer, step, temp)

    def _row_step(self, t: int, labels: int, full: Cost) -> Cost:
        """One more step of `HEAD_ROWS` rows: what a row costs (`full`, the one-layer program at
        `HEAD_ROWS` rows, less the same at one row) that many times, and the weights the step
        reads again (the last layer's projection and MLP, the head)."""
        one_row = self._compiled(self._programs[0], t, 1, labels)[0]
        rows = full.plus(one_row, -1)  # HEAD_ROWS - 1 rows
        params = self._programs[0][1]
        weights = sum(_nbytes(params["matrices"][m]) for m in ("o", "gate_up", "down"))
        weights += _nbytes(params["head"])
        scale = HEAD_ROWS / (HEAD_ROWS - 1)
        return Cost(rows.flops * scale, rows.bytes * scale + weights)

    def _compiled(self, program: tuple, t: int, rows: int, labels: int) -> tuple[Cost, int]:
        batch = empty_batch(t, rows, labels, self.block_size, self.config.window)
        return _compiled_cost(*program, batch)

    def _attention(self, inputs: PackedInputs) -> Cost:
        c = self.config
        itemsize = np.dtype(DTYPES[self.dtype]).itemsize
        sliding = sum(c.sliding_layers) if c.window else 0
        b = self.block_size
        pair = Cost(
            4 * b * b * c.head_dim * c.num_heads, 2 * b * c.num_kv_heads * c.head_dim * itemsize
        )
        per_query_block = Cost(0, 2 * b * c.num_heads * c.head_dim * itemsize)  # q in, out
        cost = Cost(0.0, 0.0)
        for meta, layers in ((inputs.meta, c.num_layers - sliding), (inputs.window_meta, sliding)):
            if layers:
                pairs = int(np.asarray(meta.block_count).sum())
                blocks = len(meta.block_count)
                cost = cost.plus(pair, layers * pairs).plus(per_query_block, layers * blocks)
        return cost


def xla_layout(program: DeviceProgram) -> dict:
    """The shapes of `program`'s weights as the XLA dense path lays them out."""
    if program.dense is XLA:
        return _abstract(program.params)
    c, dtype = program.config, DTYPES[program.dtype]
    e, i, d = c.hidden_size, c.intermediate_size, c.head_dim
    matrices = {
        "qkv": (e, (c.num_heads + 2 * c.num_kv_heads) * d),
        "o": (c.num_heads * d, e),
        "gate_up": (e, 2 * i),
        "down": (i, e),
    }
    shared = {name: program.params[name] for name in ("embed", "final_norm", "layers")}
    return {
        **_abstract(shared),
        "head": jax.ShapeDtypeStruct((c.num_labels or c.vocab_size, e), dtype),
        "matrices": {
            name: jax.ShapeDtypeStruct((c.num_layers, *shape), dtype)
            for name, shape in matrices.items()
        },
    }


def _one_layer(checkpoint: Checkpoint, dtype: str) -> DeviceProgram:
    cfg = checkpoint.config
    cfg = msgspec.structs.replace(cfg, num_layers=1, sliding_layers=cfg.sliding_layers[:1])
    params = dict(checkpoint.params)
    params["layers"] = {name: x[:1] for name, x in params["layers"].items()}
    small = Checkpoint(cfg, params, checkpoint.tokenizer, checkpoint.source)
    return DeviceProgram(small, dtype=dtype, dense="xla", attention="xla", kv_cache_bytes=0)


def _stacks(params: dict) -> dict:
    """The per-layer stacks: a leading layer axis."""
    return {"layers": params["layers"], "matrices": params["matrices"]}


def _layers(cfg: ModelConfig, params: dict, n: int) -> tuple[ModelConfig, dict]:
    """The config and weight shapes of the model cut (or grown) to `n` layers."""
    sliding = (list(cfg.sliding_layers) * n)[:n] if cfg.sliding_layers else []
    cfg = msgspec.structs.replace(cfg, num_layers=n, sliding_layers=tuple(sliding))
    resized = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((n, *x.shape[1:]), x.dtype), _stacks(params)
    )
    return cfg, {**params, **resized}


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _nbytes(x) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def _no_attention(q, k, v, meta, *, scale, softcap=0.0, pool=None):
    return q


def _compiled_cost(cfg: ModelConfig, params: dict, batch: PackedInputs) -> tuple[Cost, int]:
    """XLA's cost of the forward of `cfg` (layers unrolled, attention left out) and its
    temporary bytes."""
    forward = task_for(cfg).forward_of(_no_attention, XLA, unroll=True)
    compiled = jax.jit(forward).lower(params, batch, None).compile()
    return _cost(compiled), compiled.memory_analysis().temp_size_in_bytes


def _cost(compiled) -> Cost:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older JAX: one dict per computation
        analysis = analysis[0]
    return Cost(float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0)))
