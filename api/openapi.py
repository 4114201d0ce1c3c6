"""The OpenAPI 3.1 document, generated from the msgspec schemas of `api.schemas`."""

import msgspec

from api import schemas

REF = "#/components/schemas/{name}"


def _ref(cls) -> dict:
    return {"$ref": REF.format(name=cls.__name__)}


def _json(cls) -> dict:
    return {"content": {"application/json": {"schema": _ref(cls)}}}


def _answer(cls, description: str, *errors: int) -> dict:
    answers = {"200": {"description": description, **(_json(cls) if cls else {})}}
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


def _get(summary: str, response=None, *errors: int) -> dict:
    return {"get": {"summary": summary, "responses": _answer(response, summary, *errors)}}


def openapi(title: str, version: str) -> dict:
    """The whole document; request and response bodies refer to generated components."""
    _, components = msgspec.json.schema_components(
        schemas.REQUESTS + schemas.RESPONSES, ref_template=REF
    )
    scoring_errors = (400, 401, 413, 499, 500, 503)
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
        "/health": _get("Ready (200) or loading (503)", schemas.HealthResponse, 503),
        "/v1/models": _get("The served model", schemas.ModelList, 401),
        "/get_model_info": _get("Model facts", None, 401, 503),
        "/get_server_info": _get("Configuration, buckets and engine counters", None, 401),
        "/metrics": _get("Prometheus metrics (text format)", None, 401),
        "/start_profile": _post(
            "Start a JAX profiler trace", schemas.ProfileRequest, schemas.ProfileResponse, 400, 409
        ),
        "/stop_profile": _post(
            "Stop the trace", schemas.ProfileRequest, schemas.ProfileResponse, 400, 409
        ),
        "/openapi.json": _get("This document", None, 401),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
