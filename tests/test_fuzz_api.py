"""Schemathesis over `/openapi.json`: every operation fuzzed in process against the ASGI app on
the tiny model, and the embedding operations again on the real all-MiniLM-L6-v2 embedder, with
bodies that fit the schema and bodies that do not. No answer is a 5xx, and every answer is one
the document describes (status, content type, body schema).

`FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz_api.py` fuzzes longer (40 per operation).
"""

import os
import re
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient

from api.app import create_app
from api.routes import document
from api.settings import settings_from_env
from bench.colbert_models import write_colbert
from bench.retrieval_models import write_m3, write_splade
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import tiny_env, wait_until

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
DOCUMENT = document()
CONFIG = SchemathesisConfig.from_dict({"output": {"sanitization": {"enabled": False}}})
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)

# What a schema-valid body may still be refused for: rules the document states in words, as
# they depend on the model (vocabulary, context), join fields (text or ids, documents or texts)
# or are finer than JSON Schema's types (2.0 is an integer there)
BEYOND_SCHEMA = re.compile(
    r"outside the vocabulary|out of vocabulary range|exceed|^query/items: must be all text|"
    r"give the documents as one of|give the two sides|^output_dir: must be|no tokens|"
    r"cannot be empty|must not be empty|^Input lengths|^At least one|required \(or name the|"
    r"has none of the rank_fields|must be a string|queries are never cut|has no prompts|"
    r"select a smaller truncation size|not an embedder|not a sparse encoder|"
    r"not a multi-vector or hybrid embedder|ask for at least one of dense, sparse and multi|"
    r"differs from dimensions \(give one\)|"
    r"dimensions?: this model (answers \d+ dimensions and is not|is) trained for|as input\[0\]$|"
    r"needs at least \d+ tokens for this model|^prompt_name: unknown prompt|"
    r"all items are texts or all token ids|applies to texts; token ids are embedded as given|"
    r"give one id list or a list of id lists|"
    r"^embedding_mode: applies to task token_embed|is its older name; give one of them|"
    r"vLLM's encoding applies to float vectors|must be at most \d+, the model's width|"
    r"late-interaction model|^Unsupported task: |"
    r"^Expected `int[^`]*`, got `float`"
)


@pytest.fixture(scope="module")
def app(tiny_checkpoints, tmp_path_factory):
    """The service on the tiny model, its engine ready; its lifespan ends with the module."""
    profiles = tmp_path_factory.mktemp("profiles")
    env = tiny_env(tiny_checkpoints["llama-untied"], SCORING_PROFILE_DIR=str(profiles))
    app = create_app(settings_from_env(env))
    with asgi.get_client(app) as client:
        wait_ready(client)
        yield app
        client.post("/stop_profile")  # the profiler is process-wide: leave none running
    asgi.shutdown_lifespans()


def wait_ready(client) -> None:
    assert wait_until(lambda: client.get("/health").status_code == 200)


def test_the_fuzzed_document_is_the_served_one(app):
    with asgi.get_client(app) as client:
        assert client.get("/openapi.json").json() == DOCUMENT


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/health", None, 503),
        ("GET", "/get_model_info", None, 503),
        ("GET", "/v1/models", None, 200),  # the model's facts null
        ("GET", "/get_server_info", None, 200),  # the engine's parts null
        ("POST", "/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [1]}, 503),
        ("POST", "/v1/rerank", {"query": "q", "documents": ["a"]}, 503),
    ],
)
def test_answers_before_the_engine_is_ready_are_documented(
    tiny_checkpoints, method, path, body, status
):
    app = create_app(settings_from_env(tiny_env(tiny_checkpoints["llama-untied"])))
    response = TestClient(app).request(method, path, json=body)  # no lifespan: no engine
    assert response.status_code == status
    schema[path][method].validate_response(response)


# per operation, the schema-valid cases answered 2xx: every fuzzed operation must have some, or
# the allowance above would be hiding an operation that refuses everything
ACCEPTED: Counter[str] = Counter()
POSITIVE: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def every_operation_accepts_valid_bodies():
    yield
    refused = sorted(op for op in POSITIVE if not ACCEPTED[op])
    assert not refused, f"no schema-valid body answered 2xx: {refused} ({dict(POSITIVE)})"


def accepted_unless_beyond_schema(ctx, response, case) -> None:
    """A body that fits the schema is answered, or refused only for a rule the schema cannot
    state (a 400 or 413 naming it)."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    POSITIVE[case.operation.label] += 1
    ACCEPTED[case.operation.label] += response.status_code < 300
    if response.status_code in (400, 413, 422):
        error = response.json()["error"]
        message = error if isinstance(error, str) else error["message"]  # TEI's, or ours
        assert BEYOND_SCHEMA.search(message), f"schema-valid body refused: {message}"


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # the same examples on every machine: none replayed from an earlier run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def answers_as_documented(app, case) -> None:
    """`case` sent to `app`: an answer the document describes, no 5xx."""
    # schemathesis may end the app's lifespan between operations; a new one loads the engine in
    # the background, and its 503s while loading are documented but not what is fuzzed here
    with asgi.get_client(app) as client:
        wait_ready(client)
    response = case.call_and_validate(
        app=app,
        excluded_checks=[positive_data_acceptance],
        additional_checks=[accepted_unless_beyond_schema],
    )
    assert response.status_code < 500, response.text


@schema.parametrize()
@FUZZ
def test_every_operation_answers_as_documented(app, case):
    answers_as_documented(app, case)


EMBEDDING_OPERATIONS = schema.include(
    path_regex=r"^/(v1/embeddings|v2/embed|embed|embed_all|similarity|pooling)$"
)


@pytest.fixture(scope="module")
def embedder_app(minilm):
    """The service on the real embedder, its engine ready; its lifespan ends with the module."""
    app = create_app(settings_from_env(tiny_env(minilm)))
    with asgi.get_client(app) as client:
        wait_ready(client)
        yield app
    asgi.shutdown_lifespans()


@EMBEDDING_OPERATIONS.parametrize()
@FUZZ
def test_every_embedding_operation_answers_an_embedder_as_documented(embedder_app, case):
    answers_as_documented(embedder_app, case)


HYBRID_OPERATIONS = {  # the routes a sparse encoder and a hybrid embedder answer
    "sparse": schema.include(path_regex=r"^/embed_sparse$"),
    "hybrid": schema.include(path_regex=r"^/(embed_hybrid|embed_sparse|pooling|v1/rerank)$"),
    "colbert": schema.include(path_regex=r"^/(pooling|v1/rerank|score)$"),
}


@pytest.fixture(scope="module")
def retrieval_apps(tmp_path_factory):
    """The service on a tiny SPLADE model, a tiny BGE-M3 and a tiny ColBERT model, each started
    when first asked for; their lifespans end with the module."""
    root, apps = tmp_path_factory.mktemp("retrieval"), {}
    options = dict(seed=3, corpus=CORPUS, model_max_length=96, vocab=300)

    def app(kind: str):
        if kind not in apps:
            if kind == "sparse":
                fields = dict(TINY_ENCODER, type_vocab_size=2)
                path = write_splade(root / kind, "BertConfig", fields, "bert", **options)
            elif kind == "colbert":
                path = write_colbert(root / kind, seed=3)
            else:
                fields = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
                path = write_m3(root / kind, fields, **options)
            apps[kind] = create_app(settings_from_env(tiny_env(path)))
            with asgi.get_client(apps[kind]) as client:
                wait_ready(client)
        return apps[kind]

    yield app
    asgi.shutdown_lifespans()


@HYBRID_OPERATIONS["sparse"].parametrize()
@FUZZ
def test_the_sparse_route_answers_a_splade_model_as_documented(retrieval_apps, case):
    answers_as_documented(retrieval_apps("sparse"), case)


@HYBRID_OPERATIONS["hybrid"].parametrize()
@FUZZ
def test_the_hybrid_routes_answer_bge_m3_as_documented(retrieval_apps, case):
    answers_as_documented(retrieval_apps("hybrid"), case)


@HYBRID_OPERATIONS["colbert"].parametrize()
@FUZZ
def test_the_late_interaction_routes_answer_colbert_as_documented(retrieval_apps, case):
    answers_as_documented(retrieval_apps("colbert"), case)
