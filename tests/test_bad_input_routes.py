"""The bad-input battery on every POST route, each on a model that serves it: a decoder's scoring
and rerank routes, an embedder's embedding routes, a SPLADE model's `/embed_sparse`, BGE-M3's
`/embed_hybrid`, the tokenizer routes. Every route's good body, broken as `tests.test_bad_input`
breaks them (not JSON, not UTF-8, each field of its schema given each JSON kind it does not
accept, a required field missing, an unknown field, deep nesting, huge numbers, NaN, the wrong
method), gets its 4xx in its own peer's error shape with the field named: OpenAI's `error`
object with `param`, or TEI's `{"error", "error_type"}` with the field in its message. A handler
that lets one bad body through fails the battery (`test_a_handler_letting_bad_bodies_through_
fails_the_battery`)."""

import json
from dataclasses import dataclass

import msgspec
import msgspec.inspect as mi
import pytest

from api import (
    cohere_embed,
    embeddings,
    hybrid,
    tei_embed,
    tokens,
    vllm_generative,
    vllm_pooling,
    vllm_score,
)
from api.app import create_app
from api.errors import TYPES
from api.settings import settings_from_env
from bench.retrieval_models import write_m3, write_splade
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import YES, serving, tiny_env
from tests.test_bad_input import DEEP, SAMPLES, broken, json_kinds, nested, raw

DECODER, EMBEDDER, SPLADE, M3 = "decoder", "embedder", "splade", "m3"
RERANK = {"query": "q", "documents": ["a", "b"]}


@dataclass(frozen=True)
class Route:
    path: str
    model: str  # which served model answers it
    good: dict
    schema: type | None  # its one request struct (None: several, told apart by their fields)
    tei: bool = False  # answers in TEI's error shape


ROUTES = [
    Route(
        "/generative_scoring",
        DECODER,
        {"query": "q", "items": ["a"], "label_token_ids": [YES]},
        vllm_generative.GenerativeScoringRequest,
    ),
    Route("/v2/rerank", DECODER, RERANK, None),
    Route("/v1/reranking", DECODER, RERANK, None),
    Route("/score", DECODER, {"queries": "q", "documents": ["a"]}, vllm_score.VllmScoreRequest),
    Route("/invocations", DECODER, RERANK, None),
    Route("/detokenize", DECODER, {"tokens": [1, 2]}, tokens.DetokenizeRequest),
    Route("/decode", DECODER, {"ids": [1, 2]}, tokens.TeiDecodeRequest, tei=True),
    Route("/tokenize", DECODER, {"prompt": "a"}, None),
    Route("/v1/embeddings", EMBEDDER, {"input": ["a"]}, embeddings.EmbeddingRequest),
    Route("/v2/embed", EMBEDDER, {"texts": ["a"]}, cohere_embed.CohereEmbedRequest),
    Route("/pooling", EMBEDDER, {"input": ["a"]}, vllm_pooling.PoolingRequest),
    Route("/embed", EMBEDDER, {"inputs": ["a"]}, tei_embed.TeiEmbedRequest, tei=True),
    Route("/embed_all", EMBEDDER, {"inputs": ["a"]}, tei_embed.TeiEmbedAllRequest, tei=True),
    Route(
        "/similarity",
        EMBEDDER,
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
        tei_embed.SimilarityRequest,
        tei=True,
    ),
    Route("/embed_sparse", SPLADE, {"inputs": ["a"]}, tei_embed.TeiEmbedSparseRequest, tei=True),
    Route("/embed_hybrid", M3, {"inputs": ["a"]}, hybrid.HybridRequest, tei=True),
]


@dataclass(frozen=True)
class Bad:
    route: Route
    name: str
    body: bytes
    param: str | None  # the field its error names (None: the body as a whole)
    status: int = 400  # OpenAI-shaped; TEI's is its own (`tei_status`)
    method: str = "POST"
    within: bool = False  # the error may name a place inside `param` (`param[0][0]`)

    @property
    def id(self) -> str:
        return f"{self.route.path} {self.name}"


def dump(body) -> bytes:
    return json.dumps(body).encode()


def structural(route: Route) -> list[Bad]:
    """Bodies that break whatever the schema: not JSON, not UTF-8, deeply nested, the wrong
    method."""
    out = [
        Bad(route, f"not JSON: {name}", body, None)
        for name, body in broken(route.good)
        if name != "lone surrogate"  # of a string "q"
    ]
    good = dump(route.good)
    if b'"a"' in good:  # a text
        out.append(Bad(route, "not UTF-8", good.replace(b'"a"', b'"a\xff"', 1), None))
        out.append(Bad(route, "lone surrogate", good.replace(b'"a"', b'"\\ud800"', 1), None))
    out.append(Bad(route, "deep nesting", nested(DEEP), None))
    field = next(iter(route.good))
    deep = raw(route.good, field, nested(DEEP))
    out.append(Bad(route, f"deep {field}", deep, _deep_param(route, field), within=True))
    out.append(Bad(route, "GET", b"", None, 405, "GET"))
    return out


def _deep_param(route: Route, field: str) -> str | None:
    """What the error of `field` nested deep names: the field, or a place in its first element
    where it takes a list (None: a route of several schemas)."""
    if route.schema is None:
        return None
    (info,) = [f for f in mi.type_info(route.schema).fields if f.name == field]
    return f"{field}[0]" if "array" in json_kinds(info.type) else field


def per_field(route: Route) -> list[Bad]:
    """Each field given each JSON kind it does not accept, each required one left out, an
    unknown field, a huge number and NaN where a number goes."""
    if route.schema is None:
        return []
    out = []
    fields = mi.type_info(route.schema).fields
    for field in fields:
        accepted = json_kinds(field.type)
        if "number" in accepted:
            accepted.add("integer")  # a float field takes an integer, as JSON's numbers are one
        for kind, value in SAMPLES.items():
            if kind not in accepted:
                body = dump(route.good | {field.name: value})
                out.append(Bad(route, f"{field.name}={kind}", body, field.name))
        if field.required:
            body = dump({k: v for k, v in route.good.items() if k != field.name})
            out.append(Bad(route, f"without {field.name}", body, field.name))
        if accepted & {"integer", "number"}:
            huge = raw(route.good, field.name, b"9" * DEEP)
            out.append(Bad(route, f"{field.name} huge", huge, field.name))
            nan = raw(route.good, field.name, b"NaN")  # not JSON
            out.append(Bad(route, f"{field.name} NaN", nan, None))
    unknown = next(n for n in ("temperature", "zzz") if n not in {f.name for f in fields})
    out.append(Bad(route, "unknown field", dump(route.good | {unknown: 0}), unknown))
    return out


BATTERY = [case for route in ROUTES for case in (*structural(route), *per_field(route))]


def tei_status(status: int) -> int:
    """TEI's status for one of ours (`api.errors.TEI_KINDS`): a bad body is 422 Validation."""
    return 422 if status == 400 else status


def failure(client, case: Bad) -> str | None:
    """Why the answer to `case` is not its documented error (None: it is)."""
    r = client.request(
        case.method,
        case.route.path,
        content=case.body,
        headers={"content-type": "application/json"},
    )
    want = tei_status(case.status) if case.route.tei else case.status
    if r.status_code != want:
        return f"{r.status_code}, not {want}: {r.text[:300]}"
    body = r.json()
    if case.route.tei:
        if set(body) != {"error", "error_type"} or body["error_type"] != "Validation":
            return f"not TEI's error: {body}"
        named = case.param is None or case.param.partition("[")[0] in body["error"]
        return None if named else f"{case.param!r} not named: {body['error']}"
    error = body.get("error")
    if not isinstance(error, dict) or error.get("type") != TYPES[want] or body["code"] != want:
        return f"not the OpenAI error shape: {body}"
    named = error["param"] == case.param or (
        case.within and str(error["param"]).startswith(f"{case.param}[")
    )
    if case.param is not None and not named:
        return f"param {error['param']!r}, not {case.param!r}"
    return None


@pytest.fixture(scope="module")
def clients(tiny_path, minilm, tmp_path_factory):
    """A client of a server on each kind of model, started when first asked for."""
    root, started, stack = tmp_path_factory.mktemp("routes"), {}, []
    options = dict(seed=4, corpus=CORPUS, model_max_length=96, vocab=300)

    def path_of(model: str):
        if model == DECODER:
            return tiny_path
        if model == EMBEDDER:
            return minilm
        if model == SPLADE:
            fields = dict(TINY_ENCODER, type_vocab_size=2)
            return write_splade(root / model, "BertConfig", fields, "bert", **options)
        fields = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
        return write_m3(root / model, fields, **options)

    def client(model: str):
        if model not in started:
            app = create_app(settings_from_env(tiny_env(path_of(model))))
            server = serving(app, "asyncio")
            started[model] = next(server)
            stack.append(server)
        return started[model]

    yield client
    for server in stack:
        server.close()


@pytest.mark.parametrize("route", ROUTES, ids=[r.path for r in ROUTES])
def test_each_routes_good_body_is_answered(clients, route):
    r = clients(route.model).post(route.path, json=route.good)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case", BATTERY, ids=[case.id for case in BATTERY])
def test_bad_input_gets_its_peers_4xx(clients, case):
    assert failure(clients(case.route.model), case) is None


def test_a_handler_letting_bad_bodies_through_fails_the_battery(clients, monkeypatch):
    """The battery's mutation check: `/embed` decoding its body without checking the fields
    (a permissive schema) lets bad bodies through, and the battery names them."""

    class Permissive(msgspec.Struct, kw_only=True):  # TeiEmbedRequest's fields, unchecked
        inputs: object = None
        truncate: object = None
        truncation_direction: object = "right"
        prompt_name: object = None
        normalize: object = True
        dimensions: object = None

    loose = msgspec.json.Decoder(Permissive)
    monkeypatch.setattr(tei_embed, "embed_decoder", loose, raising=True)
    client = clients(EMBEDDER)
    cases = [c for c in BATTERY if c.route.path == "/embed"]
    let_through = [c.name for c in cases if failure(client, c) is not None]
    assert "unknown field" in let_through and "truncate=string" in let_through
