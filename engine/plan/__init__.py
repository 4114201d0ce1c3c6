"""Capacity and roofline planning: what a model needs and can do on a device before it runs
there (`python -m engine.plan`).

For a model, a dtype and a device kind (this machine's CPU, measured; `h100`, `h200`,
`tpu-v5e`, `tpu-v6e` from their published figures, `engine.plan.devices`): the KV bytes per
token, the KV pool capacity in tokens for the device's memory, the largest batch beside the
weights and the default pool, and a roofline estimate of W1 and W2: each of the workload's
batches (as the engine's planner lays them out) takes max(FLOPs / peak, bytes / bandwidth),
its FLOPs and bytes from XLA's cost analysis of its compiled program (`engine.plan.costs`).
A roofline is an upper bound: it leaves out per-batch overhead, the host's work and any
kernel below the device's peak.
"""

from collections.abc import Sequence

from engine.capabilities import Ability
from engine.device.kv_pool import default_kv_cache_bytes
from engine.device.program import DTYPES, DeviceProgram
from engine.host.buckets import DEFAULT_BLOCK_SIZE, DEFAULT_TOKEN_BUDGET, make_buckets
from engine.loaders import Checkpoint
from engine.models import ModelConfig
from engine.plan import workloads
from engine.plan.costs import Analyser, Cost
from engine.plan.devices import (
    KINDS,
    PUBLISHED,
    Device,
    device,
    kinds_for_this_host,
)
from score_kernels import devices

__all__ = [
    "KINDS",
    "PUBLISHED",
    "Device",
    "capacities",
    "capacity",
    "device",
    "kinds_for_this_host",
    "plan",
    "plan_engine",
]


def capacity(cfg: ModelConfig, dtype: str, memory: int, weight_bytes: int) -> dict:
    """Memory figures of `cfg` in `dtype` on a device of `memory` bytes: KV bytes per token,
    the default pool's tokens, and the tokens a pool could hold in everything the weights
    leave."""
    per_token = cfg.kv_bytes_per_token(DTYPES[dtype](0).itemsize)
    pool_bytes = default_kv_cache_bytes(per_token, memory)
    return {
        "memory_bytes": memory,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": per_token,
        "default_pool_tokens": pool_bytes // per_token,
        "capacity_tokens": max(0, memory - weight_bytes) // per_token,
    }


def capacities(cfg: ModelConfig, dtype: str, weight_bytes: int) -> dict[str, dict]:
    """`capacity` on this host ("cpu") and on each published device kind: what needs no
    compile or measurement (the service reports it)."""
    memories = {"cpu": devices.host_memory()} | {kind: d.memory for kind, d in PUBLISHED.items()}
    return {kind: capacity(cfg, dtype, m, weight_bytes) for kind, m in memories.items()}


def plan(
    source: Checkpoint | DeviceProgram,
    kinds=KINDS,
    *,
    dtype: str = "bfloat16",
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    block_size: int = DEFAULT_BLOCK_SIZE,
    memory: int | None = None,
    progress=None,
) -> dict:
    """The plan of a checkpoint (in `dtype`) or of a loaded device program (in its own) on each
    device kind: `capacity`, the largest batch, and W1 and W2 roofline estimates
    (`progress(text)` is told of each compile). ValueError for a cross-encoder."""
    why = source.task.refusal(Ability.ROOFLINE)
    if why:
        raise ValueError(why)
    if isinstance(source, DeviceProgram):
        analyser, dtype = Analyser.of_program(source, block_size), source.dtype
    else:
        analyser = Analyser.of_checkpoint(source, dtype, block_size)
    cfg = analyser.config
    buckets = make_buckets(
        cfg.max_position_embeddings, token_budget=token_budget, block_size=block_size,
        window=cfg.window,
    )  # fmt: skip
    work = {w.__name__: w(cfg.vocab_size) for w in (workloads.w1, workloads.w2)}
    limit = buckets.max_sequence(cfg.max_position_embeddings)
    skipped = {
        name: f"its {max(map(len, w.sequences))}-token sequences exceed the {limit} this model "
        "accepts"
        for name, w in work.items()
        if max(map(len, w.sequences)) > limit
    }
    laid_out = {
        name: workloads.batches(w, buckets, token_budget)
        for name, w in work.items()
        if name not in skipped
    }
    costs = {}
    for name, batches in laid_out.items():
        if progress:
            progress(f"{name}: XLA cost analysis of {len(batches)} batches")
        costs[name] = [(b, analyser.batch(b.inputs)) for b in batches]
    largest = max(t for t in buckets.tokens if t <= token_budget)
    rows = buckets.rows_for(largest)[0]
    per_token = analyser.shape((largest, rows, buckets.label_widths[0])).temp_bytes / largest
    report = {
        "model": _model(cfg, dtype, analyser.weight_bytes),
        "activation_bytes_per_token": per_token,
        "workloads": {name: w.description for name, w in work.items()},
        "skipped": skipped,  # workloads the model cannot run, and why
        "batches": {name: [_batch(b, c) for b, c in cs] for name, cs in costs.items()},
        "devices": {},
    }
    for kind in kinds:
        dev = device(kind)
        figures = capacity(cfg, dtype, memory or dev.memory, analyser.weight_bytes)
        report["devices"][kind] = {
            "device": dev.name,
            "source": dev.source,
            "peak_flops": dev.peak[dtype],
            "bandwidth_bytes_per_s": dev.bandwidth,
            **figures,
            "largest_batch_tokens": _largest_batch(figures, per_token, block_size),
            **{name: _estimate(cs, dev, dtype) for name, cs in costs.items()},
        }
    return report


def plan_engine(engine, kinds: Sequence[str]) -> dict:
    """`plan` of a running engine's program on `kinds`, at the engine's token budget and block
    size."""
    config = engine.config
    return plan(
        engine.program, kinds, token_budget=config.token_budget, block_size=config.block_size
    )


def _model(cfg: ModelConfig, dtype: str, weight_bytes: int) -> dict:
    return {
        "family": cfg.family,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "dtype": dtype,
        "weight_bytes": weight_bytes,
    }


def _batch(batch, cost: Cost) -> dict:
    inputs = batch.inputs
    shape = (len(inputs.tokens), len(inputs.score_rows), inputs.label_ids.shape[1])
    return {
        "shape": shape,
        "real_tokens": batch.real_tokens,
        "flops": cost.flops,
        "bytes": cost.bytes,
    }


def _largest_batch(figures: dict, per_token: float, block: int) -> int:
    """Tokens whose activations fit in what the weights and the default pool leave."""
    pool = figures["default_pool_tokens"] * figures["kv_bytes_per_token"]
    free = figures["memory_bytes"] - figures["weight_bytes"] - pool
    return max(0, int(free / per_token) // block * block)


def _estimate(costs: list, dev: Device, dtype: str) -> dict:
    """Items/s with each batch at its roofline, and with FLOPs alone (bytes as XLA's CPU
    compiler fuses overstate an accelerator's traffic: the truth lies between the two)."""
    items = sum(len(b.order) for b, _ in costs)
    compute = sum(c.flops for _, c in costs) / dev.peak[dtype]
    seconds = sum(max(c.flops / dev.peak[dtype], c.bytes / dev.bandwidth) for _, c in costs)
    return {
        "seconds": seconds,
        "items_per_s": items / seconds,
        "compute_only_items_per_s": items / compute,
        "compute_bound_share": compute / seconds,
    }
