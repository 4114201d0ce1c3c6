"""The REPL's tables and numbers (`engine.repl.format`)."""

import pytest

from engine.repl.format import clip, format_probability, format_rerank, format_scores
from engine.repl.session import Score
from engine.results import RerankHit


def test_probabilities_keep_seven_significant_digits():
    assert format_probability(0.0123456789) == "0.012345679"
    assert format_probability(1.0) == "1.000000000"
    assert format_probability(0.000123456789) == "1.234568e-04"
    for p in [0.5, 0.00123, 0.000999, 1e-9]:
        assert float(format_probability(p)) == pytest.approx(p, rel=1e-6)


def test_clip_escapes_control_characters_and_truncates():
    assert clip("a\tb", 10) == "a\\tb"
    assert clip("x" * 30, 10) == "x" * 9 + "…"
    assert clip("short", 10) == "short"


def test_score_table_has_fixed_columns_and_one_row_per_item():
    action = Score(
        "q", ["first", "a much longer item " * 10], [5, 7], ["'yes'", "#7"], False, False
    )
    lines = format_scores(action, [[0.5, 0.25], [0.0001, 1.0]], columns=80).splitlines()
    assert lines == [
        "  #         'yes'            #7  item",
        "  0   0.500000000   0.250000000  first",
        "  1  1.000000e-04   1.000000000  " + ("a much longer item " * 3)[:45] + "…",
    ]
    assert all(len(line) <= 80 for line in lines)


def test_rerank_table_lists_hits_in_order():
    hits = [RerankHit(index=1, relevance_score=0.75), RerankHit(index=0, relevance_score=0.125)]
    assert format_rerank(["doc a", "doc b", "doc c"], hits, columns=80).splitlines() == [
        "rank  index     relevance  document",
        "   1      1   0.750000000  doc b",
        "   2      0   0.125000000  doc a",
    ]
