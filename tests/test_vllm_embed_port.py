"""vLLM's own online embedding tests (`tests/entrypoints/pooling/embed/test_online.py` of its
current release) ported to the engine serving the real all-MiniLM-L6-v2: the same requests and
the same assertions, the model's numbers in place of multilingual-e5-small's, and
sentence-transformers as the reference (vLLM's `run_embedding_correctness_test` compares with
its Hugging Face runner; here within 1e-5, not vLLM's 1e-2).

Ported and passing: test_basic, test_completion_request, test_completion_request_batched,
test_truncate_prompt_tokens (but its last case), test_invocations_completion_request,
test_base64_embedding, test_base64_embed_dtype_and_endianness, test_params_not_supported (but
pydantic's `literal_error` wording), test_use_activation, test_pooling_embed,
test_pooling_token_embed, test_pooling_not_supported: 12 of 17. Not ported, each a decision
(docs/embeddings.md): test_chat_request and test_invocations_chat_request (no chat template is
served: `messages` is refused), test_bytes_embed_dtype_and_endianness and
test_bytes_only_embed_dtype_and_endianness (the binary `bytes` encodings are not served: base64
carries the same `embed_dtype`s), and test_truncate_prompt_tokens' last case
(`truncate_prompt_tokens` over the model's limit cuts at the limit; vLLM refuses it)."""

import base64

import ml_dtypes
import numpy as np
import openai
import pytest
import requests
from sentence_transformers import SentenceTransformer

from tests.test_api_support import hypercorn_server, tiny_env

INPUT_TEXT = "The best thing about vLLM is that it supports many different models"
TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TYPES |= {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
ORDERS = {"native": "=", "big": ">", "little": "<"}


@pytest.fixture(scope="module")
def server(minilm, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-port") / "server.log"
    env = tiny_env(minilm, SCORING_MODEL_NAME="all-MiniLM-L6-v2")
    with hypercorn_server("asyncio", env, log) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(minilm):
    return SentenceTransformer(str(minilm), device="cpu")


@pytest.fixture(scope="module")
def input_tokens(reference) -> list[int]:
    return reference.tokenizer(INPUT_TEXT)["input_ids"]


def correct(reference, texts, got) -> None:
    """vLLM's `run_embedding_correctness_test`, held to 1e-5."""
    want = reference.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(np.float32(got), want, atol=1e-5)


def test_basic(server, client, input_tokens):
    model = requests.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    assert model == "all-MiniLM-L6-v2" == client.models.list().data[0].id
    r = requests.post(f"{server.url}/tokenize", json={"model": model, "prompt": INPUT_TEXT})
    assert r.json()["tokens"] == input_tokens


@pytest.mark.parametrize("n", [1, 10])
def test_completion_request(client, reference, input_tokens, n):
    for given in ([INPUT_TEXT] * n, [input_tokens] * n):
        res = client.embeddings.create(model="m", input=given, encoding_format="float")
        assert res.id is not None and len(res.data) == n and len(res.data[0].embedding) == 384
        assert res.usage.completion_tokens == 0
        assert res.usage.prompt_tokens == res.usage.total_tokens == len(input_tokens) * n
        correct(reference, [INPUT_TEXT] * n, [d.embedding for d in res.data])


def test_truncate_prompt_tokens(client, reference):
    text = ["Como o Brasil pode fomentar o desenvolvimento de modelos de IA?"]
    res = client.embeddings.create(model="m", input=text, extra_body={"truncate_prompt_tokens": 10})
    assert len(res.data) == 1 and res.usage.prompt_tokens == res.usage.total_tokens == 10
    ids = reference.tokenizer(text[0])["input_ids"]
    res = client.embeddings.create(model="m", input=ids, extra_body={"truncate_prompt_tokens": 10})
    assert len(res.data[0].embedding) == 384 and res.usage.prompt_tokens == 10


def test_invocations_completion_request(server, client):
    args = {"model": "m", "input": INPUT_TEXT, "encoding_format": "float"}
    completion = client.embeddings.create(**args).model_dump()
    invocation = requests.post(f"{server.url}/invocations", json=args)
    invocation.raise_for_status()
    invocation = invocation.json()
    assert completion.keys() == invocation.keys()
    for a, b in zip(completion["data"], invocation["data"], strict=True):
        assert a.keys() == b.keys()
        np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-6)


def test_base64_embedding(client, reference):
    texts = ["Hello my name is", INPUT_TEXT]
    floats = client.embeddings.create(input=texts, model="m", encoding_format="float")
    correct(reference, texts, [d.embedding for d in floats.data])
    packed = client.embeddings.create(input=texts, model="m", encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), "float32") for d in packed.data]
    correct(reference, texts, decoded)
    default = client.embeddings.create(input=texts, model="m")  # the SDK's base64, decoded
    correct(reference, texts, [d.embedding for d in default.data])


def test_base64_embed_dtype_and_endianness(server, client):
    texts = [INPUT_TEXT] * 3
    floats = client.embeddings.create(input=texts, model="m", encoding_format="float")
    want = np.float32([d.embedding for d in floats.data])
    for dtype, kind in TYPES.items():
        for endianness, mark in ORDERS.items():
            body = {"model": "m", "input": texts, "encoding_format": "base64"}
            body |= {"embed_dtype": dtype, "endianness": endianness}
            r = requests.post(f"{server.url}/v1/embeddings", json=body)
            size = np.dtype(kind).itemsize
            raw = [base64.b64decode(d["embedding"]) for d in r.json()["data"]]
            bits = [np.frombuffer(b, f"{mark}u{size}").astype(f"u{size}") for b in raw]
            got = np.float32([b.view(kind) for b in bits])
            cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1)  # want: unit vectors
            assert (cosine >= 1 - 1e-2).all(), (dtype, endianness)  # vLLM's check_embeddings_close
            assert np.array_equal(got, want.astype(kind).astype(np.float32))  # rounded to nearest


@pytest.mark.parametrize("param", ["encoding_format", "embed_dtype", "endianness"])
def test_params_not_supported(server, param):
    body = {"model": "m", "input": INPUT_TEXT, "encoding_format": "base64"}
    r = requests.post(f"{server.url}/v1/embeddings", json=body | {param: f"bad_{param}"})
    assert r.status_code == 400 and f"bad_{param}" in r.json()["error"]["message"]


def test_use_activation(server):
    def outputs(use_activation):
        body = {"model": "m", "input": INPUT_TEXT, "encoding_format": "float"}
        r = requests.post(
            f"{server.url}/v1/embeddings", json=body | {"use_activation": use_activation}
        )
        return np.float32([x["embedding"] for x in r.json()["data"]])

    default, normal, raw = outputs(None), outputs(True), outputs(False)
    np.testing.assert_allclose(default, normal, atol=1e-2)
    assert not np.allclose(normal, raw, atol=1e-2)
    unit = raw / np.linalg.norm(raw, axis=-1, keepdims=True)
    np.testing.assert_allclose(normal, unit, atol=1e-2)


def test_pooling_embed_and_token_embed(server, input_tokens):
    body = {"model": "m", "input": INPUT_TEXT, "encoding_format": "float"}
    embed = requests.post(f"{server.url}/pooling", json=body | {"task": "embed"}).json()
    assert len(embed["data"]) == 1 and len(embed["data"][0]["data"]) == 384
    tokens = requests.post(f"{server.url}/pooling", json=body | {"task": "token_embed"}).json()
    assert len(tokens["data"][0]["data"]) == len(input_tokens)
    assert len(tokens["data"][0]["data"][0]) == 384


@pytest.mark.parametrize("task", ["classify", "token_classify", "plugin"])
def test_pooling_not_supported(server, task):
    body = {"model": "m", "input": "test", "encoding_format": "float", "task": task}
    error = requests.post(f"{server.url}/pooling", json=body).json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["message"].startswith(f"Unsupported task: {task!r}")
