"""The soak's comparisons: an answer under load is correct only when it equals the same body's
answer sent alone, within the route's tolerance and nowhere else."""

import numpy as np

from bench.soak_bodies import json_gap, rerank_gap, score_gap, values_gap


def test_numbers_differ_within_the_tolerance_and_nothing_else_may():
    want = {"object": "list", "data": [{"embedding": [0.5, -0.25], "index": 0}], "id": "a"}
    same = {"object": "list", "data": [{"embedding": [0.5 + 4e-6, -0.25], "index": 0}], "id": "b"}
    assert abs(json_gap(same, want) - 4e-6) < 1e-12
    assert values_gap({}, want, same, "float32") < 1.0  # the id is volatile
    moved = {"object": "list", "data": [{"embedding": [0.5 + 2e-5, -0.25], "index": 0}], "id": "a"}
    assert values_gap({}, want, moved, "float32") > 1.0
    for wrong in (
        {"object": "lists", "data": want["data"], "id": "a"},  # a string
        {"object": "list", "data": [], "id": "a"},  # a length
        {"object": "list", "data": [{"embedding": [0.5, -0.25]}], "id": "a"},  # a key
        {"object": "list", "data": [{"embedding": [0.5, True], "index": 0}], "id": "a"},  # a type
    ):
        assert json_gap(wrong, want) == np.inf


def test_a_sparse_vector_missing_a_tiny_weight_differs_by_that_weight():
    want = [{"index": 3, "value": 0.5}, {"index": 9, "value": 2e-6}]
    got = [{"index": 3, "value": 0.5 + 1e-6}]
    assert abs(json_gap(got, want) - 2e-6) < 1e-12
    assert json_gap([{"index": 4, "value": 0.5}], want) == 0.5


def test_numbers_above_one_differ_relatively():
    assert abs(json_gap([3.0 + 2.4e-5], [3.0]) - 0.8e-5) < 1e-12
    assert abs(json_gap([0.5 + 2e-6], [0.5]) - 2e-6) < 1e-12


def test_label_scores_compare_in_log_space():
    want = {"scores": [[0.5, 1e-6]]}
    assert score_gap({}, want, {"scores": [[0.5, 1.00001e-6]]}, "float32") < 1.0
    assert score_gap({}, want, {"scores": [[0.5, 1.1e-6]]}, "float32") > 1.0  # 5e-8 apart
    assert score_gap({}, want, {"scores": [[0.5]]}, "float32") == np.inf


def _answer(hits, echo=None):
    return {"results": [{"index": i, "relevance_score": s, "document": echo} for i, s in hits]}


def test_a_rerank_is_checked_by_index_order_cut_and_echo():
    body = {"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": False}
    alone = _answer([(2, 0.9), (0, 0.5), (1, 0.4999999)])  # every document, sent without top_n
    assert rerank_gap(body, alone, _answer([(2, 0.9), (0, 0.5)]), "float32") < 1.0
    # a near tie may take either place; a clear loser may not
    assert rerank_gap(body, alone, _answer([(2, 0.9), (1, 0.4999999)]), "float32") < 1.0
    body3 = body | {"top_n": 1}
    assert rerank_gap(body3, alone, _answer([(0, 0.5)]), "float32") > 1.0  # 0.9 left out
    assert rerank_gap(body, alone, _answer([(0, 0.5), (2, 0.9)]), "float32") == np.inf  # order
    assert rerank_gap(body, alone, _answer([(2, 0.9)]), "float32") == np.inf  # top_n
    echoed = {"results": [{"index": 2, "relevance_score": 0.9, "document": {"text": "c"}}]}
    assert rerank_gap(body3 | {"return_documents": True}, alone, echoed, "float32") < 1.0
    wrong = {"results": [{"index": 2, "relevance_score": 0.9, "document": {"text": "a"}}]}
    assert rerank_gap(body3 | {"return_documents": True}, alone, wrong, "float32") == np.inf
