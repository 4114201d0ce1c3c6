"""The REPL's loop (`engine.repl.loop`) over a fake engine."""

import trio

from engine import EngineOverloaded, EngineStats, RerankHit, RerankResult, ScoreResult
from engine.messages import Timings
from engine.repl.loop import serve
from engine.repl.session import Session
from tests.test_repl_support import fake_encode, ready


class FakeEngine:
    """Scores each item by its length; fails on an item "bad" and when asked to be overloaded."""

    def __init__(self):
        self.calls = []

    async def score(self, query, items, labels, *, apply_softmax, item_first):
        self.calls.append((query, items, labels, apply_softmax, item_first))
        if "bad" in items:
            raise ValueError("items[0]: too bad")
        if "busy" in items:
            raise EngineOverloaded("queue full")
        return ScoreResult(
            scores=[[len(it) / 100] * len(labels) for it in items],
            prompt_tokens=7,
            cached_tokens=3,
            timings=Timings(total=0.002),
        )

    async def rerank(self, query, documents, *, top_n, instruction):
        hits = sorted(
            (RerankHit(index=i, relevance_score=len(d) / 100) for i, d in enumerate(documents)),
            key=lambda h: -h.relevance_score,
        )
        return RerankResult(results=hits[:top_n], prompt_tokens=9, timings=Timings())

    def stats(self):
        return EngineStats(**dict.fromkeys(EngineStats.__struct_fields__, 0))


def run_serve(lines: list[str]) -> tuple[FakeEngine, list[str], list[str], list[str]]:
    """Serve `lines` then end of input; the engine, the prompts, what was written, the errors."""
    engine, prompts, out, errors = FakeEngine(), [], [], []
    pending = iter(lines)

    def read_line(prompt):
        prompts.append(prompt)
        return next(pending, None)

    trio.run(serve, engine, ready(Session(fake_encode, 100)), read_line, out.append, errors.append)
    return engine, prompts, out, errors


def test_serve_prints_tables_and_keeps_going_after_errors():
    engine, prompts, out, errors = run_serve(
        [":bogus", "abc", "bad", "", "busy", "", "abcd", "", ":rerank", "xx", "xxxx", "", ":stats"]
    )
    assert errors == [
        "error: unknown command :bogus (:help lists the commands)",
        "error: items[0]: too bad",
        "error: queue full",
    ]
    table, footer = out[0].rsplit("\n", 1)
    assert table.splitlines()[1] == "  0   0.040000000   0.040000000  abcd"
    assert footer == "1 items, 7 prompt tokens (3 cached), 2.0 ms"
    assert out[1] == "rerank: on"
    assert out[2].splitlines()[1:3] == [
        "   1      1   0.040000000  xxxx",
        "   2      0   0.020000000  xx",
    ]
    assert out[3].startswith("in_flight:")
    assert [c[1] for c in engine.calls] == [["abc", "bad"], ["busy"], ["abcd"]]
    assert prompts[:3] == ["score> ", "score> ", "score[1]> "]


def test_serve_scores_pending_items_at_end_of_input_and_stops_at_quit():
    engine, _, out, _ = run_serve(["tail item"])
    assert engine.calls == [("the query", ["tail item"], [5, 7], False, False)]
    assert "tail item" in out[0]
    engine, prompts, _, _ = run_serve([":quit", "never read", ""])
    assert engine.calls == [] and len(prompts) == 1
