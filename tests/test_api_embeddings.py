"""The embedding APIs on the real all-MiniLM-L6-v2: OpenAI's `/v1/embeddings` (with Voyage's and
vLLM's fields), TEI's `/embed`, `/embed_all` and `/similarity`, Cohere's `/v2/embed` and vLLM's
`/pooling`.
Values equal `Engine.embed`'s (quantised formats an independent computation of them), the model
card names the routes, and every refusal names its field."""

import base64
import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import trio
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import cos_sim
from sentence_transformers.util.quantization import quantize_embeddings

from api.app import create_app
from api.settings import settings_from_env
from bench.encoders import write_st_modules
from engine import open_engine
from tests.conftest import CORPUS
from tests.test_api_support import serving, tiny_config, tiny_env
from tests.test_embed import qwen3_embedding

TEXTS = [*CORPUS[:6], "a", "Zürich—São Paulo—Kraków 🙂"]


def engine_embeddings(path, texts, **options) -> np.ndarray:
    async def main():
        async with open_engine(tiny_config(path)) as engine:  # the service's configuration
            return (await engine.embed(texts, **options)).embeddings

    return trio.run(main)


@pytest.fixture(scope="module")
def client(minilm):
    yield from serving(create_app(settings_from_env(tiny_env(minilm))), "asyncio")


def test_floats_and_base64_equal_the_engine(client, minilm):
    want = engine_embeddings(minilm, TEXTS)
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "mini"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["model"]) == ("list", "mini")
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    assert {d["object"] for d in body["data"]} == {"embedding"}
    got = np.array([d["embedding"] for d in body["data"]], np.float32)
    np.testing.assert_array_equal(got, want)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > len(TEXTS) * 2
    assert float(r.headers["x-device-time"]) > 0

    r = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    packed = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
    np.testing.assert_array_equal(np.stack(packed), want)

    r = client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 384})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.float32(r.json()["data"][0]["embedding"]), want[0])


def test_the_model_card_names_the_embedding_route(client):
    info = client.get("/get_model_info").json()
    assert (info["head"], info["architecture"]) == ("embedding", "encoder")
    assert client.get("/info").json()["model_type"] == {"embedding": {"pooling": "mean"}}  # TEI's
    routes = ["/v1/rerank", "/v2/rerank", "/rerank", "/v1/reranking", "/score"]  # by cosine
    routes += ["/v1/embeddings", "/v2/embed", "/embed", "/embed_all", "/similarity", "/pooling"]
    routes += ["/invocations", "/"]  # SageMaker's and TEI's root, for each of those bodies
    assert info["endpoints"] == routes
    assert client.get("/v1/models").json()["data"][0]["endpoints"] == routes
    assert set(routes) <= set(client.get("/openapi.json").json()["paths"])


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": []}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": ["fine", ""]}, 400, "input[1]"),
        ({"input": ["fine", 3]}, 400, "input[1]"),
        ({"input": ["fine"], "dimensions": 128}, 400, "dimensions"),
        ({"input": ["fine"], "dimensions": 0}, 400, "dimensions"),
        ({"input": ["fine"], "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": ["fine"], "extra": 1}, 400, "extra"),
        ({"input": ["fine", " ".join(CORPUS[:6]) * 8]}, 400, "input[1]"),  # over 256 tokens
    ],
)
def test_bad_bodies_name_their_field(client, body, status, param):
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_truncation_is_asked_for_and_reported(client):
    long = " ".join(CORPUS[:6]) * 8
    r = client.post("/v1/embeddings", json={"input": ["fine", long], "truncate": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["truncated_tokens"] > 0
    assert usage["prompt_tokens"] == 256 + 3  # [CLS] fine [SEP], and the cut text


def test_an_embedder_reranks_by_cosine_similarity(client, minilm):
    documents = ["A kitten sleeps.", "Stocks fell.", "Dogs chase cats."]
    model = SentenceTransformer(str(minilm), device="cpu")
    want = cos_sim(model.encode_query(["cats"]), model.encode_document(documents)).numpy()[0]
    r = client.post("/v1/rerank", json={"query": "cats", "documents": documents})
    assert r.status_code == 200, r.text
    got = {h["index"]: h["relevance_score"] for h in r.json()["results"]}
    assert [h["index"] for h in r.json()["results"]] == [2, 0, 1]
    np.testing.assert_allclose([got[i] for i in range(3)], want, atol=1e-6, rtol=0)


def test_an_embedder_refuses_scores_and_a_scorer_refuses_embeddings(client, tiny_path):
    r = client.post("/v1/score", json={"query": "q", "items": ["a"], "label_token_ids": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "label_token_ids"
    assert "embedder" in r.json()["error"]["message"]
    for scorer in serving(create_app(settings_from_env(tiny_env(tiny_path))), "asyncio"):
        r = scorer.post("/v1/embeddings", json={"input": ["a"]})
        assert r.status_code == 400 and "not an embedder" in r.json()["error"]["message"]
        r = scorer.post("/embed_all", json={"inputs": ["a"]})  # TEI's error body and status
        assert r.status_code == 424 and "not an embedder" in r.json()["error"], r.text
        assert r.json()["error_type"] == "Backend"
        endpoints = scorer.get("/get_model_info").json()["endpoints"]
        assert not {"/v1/embeddings", "/embed_all"} & set(endpoints)


@pytest.fixture(scope="module")
def want(minilm) -> np.ndarray:
    """`Engine.embed` of TEXTS: f32[N, 384], unit vectors."""
    return engine_embeddings(minilm, TEXTS)


@pytest.fixture(scope="module")
def tokenizer(minilm):
    return SentenceTransformer(str(minilm), device="cpu").tokenizer


def int8_of(vectors: np.ndarray) -> np.ndarray:
    """The documented int8 format, computed here: the unit vector times 127, rounded."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.rint(unit.astype(np.float64) * 127).astype(np.int64)


def test_token_ids_embed_as_their_texts(client, want, tokenizer):
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    r = client.post("/v1/embeddings", json={"input": ids})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert np.abs(got - want).max() <= 1e-6
    r = client.post("/v1/embeddings", json={"input": ids[0]})  # one token-id list
    assert len(r.json()["data"]) == 1
    assert np.abs(np.float32(r.json()["data"][0]["embedding"]) - want[0]).max() <= 1e-6


def test_voyage_output_dtypes(client, want):
    for dtype, expected in (
        ("int8", int8_of(want)),
        ("uint8", int8_of(want) + 128),
        ("binary", quantize_embeddings(want, precision="binary")),
        ("ubinary", quantize_embeddings(want, precision="ubinary")),
    ):
        body = {"input": TEXTS, "output_dtype": dtype, "input_type": "document"}
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        np.testing.assert_array_equal(got, expected, err_msg=dtype)
        r = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
        kind = {"int8": "i1", "binary": "i1"}.get(dtype, "u1")
        packed = [np.frombuffer(base64.b64decode(d["embedding"]), kind) for d in r.json()["data"]]
        np.testing.assert_array_equal(np.stack(packed), expected, err_msg=dtype)
    # the int8 vectors point where the floats do: cosine 0.999, where one step less (63 for
    # 127) would measure ~0.996
    int8 = int8_of(want)
    cosine = (int8 * want).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.998, cosine


def test_tei_embed(client, minilm, want):
    r = client.post("/embed", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.float32(r.json()), want)
    r = client.post("/embed", json={"inputs": TEXTS[0], "normalize": False})
    raw = engine_embeddings(minilm, TEXTS[:1], normalize=False)
    np.testing.assert_array_equal(np.float32(r.json()), raw)
    long = " ".join(CORPUS[:6]) * 8
    r = client.post("/embed", json={"inputs": ["a", long]})  # TEI's auto-truncate: cut
    right = engine_embeddings(minilm, ["a", long], truncate=True)
    np.testing.assert_array_equal(np.float32(r.json()), right)
    r = client.post("/embed", json={"inputs": ["a", long], "truncate": False})
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "Validation" and r.json()["error"].startswith("inputs[1]: ")
    r = client.post("/embed", json={"inputs": ["a", ""]})
    assert (r.status_code, r.json()["error_type"]) == (400, "Empty"), r.text
    body = {"inputs": [long], "truncate": True, "truncation_direction": "Left"}
    r = client.post("/embed", json=body)
    left = engine_embeddings(minilm, [long], truncate=True, truncation_side="left")
    np.testing.assert_array_equal(np.float32(r.json()), left)
    # as TEI, any model's first components, normalised: sentence-transformers' truncate_dim
    r = client.post("/embed", json={"inputs": TEXTS, "dimensions": 100})
    model = SentenceTransformer(str(minilm), device="cpu")
    narrow = model.encode(TEXTS, truncate_dim=100, normalize_embeddings=True)
    np.testing.assert_allclose(np.float32(r.json()), narrow, atol=1e-6)
    r = client.post("/embed", json={"inputs": ["a"], "dimensions": 385})
    assert r.status_code == 422 and r.json()["error"].startswith("dimensions: ")
    ids = model.tokenizer(TEXTS[1])["input_ids"]  # TEI's batches mix texts and token ids
    r = client.post("/embed", json={"inputs": [TEXTS[0], ids]})
    np.testing.assert_allclose(np.float32(r.json()), want[:2], atol=1e-6)
    info = client.get("/info").json()  # TEI reads the directory's max_seq_length
    assert (info["max_input_length"], info["auto_truncate"]) == (256, True)
    card = client.get("/v1/models").json()["data"][0]  # and so does vLLM
    assert (
        card["max_model_len"]
        == 256
        == client.post("/tokenize", json={"prompt": "a"}).json()["max_model_len"]
    )


def test_tei_embed_all(client, minilm):
    async def main(texts, **options):
        async with open_engine(tiny_config(minilm)) as engine:  # the service's configuration
            return (await engine.embed_tokens(texts, **options)).embeddings

    r = client.post("/embed_all", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    want = trio.run(main, TEXTS)
    assert [len(v) for v in r.json()] == [len(w) for w in want]  # each input's every token
    for got, expected in zip(r.json(), want, strict=True):
        np.testing.assert_array_equal(np.float32(got), expected)
    long = " ".join(CORPUS[:6]) * 8
    body = {"inputs": long, "truncate": True, "truncation_direction": "left"}
    r = client.post("/embed_all", json=body)
    (left,) = trio.run(functools.partial(main, truncate=True, truncation_side="left"), [long])
    np.testing.assert_array_equal(np.float32(r.json()[0]), left)
    assert float(r.headers["x-device-time"]) > 0
    r = client.post("/embed_all", json={"inputs": ["a", long], "truncate": False})
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "Validation" and r.json()["error"].startswith("inputs[1]: ")
    r = client.post("/embed_all", json={"inputs": ["a"], "normalize": True})
    assert r.status_code == 422 and "normalize" in r.json()["error"]  # no such field there
    r = client.post("/embed_all", json={"inputs": ["a"], "prompt_name": "query"})
    assert r.status_code == 422 and r.json()["error"].startswith("prompt_name: unknown prompt")


def test_tei_similarity(client, want):
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    r = client.post("/similarity", json=body)
    assert r.status_code == 200, r.text
    cosine = cos_sim(want[:1].astype(np.float64), want[1:].astype(np.float64))[0].numpy()
    np.testing.assert_allclose(r.json(), cosine, atol=1e-6)
    body["inputs"]["sentences"] = ["fine", ""]
    r = client.post("/similarity", json={**body, "parameters": {"truncate": True}})
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith("inputs.sentences[1]: must not be empty")
    body["inputs"]["sentences"] = []
    r = client.post("/similarity", json=body)
    assert r.status_code == 422 and r.json()["error"].startswith("inputs.sentences: ")


def test_cohere_embed(client, minilm, want):
    types = ["float", "int8", "ubinary", "base64"]
    body = {"texts": TEXTS, "input_type": "search_document", "embedding_types": types}
    r = client.post("/v2/embed", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["response_type"], out["texts"]) == ("embeddings_by_type", TEXTS)
    assert out["meta"]["billed_units"]["input_tokens"] > 2 * len(TEXTS)
    assert out["meta"]["tokens"]["input_tokens"] == out["meta"]["billed_units"]["input_tokens"]
    by_type = out["embeddings"]
    assert set(by_type) == set(types)
    np.testing.assert_array_equal(np.float32(by_type["float"]), want)
    np.testing.assert_array_equal(np.array(by_type["int8"]), int8_of(want))
    ubinary = quantize_embeddings(want, precision="ubinary")
    np.testing.assert_array_equal(np.array(by_type["ubinary"]), ubinary)
    floats = [np.frombuffer(base64.b64decode(s), "<f4") for s in by_type["base64"]]
    np.testing.assert_array_equal(np.stack(floats), want)

    long = " ".join(CORPUS[:6]) * 8
    r = client.post("/v2/embed", json={"texts": ["a", long], "truncate": "NONE"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts[1]"
    r = client.post("/v2/embed", json={"texts": [long], "truncate": "START", "max_tokens": 40})
    start = engine_embeddings(minilm, [long], truncate=True, truncation_side="left", max_tokens=40)
    np.testing.assert_array_equal(np.float32(r.json()["embeddings"]["float"]), start)
    r = client.post("/v2/embed", json={"texts": ["a"], "images": ["data:image/png;base64,AA=="]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "images"


def test_vllm_pooling(client, minilm, want, tokenizer):
    r = client.post("/pooling", json={"input": TEXTS, "model": "mini"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"].startswith("pool-") and out["object"] == "list" and out["model"] == "mini"
    assert {d["object"] for d in out["data"]} == {"pooling"}
    np.testing.assert_array_equal(np.float32([d["data"] for d in out["data"]]), want)
    r = client.post("/pooling", json={"input": TEXTS[:1], "encoding_format": "base64"})
    packed = np.frombuffer(base64.b64decode(r.json()["data"][0]["data"]), "<f4")
    np.testing.assert_array_equal(packed, want[0])

    long = " ".join(CORPUS[:6]) * 8
    r = client.post("/pooling", json={"input": [long], "truncate_prompt_tokens": 12})
    assert r.status_code == 200, r.text
    tokenizer.truncation_side = "left"  # vLLM's: the last tokens kept
    kept = tokenizer(long, truncation=True, max_length=12)["input_ids"]
    assert len(kept) == 12
    np.testing.assert_array_equal(
        np.float32(r.json()["data"][0]["data"]), engine_embeddings(minilm, [kept])[0]
    )
    assert r.json()["usage"]["prompt_tokens"] == 12
    r = client.post("/pooling", json={"input": ["a"], "task": "classify"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task"
    r = client.post("/pooling", json={"input": ["a"], "truncate_prompt_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
def test_vllm_base64_dtypes_byte_orders_activation_and_truncation_side(client, minilm, route):
    """vLLM's current fields: each `embed_dtype` in each `endianness` holds the float answer
    rounded to that type; `use_activation` (the new name of `normalize`); `truncation_side`
    with `truncate_prompt_tokens`."""
    field = "input"
    floats = np.float32(
        [d[_data(route)] for d in client.post(route, json={field: TEXTS}).json()["data"]]
    )
    types = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    types |= {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
    for name, kind in types.items():
        for order, mark in (("little", "<"), ("big", ">"), ("native", "=")):
            body = {field: TEXTS, "encoding_format": "base64", "embed_dtype": name}
            r = client.post(route, json=body | {"endianness": order})
            assert r.status_code == 200, r.text
            raw = [base64.b64decode(d[_data(route)]) for d in r.json()["data"]]
            size = np.dtype(kind).itemsize
            got = np.stack([np.frombuffer(b, f"{mark}u{size}") for b in raw])
            want = floats.astype(kind).view(f"u{size}")
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {order}")
    raw = client.post(route, json={field: TEXTS, "use_activation": False}).json()["data"]
    unnormalised = engine_embeddings(minilm, TEXTS, normalize=False)
    np.testing.assert_array_equal(np.float32([d[_data(route)] for d in raw]), unnormalised)
    r = client.post(route, json={field: ["a"], "use_activation": False, "normalize": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_activation"
    long = " ".join(CORPUS[:6]) * 8
    body = {field: [long], "truncate_prompt_tokens": 12, "truncation_side": "right"}
    got = client.post(route, json=body).json()["data"][0][_data(route)]
    first = engine_embeddings(minilm, [long], truncate=True, max_tokens=12)
    np.testing.assert_array_equal(np.float32(got), first[0])


def _data(route: str) -> str:
    return "embedding" if route == "/v1/embeddings" else "data"


@pytest.mark.parametrize("root", ["/invocations", "/"])
def test_invocations_answer_each_embedding_body_as_its_route(client, want, root):
    """SageMaker's `/invocations` and TEI's root answer whatever body kind they are sent as
    the route of that kind does: OpenAI's and vLLM's `input`, vLLM's pooling `task`, TEI's
    `inputs`, a rerank's `query` and `texts`."""
    bodies = [
        ("/v1/embeddings", {"input": TEXTS}),
        ("/pooling", {"input": TEXTS, "task": "embed"}),
        ("/embed", {"inputs": TEXTS}),
        ("/rerank", {"query": "cats", "texts": TEXTS}),
    ]
    for route, body in bodies:
        direct, via = client.post(route, json=body), client.post(root, json=body)
        assert via.status_code == 200, via.text
        strip = lambda answer: {k: v for k, v in answer.items() if k not in ("id", "created")}
        got, expected = via.json(), direct.json()
        if route == "/rerank":  # the query and the documents batched apart or together
            assert [h["index"] for h in got] == [h["index"] for h in expected]
            scores = [[h["score"] for h in answer] for answer in (got, expected)]
            np.testing.assert_allclose(*scores, atol=1e-6, rtol=0)  # cosines: scale 1
            continue
        assert (strip(got) if isinstance(got, dict) else got) == (
            strip(expected) if isinstance(expected, dict) else expected
        )
    r = client.post(root, json={"inputs": ["a", ""]})  # TEI's errors for TEI's body
    assert (r.status_code, r.json()["error_type"]) == (400, "Empty")
    assert root in client.get("/get_model_info").json()["endpoints"]


@pytest.fixture(scope="module")
def prompted(tmp_path_factory) -> Path:
    """A tiny decoder embedder whose directory has a query and a document prompt, Matryoshka
    trained."""
    path = qwen3_embedding(tmp_path_factory.mktemp("prompted"))
    prompts = {"query": "query: ", "document": "passage: "}
    write_st_modules(path, 64, "last", True, 40, prompts=prompts)
    return path


def test_input_types_pick_the_directorys_prompts_and_dimensions_cut(prompted):
    """Voyage's `input_type` and Cohere's search_query/search_document pick the directory's
    prompts, as `SentenceTransformer.encode(prompt_name=...)` does; a Matryoshka width below
    full size is `encode(truncate_dim=...)`."""
    texts = ["The quick fox.", "a", "Numbers 0 1 2", "Zürich 🙂"]  # within its 40 tokens
    model = SentenceTransformer(str(prompted), device="cpu")
    want = {name: model.encode(texts, prompt_name=name) for name in ("query", "document")}
    bare = model.encode(texts)
    assert np.abs(want["query"] - want["document"]).max() > 1e-3  # the prompts matter
    narrow = model.encode(texts, prompt_name="query", truncate_dim=16, normalize_embeddings=True)
    for client in serving(create_app(settings_from_env(tiny_env(prompted))), "asyncio"):
        for kind in ("query", "document"):
            r = client.post("/v1/embeddings", json={"input": texts, "input_type": kind})
            assert r.status_code == 200, r.text
            got = np.float32([d["embedding"] for d in r.json()["data"]])
            np.testing.assert_allclose(got, want[kind], atol=1e-5)
            body = {"texts": texts, "input_type": f"search_{kind}", "embedding_types": ["float"]}
            r = client.post("/v2/embed", json=body)
            got = np.float32(r.json()["embeddings"]["float"])
            np.testing.assert_allclose(got, want[kind], atol=1e-5)
        r = client.post("/v1/embeddings", json={"input": texts})  # no input_type: no prompt
        got = np.float32([d["embedding"] for d in r.json()["data"]])
        np.testing.assert_allclose(got, bare, atol=1e-5)
        body = {"input": texts, "input_type": "query", "output_dimension": 16}
        r = client.post("/v1/embeddings", json=body)
        got = np.float32([d["embedding"] for d in r.json()["data"]])
        assert got.shape == (len(texts), 16)
        np.testing.assert_allclose(got, narrow, atol=1e-5)
