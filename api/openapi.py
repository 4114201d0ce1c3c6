"""The OpenAPI 3.1 document, generated from the route table (`api.routes.ENDPOINTS`): each
`Endpoint` names its handler and its request, answer and error bodies, msgspec Structs of
`api.schemas` whose JSON Schemas become the document's components."""

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import schemas
from api.service import Service

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

# the bodies of answers that have no Struct
ANY_JSON = {"content": {"application/json": {"schema": {"type": "object"}}}}
PLAIN_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}

Body = type[msgspec.Struct] | dict  # a Struct of `api.schemas`, or one of the contents above
Handler = Callable[[Service, Request], Awaitable[Response]]


class Answer(NamedTuple):
    """A documented answer whose body is not an `ErrorResponse`, besides the 200."""

    status: int
    description: str
    body: Body


class Endpoint(NamedTuple):
    """One operation of the API: the route that serves it and what the document says of it."""

    path: str
    method: str  # "GET" or "POST"
    handler: Handler
    summary: str
    response: Body  # the 200's body
    request: type[msgspec.Struct] | None = None  # the JSON body it reads, if any
    body_required: bool = True
    errors: tuple[int, ...] = ()  # statuses answered with an `ErrorResponse`
    answers: tuple[Answer, ...] = ()
    open_access: bool = False  # served without the API key


def openapi(title: str, version: str, endpoints: Sequence[Endpoint]) -> dict:
    """The whole document, in JSON's types; request and response bodies refer to generated
    components."""
    _, components = msgspec.json.schema_components(_structs(endpoints), ref_template=REF)
    for name, branches in ONE_OF.items():
        if name in components:
            components[name] = components[name] | {"oneOf": branches}
    paths: dict[str, dict] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e)
    document = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": DESCRIPTION},
        "paths": paths,
        "security": [{"bearer": []}, {}],  # a key only when the server has one
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    # through JSON: the default of a tuple field is a tuple here, a list in the served document
    return msgspec.json.decode(msgspec.json.encode(document))


def _structs(endpoints: Iterable[Endpoint]) -> tuple[type, ...]:
    """Every Struct a body of `endpoints` refers to, once, in order of first mention."""
    found: dict[type, None] = {}
    for e in endpoints:
        bodies = [e.request, e.response, *(a.body for a in e.answers)]
        bodies += [schemas.ErrorResponse] if e.errors else []
        found |= {body: None for body in bodies if isinstance(body, type)}
    return tuple(found)


def _operation(e: Endpoint) -> dict:
    operation: dict = {"summary": e.summary}
    if e.request is not None:
        operation["requestBody"] = {"required": e.body_required, **_content(e.request)}
    error = {"description": "error", **_content(schemas.ErrorResponse)}
    responses = {"200": {"description": e.summary, **_content(e.response)}}
    responses |= {str(status): error for status in e.errors}
    responses |= {
        str(a.status): {"description": a.description, **_content(a.body)} for a in e.answers
    }
    operation["responses"] = responses
    if e.open_access:
        operation["security"] = []
    return operation


def _content(body: Body) -> dict:
    if isinstance(body, dict):
        return body
    ref = {"$ref": REF.format(name=body.__name__)}
    return {"content": {"application/json": {"schema": ref}}}
