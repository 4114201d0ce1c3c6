"""`engine.plan`: batch costs from XLA's cost analysis taken apart by loop, the memory figures,
the W1/W2 roofline estimates and the command line."""

import json

import msgspec
import numpy as np
import pytest

from engine.device.kv_pool import DEFAULT_POOL_TOKENS
from engine.device.program import DeviceProgram
from engine.host import packing, planning
from engine.host.buckets import make_buckets
from engine.host.packing import empty_batch
from engine.loaders import Checkpoint, load_checkpoint
from engine.models.rows import HEAD_ROWS, steps
from engine.plan import PUBLISHED, capacities, capacity, plan
from engine.plan.__main__ import main, parse_bytes
from engine.plan.costs import Analyser, _compiled_cost

BLOCK = 64


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def checkpoint(request, tiny_checkpoints):
    return load_checkpoint(tiny_checkpoints[request.param])


@pytest.fixture(scope="module")
def analyser(checkpoint):
    return Analyser.of_checkpoint(checkpoint, "float32", BLOCK)


def whole_model_cost(checkpoint, shape):
    """XLA's cost of the whole model, layers unrolled and attention left out."""
    program = DeviceProgram(checkpoint, dtype="float32", dense="xla", kv_cache_bytes=0)
    batch = empty_batch(*shape, BLOCK, program.config.window)
    return _compiled_cost(program.config, program.params, batch)[0], program


def test_the_parts_add_up_to_the_whole_model(checkpoint, analyser) -> None:
    shape = (256, 8, 4)
    whole, program = whole_model_cost(checkpoint, shape)
    parts = analyser.shape(shape)
    layers = checkpoint.config.num_layers
    assert layers >= 2
    summed = parts.outside.plus(parts.layer, layers)
    # Gemma 3's sliding and global layers differ by their RoPE tables' elementwise work only
    assert summed.flops == pytest.approx(
        whole.flops, rel=1e-6 if not checkpoint.config.window else 1e-3
    )
    assert summed.bytes == pytest.approx(whole.bytes, rel=0.05)
    assert analyser.weight_bytes == program.weight_bytes


def test_a_loaded_program_is_analysed_as_its_checkpoint(checkpoint) -> None:
    program = DeviceProgram(checkpoint, dtype="bfloat16", kv_cache_bytes=0)  # native dense too
    xla = DeviceProgram(checkpoint, dtype="bfloat16", dense="xla", kv_cache_bytes=0)
    of_program = Analyser.of_program(program, BLOCK)
    of_checkpoint = Analyser.of_checkpoint(checkpoint, "bfloat16", BLOCK)
    assert of_program.weight_bytes == program.weight_bytes  # the native head is its own copy
    assert of_checkpoint.weight_bytes == xla.weight_bytes
    shape = (256, 8, 4)
    assert of_program.shape(shape) == of_checkpoint.shape(shape)


def test_a_layer_costs_at_least_its_matmuls(analyser) -> None:
    c = analyser.config
    t = 512
    projections = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    projections += (
        c.num_heads * c.head_dim * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    matmuls = 2 * t * projections
    flops = analyser.shape((t, 16, 4)).layer.flops
    assert matmuls <= flops <= 1.5 * matmuls  # plus norms, RoPE, the activation


def batch_of(cfg, seqs, budget=1024):
    """All of `seqs` in one packed batch."""
    buckets = make_buckets(cfg.max_position_embeddings, token_budget=budget, window=cfg.window)
    groups = planning.group_by_prefix(seqs)
    return packing.pack(seqs, [[1, 2]] * len(seqs), groups, buckets)


def test_attention_is_counted_from_the_block_schedule(analyser) -> None:
    c = analyser.config
    short = batch_of(c, [[5] * 40 + [i] for i in range(6)])
    long = batch_of(c, [[5] * 600 + [i] * 20 for i in range(6)])
    costs = [analyser.batch(b.inputs) for b in (short, long)]
    shapes = [analyser.shape(tuple(_shape(b))) for b in (short, long)]
    attention = [
        cost.flops - (p.outside.flops + c.num_layers * p.layer.flops)
        for cost, p in zip(costs, shapes, strict=True)
    ]
    pair = 4 * BLOCK * BLOCK * c.head_dim * c.num_heads
    for batch, flops in zip((short, long), attention, strict=True):
        metas = (
            [batch.inputs.meta] if not c.window else [batch.inputs.meta, batch.inputs.window_meta]
        )
        sliding = sum(c.sliding_layers) if c.window else 0
        layers = [c.num_layers - sliding, sliding][: len(metas)]
        pairs = sum(n * int(np.sum(m.block_count)) for n, m in zip(layers, metas, strict=True))
        assert flops == pytest.approx(pair * pairs)
    assert attention[1] > 10 * attention[0]


def _shape(batch):
    i = batch.inputs
    return len(i.tokens), len(i.score_rows), i.label_ids.shape[1]


def test_score_rows_past_one_step_cost_more_steps(analyser) -> None:
    c = analyser.config
    seqs = [[7] * 8 + [i % 300 + 1, i // 300 + 1] for i in range(300)]  # 300 score rows
    batch = batch_of(c, seqs)
    t, s, labels = _shape(batch)
    assert s > 2 * HEAD_ROWS and batch.inputs.row_count == 300
    parts = analyser.shape((t, s, labels))
    # a step: the last layer's projection and MLP, and the head, on HEAD_ROWS rows
    matrices = {
        "o": c.num_heads * c.head_dim * c.hidden_size,
        "gate_up": 2 * c.hidden_size * c.intermediate_size,
        "down": c.intermediate_size * c.hidden_size,
        "head": c.hidden_size * c.vocab_size,
    }
    matmuls = 2 * HEAD_ROWS * sum(matrices.values())
    assert matmuls <= parts.row_step.flops <= 1.1 * matmuls  # plus norms, the log-softmax
    assert parts.row_step.bytes >= 4 * sum(matrices.values())  # f32 weights read again
    without_attention = parts.outside.plus(parts.layer, c.num_layers)
    extra = analyser.batch(batch.inputs).flops - without_attention.flops
    attention = analyser._attention(batch.inputs).flops
    # the real rows' steps: padding rows are not computed
    assert extra == pytest.approx((steps(300) - 1) * parts.row_step.flops + attention)
    small = analyser.shape((t, HEAD_ROWS, labels))  # one step at most: none counted past it
    assert small.row_step == (0.0, 0.0)


def test_capacity_figures(analyser) -> None:
    c = analyser.config
    per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2
    figures = capacity(c, "bfloat16", 16 * 2**30, 10**9)
    assert figures == {
        "memory_bytes": 16 * 2**30,
        "weight_bytes": 10**9,
        "kv_bytes_per_token": per_token,
        "default_pool_tokens": min(2 * 2**30 // per_token, DEFAULT_POOL_TOKENS),
        "capacity_tokens": (16 * 2**30 - 10**9) // per_token,
    }
    assert capacity(c, "bfloat16", 2**20, 2**21)["capacity_tokens"] == 0
    assert list(capacities(c, "float32", 0)) == ["cpu", *PUBLISHED]


def longer(checkpoint, context: int = 4096) -> Checkpoint:
    """The checkpoint with a longer context (the tiny ones take 512 positions)."""
    cfg = msgspec.structs.replace(checkpoint.config, max_position_embeddings=context)
    return Checkpoint(cfg, checkpoint.params, checkpoint.tokenizer, checkpoint.source)


def test_the_plan_estimates_each_device(checkpoint) -> None:
    budget = 1024  # below W2's 2,020-token sequences: its prompt is chunked, then cached
    report = plan(longer(checkpoint), ["h100", "tpu-v5e"], dtype="bfloat16", token_budget=budget)
    assert report["model"]["layers"] == checkpoint.config.num_layers and not report["skipped"]
    w2 = report["batches"]["w2"]
    assert sum(b["real_tokens"] for b in w2) < 2000 + 500 * 20 + budget  # the prompt once
    assert len(w2) >= 10 and all(b["real_tokens"] <= budget for b in w2)
    for kind in ("h100", "tpu-v5e"):
        d = report["devices"][kind]
        for name, items in (("w1", 64), ("w2", 500)):
            e = d[name]
            assert e["items_per_s"] == pytest.approx(items / e["seconds"])
            assert e["compute_only_items_per_s"] >= e["items_per_s"]
            assert 0 < e["compute_bound_share"] <= 1
        assert d["largest_batch_tokens"] % BLOCK == 0 and d["largest_batch_tokens"] > 0
    # the faster chip, the faster estimate, by the ratio of their peaks when compute-bound
    h100, v5e = (
        report["devices"][k]["w2"]["compute_only_items_per_s"] for k in ("h100", "tpu-v5e")
    )
    assert h100 / v5e == pytest.approx(PUBLISHED["h100"].peak["bfloat16"] / 197e12)


def test_a_workload_longer_than_the_model_takes_is_skipped(checkpoint) -> None:
    report = plan(checkpoint, ["h200"], token_budget=512)
    assert list(report["skipped"]) == ["w2"] and "512 this model accepts" in report["skipped"]["w2"]
    assert "w2" not in report["devices"]["h200"] and "w1" in report["devices"]["h200"]


def test_the_command_line(tiny_checkpoints, tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    path = str(tiny_checkpoints["qwen3"])
    args = ["--model", path, "--device", "h200", "--memory", "1GiB", "--json", str(out)]
    args += ["--token-budget", "2048"]
    report = main(args)
    printed = capsys.readouterr().out
    assert "h200" in printed and "KV B/tok" in printed
    assert json.loads(out.read_text())["devices"]["h200"]["memory_bytes"] == 2**30
    assert report["devices"]["h200"]["memory_bytes"] == 2**30
    with pytest.raises(SystemExit):
        main(["--model", path, "--device", "a100"])


@pytest.mark.parametrize(
    "text,value", [("16GiB", 16 * 2**30), ("512M", 512 * 2**20), ("1000", 1000), ("1.5k", 1536)]
)
def test_sizes_in_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_a_size_that_is_not_one_is_refused() -> None:
    with pytest.raises(Exception, match="not a size"):
        parse_bytes("lots")
