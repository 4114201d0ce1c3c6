"""The Engine end to end on a tiny model: concurrency, cancellation, overload, faults, shutdown."""

import logging
import threading

import numpy as np
import pytest
import trio

import _native
from engine import (
    EngineClosed,
    EngineConfig,
    EngineError,
    EngineOverloaded,
    InputTooLarge,
    InvalidInput,
    Unsupported,
    open_engine,
)
from engine import engine as engine_module
from tests.conftest import inject_faults


def config(path, **overrides) -> EngineConfig:
    base = dict(
        model=path,
        dtype="float32",
        token_budget=512,
        compile_cache_dir=None,
        progress=False,
        precompile=False,
    )
    return EngineConfig(**{**base, **overrides})


def workload(rng, n):
    """Mixed requests: shared and unshared queries, 1-12 items, text and token ids."""
    shared = [int(t) for t in rng.integers(0, 384, 40)]
    calls = []
    for i in range(n):
        query = shared if i % 3 else [int(t) for t in rng.integers(0, 384, rng.integers(1, 30))]
        items = [
            [int(t) for t in rng.integers(0, 384, rng.integers(1, 20))]
            for _ in range(rng.integers(1, 13))
        ]
        labels = [int(t) for t in rng.integers(0, 384, rng.integers(1, 4))]
        calls.append((query, items, labels, bool(i % 5 == 0), bool(i % 7 == 0)))
    calls.append(
        (
            "Is the river near the house?",
            [" yes it is", " the stone is green"],
            [3, 4],
            False,
            False,
        )
    )
    return calls


def run(fn, *args):
    return trio.run(fn, *args)


def test_concurrent_calls_equal_sequential_scoring(tiny_path, reference):
    calls = workload(np.random.default_rng(0), 200)
    expected = [
        reference.score(q, it, lab, apply_softmax=sm, item_first=f) for q, it, lab, sm, f in calls
    ]
    results = [None] * len(calls)

    async def main():
        async with open_engine(config(tiny_path)) as engine:

            async def one(i, q, it, lab, sm, f):
                results[i] = await engine.score(q, it, lab, apply_softmax=sm, item_first=f)

            async with trio.open_nursery() as nursery:
                for i, call in enumerate(calls):
                    nursery.start_soon(one, i, *call)
            stats = engine.stats()
            assert stats.in_flight == 0 and stats.queue_depth == 0
            assert stats.prefix_tokens_saved > 0
            assert stats.batches < len(calls)  # requests share batches

    run(main)
    for got, want, call in zip(results, expected, calls, strict=True):
        assert got.prompt_tokens == sum(
            map(len, reference.sequences(call[0], call[1], item_first=call[4]))
        )
        np.testing.assert_allclose(np.log(got.scores), np.log(want), atol=1e-5)


def _tables_empty(engine):
    assert engine.idle() and engine.scheduler.idle()
    assert engine.scheduler.queued_tokens == 0 and engine.stats().in_flight == 0


def test_cancelling_half_leaves_the_rest_correct_and_nothing_behind(tiny_path, reference):
    calls = workload(np.random.default_rng(1), 100)
    results = {}

    async def main():
        async with open_engine(config(tiny_path)) as engine:
            first = trio.Event()

            async def one(i, q, it, lab, sm, f, scope):
                with scope:
                    results[i] = await engine.score(q, it, lab, apply_softmax=sm, item_first=f)
                    first.set()

            scopes = [trio.CancelScope() for _ in calls]
            async with trio.open_nursery() as nursery:
                for i, call in enumerate(calls):
                    nursery.start_soon(one, i, *call, scopes[i])
                await first.wait()  # some done, some in a batch, most queued
                for scope in scopes[::2]:
                    scope.cancel()
            await engine.wait_idle()  # batches already handed to the runner come back
            _tables_empty(engine)

    run(main)
    assert set(results) >= set(range(1, len(calls), 2))
    assert len(set(range(0, len(calls), 2)) - set(results)) >= 25  # really cancelled mid-way
    for i in range(1, len(calls), 2):
        q, it, lab, sm, f = calls[i]
        want = reference.score(q, it, lab, apply_softmax=sm, item_first=f)
        np.testing.assert_allclose(np.log(results[i].scores), np.log(want), atol=1e-5)


def test_overload_fails_fast_then_recovers(tiny_path):
    outcomes = []

    async def main():
        async with open_engine(config(tiny_path, max_queued_requests=8)) as engine:

            async def one():
                try:
                    await engine.score([1, 2, 3], [[4], [5, 6]], [7])
                    outcomes.append("ok")
                except EngineOverloaded as e:
                    outcomes.append(str(e))

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for _ in range(20):
                        nursery.start_soon(one)
            after = await engine.score([1, 2, 3], [[4]], [7])
            assert len(after.scores) == 1
            _tables_empty(engine)

    run(main)
    assert outcomes.count("ok") == 8
    assert outcomes.count("8 requests in flight (limit 8)") == 12


def test_token_bound_rejects_with_overload(tiny_path):
    outcomes = []

    async def main():
        async with open_engine(config(tiny_path, max_queued_tokens=100)) as engine:
            with pytest.raises(InputTooLarge, match="items: 120 tokens exceed the queue limit"):
                await engine.score([1] * 60, [[2] * 60], [7])
            held, release = threading.Event(), threading.Event()

            def hold(inputs):  # the device runs nothing until the burst has been answered
                held.set()
                release.wait(120)

            async def one():
                try:
                    await engine.score([1] * 15, [[2] * 15], [7])
                    outcomes.append("ok")
                except EngineOverloaded as e:
                    outcomes.append(str(e))

            faulty = inject_faults(engine, hold)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(engine.score, [9] * 10, [[8] * 10], [7])  # on the device
                    await trio.to_thread.run_sync(held.wait, 120)
                    for _ in range(10):
                        nursery.start_soon(one)
                    with trio.fail_after(120):  # those that did not fit are answered at once
                        while len(outcomes) < 7:
                            await trio.sleep(0.01)
                    release.set()
            finally:
                release.set()
                engine.runner.program = faulty.program
            assert len((await engine.score([1] * 10, [[2] * 10], [7])).scores) == 1
            _tables_empty(engine)

    run(main)
    # a burst of ten 30-token requests behind a busy device, against a bound of 100 tokens
    assert outcomes.count("ok") == 3
    assert sum(o.startswith("queue full:") for o in outcomes) == 7


def test_a_failing_batch_fails_only_its_requests(tiny_path):
    async def main():
        async with open_engine(config(tiny_path)) as engine:
            calls = []

            def flaky(inputs):
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("injected device fault")

            inject_faults(engine, flaky)
            with pytest.raises(EngineError, match="device step failed: RuntimeError: injected"):
                await engine.score([1, 2], [[3]], [4])
            ok = await engine.score([1, 2], [[3], [5]], [4])
            assert len(ok.scores) == 2
            assert engine.stats().failed_batches == 1
            _tables_empty(engine)

    run(main)


def test_invalid_requests_fail_alone(tiny_path):
    async def main():
        async with open_engine(config(tiny_path, max_items_per_request=4)) as engine:
            async with trio.open_nursery() as nursery:
                errors = []

                async def bad(q, it, lab, exc, match):
                    with pytest.raises(exc, match=match):
                        await engine.score(q, it, lab)
                    errors.append(match)

                nursery.start_soon(bad, "text", [[1]], [1], ValueError, "query/items")
                nursery.start_soon(bad, [1], [[2]], [999], ValueError, "label_token_ids")
                nursery.start_soon(bad, [1], [[2]] * 5, [1], InputTooLarge, "limit of 4")
                nursery.start_soon(bad, [1] * 600, [[2]], [1], InputTooLarge, "exceeds the model")
                good = await engine.score("a query", ["an item"], [1])
            assert len(errors) == 4 and len(good.scores) == 1
            _tables_empty(engine)

    run(main)


def test_timings_are_reported(tiny_path):
    async def main():
        async with open_engine(config(tiny_path)) as engine:
            result = await engine.score("query", ["one", "two"], [1, 2])
        t = result.timings
        assert t.total >= t.queue >= 0
        assert t.tokenize > 0 and t.device > 0 and t.batch_build > 0
        assert t.total >= t.device
        # the two splits: batch building into planning and packing, the device call into its
        # dispatch and the wait for outputs
        assert t.plan > 0 and t.pack > 0 and t.plan + t.pack == pytest.approx(t.batch_build)
        assert 0 < t.dispatch <= t.device

    run(main)


def test_shutdown_with_work_in_flight_ends_every_caller(tiny_path):
    """The engine closes while its device is held busy on the first batch: every caller is
    answered EngineClosed by the close itself, since no batch can finish until all 40 have."""
    outcomes = []
    held, release = threading.Event(), threading.Event()

    def hold(inputs):
        held.set()
        release.wait(120)

    async def main():
        with trio.fail_after(120):
            async with trio.open_nursery() as callers, open_engine(config(tiny_path)) as engine:
                faulty = inject_faults(engine, hold)

                async def one(i):
                    try:
                        await engine.score([1, 2, i % 300], [[3] * 50] * 64, [4])
                        outcomes.append("ok")
                    except EngineClosed:
                        outcomes.append("closed")
                    if len(outcomes) == 40:
                        release.set()  # only now may the device finish its batch

                for i in range(40):
                    callers.start_soon(one, i)
                await trio.to_thread.run_sync(held.wait, 120)
                while engine.stats().in_flight < 40:  # every caller's request is in
                    await trio.sleep(0.01)
            engine.runner.program = faulty.program
            with pytest.raises(EngineClosed):
                await engine.score([1], [[2]], [3])

    try:
        run(main)
    finally:
        release.set()
    assert outcomes == ["closed"] * 40


def test_rerank_orders_by_yes_probability(tiny_path, reference):
    docs = ["the river is green", "quick paper", "stone house light"]

    async def main():
        async with open_engine(config(tiny_path)) as engine:
            return engine, await engine.rerank("where is the house?", docs, top_n=2)

    engine, result = run(main)
    t = engine.template
    yes, no = (
        reference.tokenizer.encode(x, add_special_tokens=False).ids[0] for x in (t.yes, t.no)
    )
    want = reference.score(
        t.query_text("where is the house?", None),
        [t.document_text(d) for d in docs],
        [yes, no],
        apply_softmax=True,
    )
    order = sorted(range(3), key=lambda i: -want[i][0])[:2]
    assert [h.index for h in result.results] == order
    np.testing.assert_allclose(
        [h.relevance_score for h in result.results], [want[i][0] for i in order], rtol=1e-4
    )


def test_rerank_truncates_in_the_engine_and_names_documents(tiny_path, reference):
    long_doc = "stone house light " * 200  # far over the tiny model's 512-token context
    docs = ["the river is green", long_doc]

    async def main():
        async with open_engine(config(tiny_path, max_items_per_request=2)) as engine:
            with pytest.raises(InputTooLarge, match=r"^documents\[1\]: sequence of") as big:
                await engine.rerank("where?", docs)
            with pytest.raises(InputTooLarge, match=r"^documents: 3 items exceed the limit of 2"):
                await engine.rerank("where?", docs + ["x"], truncate=True)
            with pytest.raises(InvalidInput, match=r"^max_tokens_per_doc: must be a positive"):
                await engine.rerank("where?", docs, max_tokens_per_doc=0)
            cut = await engine.rerank("where?", docs, max_tokens_per_doc=5)
            fit = await engine.rerank("where?", docs, truncate=True)
            return engine, big.value.field, cut, fit

    engine, field, cut, fit = run(main)
    assert field == "documents[1]"
    t, tok = engine.template, engine.tokenizer
    yes_no = [tok.encode(x, add_special_tokens=False).ids[0] for x in (t.yes, t.no)]
    text = t.query_text("where?", None)
    cut_ids = []  # each sequence's own ids, its document's tokens past the first 5 dropped
    for d in docs:
        enc = tok.encode(text + t.document_text(d))
        start, end = len(text), len(text) + len(d)
        own = [i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start and b > a]
        cut_ids.append([x for i, x in enumerate(enc.ids) if i not in own[5:]])
    want = reference.score([], cut_ids, yes_no, apply_softmax=True)
    got = {h.index: h.relevance_score for h in cut.results}
    np.testing.assert_allclose([got[0], got[1]], [w[0] for w in want], rtol=1e-4)
    assert fit.prompt_tokens <= 2 * engine.max_sequence_tokens and len(fit.results) == 2


def _yes_no(engine) -> list[int]:
    t, tok = engine.template, engine.tokenizer
    return [tok.encode(x, add_special_tokens=False).ids[0] for x in (t.yes, t.no)]


def test_raw_rerank_scores_are_the_yes_no_logit(tiny_path, reference):
    docs = ["the river is green", "quick paper", "stone house light"]

    async def main():
        async with open_engine(config(tiny_path)) as engine:
            raw = await engine.rerank("where is the house?", docs, raw_scores=True)
            soft = await engine.rerank("where is the house?", docs)
            return engine, raw, soft

    engine, raw, soft = run(main)
    t = engine.template
    p = reference.score(
        t.query_text("where is the house?", None),
        [t.document_text(d) for d in docs],
        _yes_no(engine),
    )  # exp(log-probs) under the full vocabulary
    want = {i: np.log(p[i][0]) - np.log(p[i][1]) for i in range(3)}
    assert [h.index for h in raw.results] == [h.index for h in soft.results]
    got = {h.index: h.relevance_score for h in raw.results}
    np.testing.assert_allclose([got[i] for i in range(3)], [want[i] for i in range(3)], atol=1e-4)
    sigmoid = {h.index: 1 / (1 + np.exp(-h.relevance_score)) for h in raw.results}
    for h in soft.results:
        assert sigmoid[h.index] == pytest.approx(h.relevance_score, abs=1e-6)


def test_score_pairs_equal_rerank_by_query_and_keep_pair_order(tiny_path):
    queries = ["where?", "what?", "where?", "what?", "who?"]
    docs = ["the river", "quick paper", "stone house", "green light", "the river"]

    async def main():
        async with open_engine(config(tiny_path)) as engine:
            pairs = await engine.score_pairs(queries, docs)
            by_query = {
                q: await engine.rerank(q, [d for p, d in zip(queries, docs, strict=True) if p == q])
                for q in dict.fromkeys(queries)
            }
            long = "stone house light " * 200  # over the tiny model's context
            with pytest.raises(InputTooLarge, match=r"^documents\[3\]: sequence of"):
                await engine.score_pairs(queries, ["a", "b", "c", long, "e"])
            with pytest.raises(InvalidInput, match=r"^queries/documents: 2 queries for 1"):
                await engine.score_pairs(["a", "b"], ["c"])
            return pairs, by_query

    pairs, by_query = run(main)
    for q, result in by_query.items():
        index = [i for i, p in enumerate(queries) if p == q]
        for hit in result.results:
            assert pairs.scores[index[hit.index]] == [pytest.approx(hit.relevance_score, abs=1e-6)]
    assert pairs.prompt_tokens == sum(r.prompt_tokens for r in by_query.values())


def test_an_empty_item_list_is_answered_with_no_scores(tiny_path, reference):
    async def main():
        async with open_engine(config(tiny_path)) as engine:
            none = await engine.score("q", [], [1, 2])
            alone = await engine.score("a query", [""], [1, 2])
            no_query = await engine.score([], [[5, 6]], [1])
            return none, alone, no_query

    none, alone, no_query = run(main)
    assert (none.scores, none.prompt_tokens) == ([], 0)
    np.testing.assert_allclose(alone.scores, reference.score("a query", [""], [1, 2]), rtol=1e-5)
    np.testing.assert_allclose(no_query.scores, reference.score([5], [[6]], [1]), rtol=1e-5)


def test_a_grid_compiling_in_the_background_serves_at_once_and_equal(tiny_path, reference):
    """Ready before its grid is compiled; the scores equal one-by-one scoring before and after,
    and every shape of the grid ends up compiled once."""
    cfg = config(tiny_path, precompile=True, precompile_in_background=True, token_budget=1024)
    query, items, labels = [5, 6, 7, 8], [[9, 10], [11], [12, 13, 14]], [3, 4]
    expected = reference.score(query, items, labels)

    async def main():
        async with open_engine(cfg) as engine:
            scored = [await engine.score(query, items, labels)]
            await engine.grid_compiled()
            assert engine.stats().grid_compiled
            grid = set(engine.buckets.grid(cfg.token_budget))
            state = engine.runner
            assert grid <= state.compiled and state.stats.compiles == len(state.compiled)
            scored.append(await engine.score(query, items, labels))
        for result in scored:
            np.testing.assert_allclose(np.log(result.scores), np.log(expected), atol=1e-5)

    run(main)


def test_bucket_settings_are_checked_and_used():
    b = EngineConfig(token_budget=256, block_size=32).buckets(1000)
    assert b.tokens == (64, 128, 256, 512, 1024) and b.block_size == 32
    custom = EngineConfig(token_budget=256, token_buckets=(128, 256, 384), label_widths=(8, 2))
    assert custom.buckets(4096).tokens == (128, 256, 384)
    assert custom.buckets(4096).label_widths == (2, 8)
    assert custom.buckets(4096).max_sequence(4096) == 384
    bad = [
        ({"token_buckets": (128, 100)}, "token_buckets: must be ascending multiples of block_size"),
        ({"token_buckets": (128,)}, r"token_buckets: the largest \(128\) is below token_budget"),
        ({"row_divisors": ()}, "row_divisors: must be positive"),
        ({"label_widths": (0,)}, "label_widths: must be positive"),
        ({"batch_linger_ms": -1.0}, "batch_linger_ms: must be between 0 and 10000"),
        ({"compile_workers": 0}, "compile_workers: must be 1 or more"),
    ]
    for fields, message in bad:
        with pytest.raises(InvalidInput, match=message) as caught:
            EngineConfig(token_budget=256, **fields).buckets(1000)
        assert caught.value.field == next(iter(fields))


@pytest.mark.parametrize("asked", [{}, {"compile_workers": 3}])
def test_the_grid_compiles_as_many_at_once_as_configured(tiny_path, monkeypatch, asked):
    from engine.runner import RunnerState

    seen, warm_up = [], RunnerState.warm_up

    def recording(self, shapes, *, workers, **kwargs):
        seen.append(workers)
        return warm_up(self, shapes, workers=workers, **kwargs)

    monkeypatch.setattr(RunnerState, "warm_up", recording)

    async def main():
        cfg = config(tiny_path, precompile=True, **asked)
        async with open_engine(cfg) as engine:  # by default one at a time
            assert engine.stats().compiles == len(engine.buckets.grid(512))
            assert (await engine.score([1, 2], [[3]], [4])).scores

    run(main)
    assert seen == [asked.get("compile_workers", 1)]


def test_sequences_beyond_the_largest_bucket_are_too_large(tiny_path):
    async def main():
        cfg = config(tiny_path, token_budget=128, token_buckets=(128, 256))
        async with open_engine(cfg) as engine:
            with pytest.raises(InputTooLarge, match="exceeds the model context of 256"):
                await engine.score([1] * 250, [[2] * 10], [3])

    run(main)


def test_a_model_that_cannot_rerank_still_scores(tiny_path, monkeypatch):
    from engine import templates

    broken = templates.PLAIN._replace(yes=" yes indeed")
    monkeypatch.setattr(templates, "template_for", lambda *args: broken)

    async def main():
        async with open_engine(config(tiny_path)) as engine:
            with pytest.raises(Unsupported, match="rerank is unavailable for this model"):
                await engine.rerank("q", ["d"])
            assert len((await engine.score("q", ["d"], [1])).scores) == 1

    run(main)


def test_a_build_without_its_compiled_host_paths_is_warned_of(monkeypatch, caplog):
    monkeypatch.setattr(_native, "COMPILED", False)
    with caplog.at_level(logging.WARNING, logger="engine"):
        engine_module.warn_if_host_paths_uncompiled()
    assert "the host paths run their pure-Python forms" in caplog.text
    caplog.clear()
    monkeypatch.setattr(_native, "COMPILED", True)
    with caplog.at_level(logging.WARNING, logger="engine"):
        engine_module.warn_if_host_paths_uncompiled()
    assert caplog.records == []
