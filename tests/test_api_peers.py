"""The request/response assertions of the peers' own tests, ported to run against this server on
the tiny model: SGLang's score and rerank tests (`test_openai_server.py`, `test_score_api.py`,
`test_serving_rerank.py`), vLLM's score, rerank and tokenizer tests (`test_online_score.py`,
`test_cross_encoder_online.py`, `test_qwen3_reranker_online.py`, `test_max_tokens_per_doc.py`,
`test_protocol.py`, `test_tokenization.py`), and TEI's OpenAPI document for `/rerank`, `/info`,
`/tokenize` and `/decode`. Where a peer asserts a value of its own model, the relation it stands
for is asserted, against one-by-one reference scoring of this model."""

import math

import numpy as np
import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import settings_from_env
from tests.test_api_support import serving, tiny_env

Q = "What is the capital of France?"
DOCS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris.", "Horses eat hay."]
QS = ["What is the capital of France?", "What is the capital of Germany?"]
DS = ["The capital of France is Paris.", "The capital of Germany is Berlin."]


@pytest.fixture(scope="module")
def client(tiny_path):
    yield from serving(create_app(settings_from_env(tiny_env(tiny_path))), "asyncio")


@pytest.fixture(scope="module")
def sglang(tiny_path):
    """The service answering /v1/rerank with SGLang's bare list."""
    env = tiny_env(tiny_path, SCORING_RERANK_FORMAT="sglang")
    yield from serving(create_app(settings_from_env(env)), "asyncio")


def engine_of(client: TestClient):
    return client.app.state.service.host.engine


def relevance(client, reference, query: str, docs: list[str], raw: bool = False) -> list[float]:
    """One-by-one reference relevance of each document: P(yes) / (P(yes) + P(no)), or the
    logit log P(yes) - log P(no)."""
    engine = engine_of(client)
    t, tok = engine.template, engine.tokenizer
    labels = [tok.encode(x, add_special_tokens=False).ids[0] for x in (t.yes, t.no)]
    out = []
    for d in docs:  # one at a time: nothing shared, nothing batched
        (p,) = reference.score(t.query_text(query, None), [t.document_text(d)], labels)
        out.append(math.log(p[0]) - math.log(p[1]) if raw else p[0] / (p[0] + p[1]))
    return out


def post(client, path: str, body: dict, status: int = 200):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


# -- SGLang /v1/score --------------------------------------------------------------------------


def test_sglang_score_text_and_token_input(client, reference):
    tok = engine_of(client).tokenizer
    items = ["Paris", "London", "Berlin"]
    labels = [tok.encode(" " + i, add_special_tokens=False).ids[0] for i in items]
    body = {"query": "The capital of France is", "items": items, "label_token_ids": labels}
    text = post(client, "/v1/score", {**body, "apply_softmax": True, "model": "m"})
    assert text.get("type") != "BadRequestError" and text["object"] == "scoring"
    assert len(text["scores"]) == 3 and all(len(s) == 3 for s in text["scores"])
    assert all(isinstance(x, float) for s in text["scores"] for x in s)
    for s in text["scores"]:
        assert sum(s) == pytest.approx(1.0, abs=1e-6)
    ids = {
        "query": tok.encode(body["query"], add_special_tokens=False).ids,
        "items": [tok.encode(i, add_special_tokens=False).ids for i in items],
    }
    tokens = post(client, "/v1/score", {**body, **ids, "apply_softmax": True})
    assert len(tokens["scores"]) == 3 and all(len(s) == 3 for s in tokens["scores"])
    for answer in (text, tokens):  # the NPU copy's usage checks
        usage = answer["usage"]
        assert usage["prompt_tokens"] > 0 and usage["prompt_tokens"] == usage["total_tokens"]
        assert usage["completion_tokens"] == 0
    want = reference.score(body["query"], items, labels, apply_softmax=True)
    np.testing.assert_allclose(text["scores"], want, rtol=1e-5)


def test_sglang_score_error_names_the_token(client):
    body = {"query": "q", "items": ["a"], "label_token_ids": [999999], "apply_softmax": True}
    answer = post(client, "/v1/score", body, 400)
    assert answer["type"] == "BadRequestError" and answer["error"]["type"] == "BadRequestError"
    assert "Token ID 999999 is out of vocabulary" in answer["message"]
    assert "out of vocabulary range" in answer["error"]["message"].lower()  # vLLM's wording
    assert answer["code"] == answer["error"]["code"] == 400


def test_sglang_score_edge_cases(client):
    labels = [1, 2, 3]
    empty = post(client, "/v1/score", {"query": "q", "items": [], "label_token_ids": labels})
    assert empty["scores"] == [] and empty["usage"]["prompt_tokens"] == 0
    for query in ("", "选择最佳选项："):
        items = ["选项A", "选项B", "选项C"] if query else ["Item"]
        body = {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": True}
        answer = post(client, "/v1/score", body)
        assert len(answer["scores"]) == len(items) and all(len(s) == 3 for s in answer["scores"])
    one = post(
        client,
        "/v1/score",
        {"query": "q", "items": ["a", "b"], "label_token_ids": [7], "apply_softmax": True},
    )
    assert one["scores"] == [[1.0], [1.0]]  # a single label with softmax
    big = {"query": "The test was", "items": [f"test {i}" for i in range(20)]}
    answer = post(client, "/v1/score", {**big, "label_token_ids": labels, "apply_softmax": True})
    assert len(answer["scores"]) == 20
    again = post(client, "/v1/score", {**big, "label_token_ids": labels, "apply_softmax": True})
    np.testing.assert_allclose(again["scores"], answer["scores"], atol=1e-6)
    raw = post(client, "/v1/score", {**big, "label_token_ids": labels})
    assert all(0 <= x <= 1 and sum(s) < 1 for s in raw["scores"] for x in s)


# -- SGLang /v1/rerank (SCORING_RERANK_FORMAT=sglang) -------------------------------------------


def test_sglang_rerank_is_a_bare_list_best_first(sglang, reference):
    single = post(sglang, "/v1/rerank", {"query": Q, "documents": DOCS[:1]})
    assert isinstance(single, list) and len(single) == 1
    hit = single[0]
    assert (type(hit["score"]), type(hit["document"]), type(hit["index"])) == (float, str, int)
    batch = post(sglang, "/v1/rerank", {"query": Q, "documents": DOCS, "instruct": None})
    want = relevance(sglang, reference, Q, DOCS)
    order = sorted(range(3), key=lambda i: -want[i])
    assert [h["index"] for h in batch] == order
    assert [h["document"] for h in batch] == [DOCS[i] for i in order]
    np.testing.assert_allclose([h["score"] for h in batch], [want[i] for i in order], rtol=1e-5)
    top = post(sglang, "/v1/rerank", {"query": Q, "documents": DOCS, "top_n": 1})
    assert [h["index"] for h in top] == order[:1]
    bare = post(sglang, "/v1/rerank", {"query": Q, "documents": DOCS, "return_documents": False})
    assert all("document" not in h for h in bare) and [h["index"] for h in bare] == order
    more = post(sglang, "/v1/rerank", {"query": Q, "documents": DOCS[:2], "top_n": 10})
    assert len(more) == 2


# -- vLLM /score, /v1/score ----------------------------------------------------------------------


SPELLINGS = [("queries", "documents"), ("queries", "items"), ("text_1", "text_2")]
SPELLINGS += [("data_1", "data_2")]


@pytest.mark.parametrize(("left", "right"), SPELLINGS)
@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_vllm_score_spellings_pair_alike(client, reference, path, left, right):
    one = post(client, path, {"model": "m", left: QS[0], right: DS[0]})
    assert one["id"].startswith("score-") and one["object"] == "list" and one["model"] == "m"
    assert isinstance(one["created"], int) and len(one["data"]) == 1
    assert one["data"][0] == {"index": 0, "object": "score", "score": one["data"][0]["score"]}
    fan = post(client, path, {left: QS[0], right: DS})  # 1:N
    pairs = post(client, path, {left: QS, right: DS})  # N:N
    assert [d["index"] for d in fan["data"]] == [d["index"] for d in pairs["data"]] == [0, 1]
    want_fan = relevance(client, reference, QS[0], DS)
    want_pairs = [relevance(client, reference, q, [d])[0] for q, d in zip(QS, DS, strict=True)]
    np.testing.assert_allclose([d["score"] for d in fan["data"]], want_fan, rtol=1e-5)
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], want_pairs, rtol=1e-5)
    usage = pairs["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0 and usage["completion_tokens"] == 0


def test_vllm_score_equals_rerank_and_invocations(client):
    score = post(client, "/score", {"queries": Q, "documents": DOCS[1]})
    rerank = post(client, "/rerank", {"query": Q, "documents": [DOCS[1]]})
    assert score["data"][0]["score"] == pytest.approx(rerank["results"][0]["relevance_score"])
    assert score["usage"]["prompt_tokens"] == rerank["usage"]["prompt_tokens"]
    via = post(client, "/invocations", {"queries": Q, "documents": DOCS[1]})
    # the same pairs, their prefixes now cached: equal to within f32 rounding
    assert set(via) == set(score)
    assert via["data"][0]["score"] == pytest.approx(score["data"][0]["score"], rel=1e-6)
    via = post(client, "/invocations", {"query": Q, "documents": [DOCS[1]]})
    assert set(via) == set(rerank) and via["results"] == rerank["results"]


def test_vllm_use_activation(client, reference):
    body = {"queries": Q, "documents": DOCS}
    default = post(client, "/score", body)
    on = post(client, "/score", {**body, "use_activation": True})
    off = post(client, "/score", {**body, "use_activation": False})
    old = post(client, "/score", {**body, "activation": False})
    assert default["data"] == on["data"] and off["data"] == old["data"]
    raw = [d["score"] for d in off["data"]]
    np.testing.assert_allclose(raw, relevance(client, reference, Q, DOCS, raw=True), atol=1e-4)
    sigmoid = [1 / (1 + math.exp(-x)) for x in raw]
    np.testing.assert_allclose(sigmoid, [d["score"] for d in on["data"]], rtol=1e-5)


def test_vllm_score_errors(client):
    long = {"queries": "What is the capital of France?" * 80, "documents": DOCS[0]}
    answer = post(client, "/score", long, 400)
    assert "Please reduce the length of the input" in answer["error"]["message"]
    cut = post(client, "/score", {**long, "truncate_prompt_tokens": 10_000}, 400)
    assert "Please, select a smaller truncation size." in cut["error"]["message"]
    bad = post(client, "/score", {"queries": ["a", "b"], "documents": ["c"]}, 400)
    assert bad["error"]["message"] == "Input lengths must be either 1:1, 1:N or N:N"
    bad = post(client, "/score", {"queries": [], "documents": ["c"]}, 400)
    assert bad["error"]["message"] == "At least one text element must be given"
    bad = post(client, "/score", {"queries": "a", "documents": []}, 400)
    assert bad["error"]["message"] == "At least one text_pair element must be given"
    assert post(client, "/score", {"queries": "a"}, 400)["error"]["type"] == "BadRequestError"


# -- vLLM /rerank, /v1/rerank, /v2/rerank ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_vllm_rerank(client, reference, path):
    want = relevance(client, reference, Q, DOCS)
    order = sorted(range(3), key=lambda i: -want[i])
    answer = post(client, path, {"model": "m", "query": Q, "documents": DOCS})
    assert answer["id"] and answer["model"] == "m"
    assert [r["index"] for r in answer["results"]] == order
    assert [r["document"]["text"] for r in answer["results"]] == [DOCS[i] for i in order]
    scores = [r["relevance_score"] for r in answer["results"]]
    np.testing.assert_allclose(scores, [want[i] for i in order], rtol=1e-5)
    usage = answer["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    for top_n, n in ((2, 2), (0, 3), (10, 3)):
        top = post(client, path, {"query": Q, "documents": DOCS, "top_n": top_n})
        assert [r["index"] for r in top["results"]] == order[:n]
        assert top["usage"]["prompt_tokens"] == usage["prompt_tokens"]  # every document counted
    assert post(client, path, {"query": Q, "documents": DOCS, "top_n": -1}, 400)


def test_vllm_max_tokens_per_doc_lowers_the_prompt_tokens(client):
    doc = "The capital of France is Paris. " * 5
    whole = post(client, "/rerank", {"query": Q, "documents": [doc]})
    cut = post(client, "/rerank", {"query": Q, "documents": [doc], "max_tokens_per_doc": 5})
    assert len(cut["results"]) == 1 and cut["usage"]["prompt_tokens"] > 0
    assert cut["usage"]["prompt_tokens"] < whole["usage"]["prompt_tokens"]


# -- vLLM /tokenize, /detokenize -------------------------------------------------------------------


def test_vllm_tokenize_and_detokenize(client):
    engine = engine_of(client)
    tok = engine.tokenizer
    prompt = "vllm1 This is a test prompt."
    for special in (False, True):
        body = {"add_special_tokens": special, "model": "m", "prompt": prompt}
        answer = post(client, "/tokenize", body)
        assert answer["tokens"] == tok.encode(prompt, add_special_tokens=special).ids
        assert answer["count"] == len(answer["tokens"])
        assert answer["max_model_len"] == engine.max_sequence_tokens
        assert "token_strs" in answer and answer["token_strs"] is None
    strs = post(client, "/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert strs["token_strs"] == [tok.id_to_token(t) for t in strs["tokens"]]
    text = "This is a test prompt. vllm1"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert post(client, "/detokenize", {"model": "m", "tokens": ids}) == {"prompt": text}
    chat = post(client, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}, 400)
    assert chat["error"]["param"] == "messages"


# -- TEI -------------------------------------------------------------------------------------------

TEI_INFO_REQUIRED = {  # TEI's OpenAPI `Info.required`
    "model_id",
    "model_dtype",
    "served_model_name",
    "model_type",
    "max_concurrent_requests",
    "max_input_length",
    "max_batch_tokens",
    "max_client_batch_size",
    "auto_truncate",
    "tokenization_workers",
    "version",
}


def test_tei_rerank(client, reference):
    want = relevance(client, reference, Q, DOCS)
    raw = relevance(client, reference, Q, DOCS, raw=True)
    order = sorted(range(3), key=lambda i: -want[i])
    ranks = post(client, "/rerank", {"query": Q, "texts": DOCS})
    assert isinstance(ranks, list) and [r["index"] for r in ranks] == order
    assert all(set(r) == {"index", "score"} for r in ranks)  # no text unless asked
    np.testing.assert_allclose([r["score"] for r in ranks], [want[i] for i in order], rtol=1e-5)
    texts = post(client, "/rerank", {"query": Q, "texts": DOCS, "return_text": True})
    assert [r["text"] for r in texts] == [DOCS[i] for i in order]
    logits = post(client, "/rerank", {"query": Q, "texts": DOCS, "raw_scores": True})
    assert [r["index"] for r in logits] == order
    np.testing.assert_allclose([r["score"] for r in logits], [raw[i] for i in order], atol=1e-4)
    tie = post(client, "/rerank", {"query": Q, "texts": [DOCS[0], DOCS[0]]})
    assert [r["index"] for r in tie] == [1, 0]  # TEI: ties put the higher index first
    via = post(client, "/invocations", {"query": Q, "texts": DOCS})
    assert via == ranks


def test_tei_truncation_and_errors(client):
    long = "stone house light " * 200
    # TEI's --auto-truncate (its default since 1.9): cut unless `truncate: false`
    assert len(post(client, "/rerank", {"query": Q, "texts": [long]})) == 1
    error = post(client, "/rerank", {"query": Q, "texts": [long], "truncate": False}, 422)
    assert error["error_type"] == "Validation" and "context" in error["error"]
    for direction in ("Right", "Left", "left"):
        body = {"query": Q, "texts": [long, DOCS[1]], "truncate": True}
        ranks = post(client, "/rerank", {**body, "truncation_direction": direction})
        assert sorted(r["index"] for r in ranks) == [0, 1]
    assert post(client, "/rerank", {"query": Q, "texts": []}, 400) == {
        "error": "`texts` cannot be empty",
        "error_type": "Empty",
    }
    empty_query = post(client, "/rerank", {"query": "", "texts": DOCS})  # TEI accepts it
    assert len(empty_query) == 3


def test_tei_info_ping_tokenize_decode(client):
    engine = engine_of(client)
    info = post_get(client, "/info")
    assert set(info) >= TEI_INFO_REQUIRED
    assert info["model_type"] == {
        "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    }
    assert (
        info["max_input_length"] == engine.max_sequence_tokens and info["model_dtype"] == "float32"
    )
    r = client.get("/ping")
    assert (r.status_code, r.content) == (200, b"")
    tok = engine.tokenizer
    tokens = post(client, "/tokenize", {"inputs": "test text", "add_special_tokens": False})
    (only,) = tokens
    assert [t["id"] for t in only] == tok.encode("test text", add_special_tokens=False).ids
    assert "".join(t["text"] for t in only) == "test text" and not any(t["special"] for t in only)
    assert all(set(t) == {"id", "text", "special", "start", "stop"} for t in only)
    many = post(client, "/tokenize", {"inputs": ["a b", "c"]})
    assert len(many) == 2
    ids = tok.encode("This is a test.", add_special_tokens=False).ids
    assert post(client, "/decode", {"ids": ids}) == ["This is a test."]
    assert post(client, "/decode", {"ids": [ids, ids[:2]]}) == [
        "This is a test.",
        tok.decode(ids[:2]),
    ]
    assert post(client, "/decode", {"ids": []}, 400)["error_type"] == "Empty"


def post_get(client, path: str):
    r = client.get(path)
    assert r.status_code == 200, r.text
    return r.json()


# -- Voyage, Mixedbread ----------------------------------------------------------------------------


def test_voyage_and_mixedbread_shapes(client, reference):
    want = relevance(client, reference, Q, DOCS)
    order = sorted(range(3), key=lambda i: -want[i])
    voyage = post(
        client, "/v1/rerank", {"query": Q, "documents": DOCS, "top_k": None, "model": "v"}
    )
    assert voyage["object"] == "list" and voyage["model"] == "v"
    assert [d["index"] for d in voyage["data"]] == order and "document" not in voyage["data"][0]
    assert voyage["usage"]["total_tokens"] > 0
    echoed = post(
        client, "/v1/rerank", {"query": Q, "documents": DOCS, "top_k": 2, "return_documents": True}
    )
    assert [d["document"] for d in echoed["data"]] == [DOCS[i] for i in order[:2]]
    mxbai = post(
        client, "/v1/reranking", {"query": Q, "input": DOCS, "top_k": 2, "return_input": True}
    )
    assert mxbai["object"] == "list" and mxbai["top_k"] == 2 and mxbai["return_input"] is True
    assert [d["index"] for d in mxbai["data"]] == order[:2]
    assert [d["input"] for d in mxbai["data"]] == [DOCS[i] for i in order[:2]]
    np.testing.assert_allclose(
        [d["score"] for d in mxbai["data"]], [want[i] for i in order[:2]], rtol=1e-5
    )
