"""The OpenAPI 3.1 document, generated from the msgspec schemas of `api.schemas`."""

import msgspec

from api import schemas

REF = "#/components/schemas/{name}"
# JSON Schema counts 2.0 as an integer; the decoders do not, so the document says so
DESCRIPTION = "Integer fields take JSON integers: no fraction or exponent (2, not 2.0)."
_ARRAY, _TEXT = {"type": "array"}, {"type": "string"}
# rules joining fields, which one msgspec Struct cannot state: exactly one branch holds
ONE_OF = {
    "ScoreRequest": [  # all text or all token ids
        {"properties": {"query": _TEXT, "items": {"anyOf": [_TEXT, {"items": _TEXT}]}}},
        {"properties": {"query": _ARRAY, "items": {**_ARRAY, "items": _ARRAY}}},
    ],
    "RerankRequest": [  # `documents` or `texts`, not both
        {"properties": {"documents": _ARRAY}, "required": ["documents"]},
        {"properties": {"texts": _ARRAY}, "required": ["texts"]},
    ],
}


def _ref(cls) -> dict:
    return {"$ref": REF.format(name=cls.__name__)}


def _json(cls) -> dict:
    return {"content": {"application/json": {"schema": _ref(cls)}}}


# the bodies of answers that have no Struct
ANY_JSON = {"content": {"application/json": {"schema": {"type": "object"}}}}
PLAIN_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}


def _answer(body, description: str, *errors: int) -> dict:
    """`body`: a Struct of `api.schemas`, or one of the contents above."""
    content = body if isinstance(body, dict) else _json(body)
    answers = {"200": {"description": description, **content}}
    error = {"description": "error", **_json(schemas.ErrorResponse)}
    return answers | {str(status): error for status in errors}


def _post(summary: str, request, response, *errors: int) -> dict:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": request is not schemas.ProfileRequest, **_json(request)},
            "responses": _answer(response, summary, *errors),
        }
    }


def _get(summary: str, response, *errors: int) -> dict:
    return {"get": {"summary": summary, "responses": _answer(response, summary, *errors)}}


def _health() -> dict:
    """Open without a key; while the engine is not ready the 503 carries the same body."""
    health = _get("Ready (200) or loading (503)", schemas.HealthResponse)
    responses = health["get"]["responses"]
    responses["503"] = {"description": "loading or failed", **_json(schemas.HealthResponse)}
    health["get"]["security"] = []
    return health


def openapi(title: str, version: str) -> dict:
    """The whole document; request and response bodies refer to generated components."""
    _, components = msgspec.json.schema_components(
        schemas.REQUESTS + schemas.RESPONSES, ref_template=REF
    )
    for name, branches in ONE_OF.items():
        components[name] = components[name] | {"oneOf": branches}
    scoring_errors = (400, 401, 413, 499, 500, 503)
    profile = (schemas.ProfileRequest, schemas.ProfileResponse)
    rerank = _post(
        "Rerank documents by relevance",
        schemas.RerankRequest,
        schemas.RerankResponse,
        *scoring_errors,
    )
    paths = {
        "/v1/score": _post(
            "Label-token probabilities per item (sglang)",
            schemas.ScoreRequest,
            schemas.ScoreResponse,
            *scoring_errors,
        ),
        "/v1/rerank": rerank,
        "/rerank": rerank,
        "/health": _health(),
        "/v1/models": _get("The served model", schemas.ModelList, 401),
        "/get_model_info": _get("Model facts", ANY_JSON, 401, 503),
        "/get_server_info": _get("Configuration, buckets and engine counters", ANY_JSON, 401),
        "/metrics": _get("Prometheus metrics (text format)", PLAIN_TEXT, 401),
        "/start_profile": _post("Start a JAX profiler trace", *profile, 400, 401, 409, 413),
        "/stop_profile": _post("Stop the trace", *profile, 400, 401, 409, 413),
        "/openapi.json": _get("This document", ANY_JSON, 401),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": DESCRIPTION},
        "paths": paths,
        "security": [{"bearer": []}, {}],  # a key only when the server has one
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
