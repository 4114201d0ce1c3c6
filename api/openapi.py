"""What is built from the route table (`api.routes.ENDPOINTS`): each `Endpoint`'s Starlette
route (`route`), and the OpenAPI 3.1 document (`openapi`), where each names its handler and its
request, answer and error bodies, msgspec Structs of `api.schemas` whose JSON Schemas become the
document's components."""

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.errors import ApiError, internal_error
from api.service import Service
from engine.capabilities import Ability

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
    "VllmScoreRequest": [  # one pair of sides
        {"required": list(pair)}
        for pair in (("queries", "documents"), ("queries", "items"), ("text_1", "text_2"))
    ]
    + [{"required": ["data_1", "data_2"]}],
    "RerankRequest": [  # one of `documents`, `texts` and `input`
        {
            "required": ["documents"],
            "not": {"anyOf": [{"required": [f]} for f in ("texts", "input")]},
        },
        {
            "required": ["texts"],
            "not": {"anyOf": [{"required": [f]} for f in ("documents", "input")]},
        },
        {
            "required": ["input"],
            "not": {"anyOf": [{"required": [f]} for f in ("documents", "texts")]},
        },
    ],
}

# the bodies of answers that have no Struct
ANY_JSON = {"content": {"application/json": {"schema": {"type": "object"}}}}
PLAIN_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}
HTML = {"content": {"text/html": {"schema": {"type": "string"}}}}
NO_BODY: dict = {}

# a Struct of `api.schemas` (or a list of them), one of the contents above, or a tuple of
# bodies: one of them
Body = type[msgspec.Struct] | Any | dict | tuple
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
    request: Body | None = None  # the JSON body it reads, if any
    body_required: bool = True
    errors: tuple[int, ...] = ()  # statuses answered with an `error_body`
    error_body: Body = schemas.ErrorResponse  # TEI's routes: ours or TEI's
    answers: tuple[Answer, ...] = ()
    open_access: bool = False  # served without the API key
    # what the model must be able to do for the route to serve it (any of them: the route's
    # bodies may ask several ways); none: it serves any model
    needs: tuple[Ability, ...] = ()
    # the answer to a request without the key, instead of the JSON 401 when it gives one
    unauthorized: Callable[[Request], Response | None] | None = None


def openapi(title: str, version: str, endpoints: Sequence[Endpoint]) -> dict:
    """The whole document, in JSON's types; request and response bodies refer to generated
    components."""
    bodies = _bodies(endpoints)
    found, components = msgspec.json.schema_components(bodies, ref_template=REF)
    schema_of = dict(zip(bodies, found, strict=True))
    for name, branches in ONE_OF.items():
        if name in components:
            components[name] = components[name] | {"oneOf": branches}
    paths: dict[str, dict] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, schema_of)
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


def _bodies(endpoints: Iterable[Endpoint]) -> tuple:
    """Every body type of `endpoints` (not the fixed contents), once, in order of mention."""
    found: dict = {}
    for e in endpoints:
        bodies = [e.request, e.response, *(a.body for a in e.answers)]
        bodies += [e.error_body] if e.errors else []
        bodies = [b for body in bodies for b in (body if isinstance(body, tuple) else (body,))]
        found |= {body: None for body in bodies if body is not None and not isinstance(body, dict)}
    return tuple(found)


def _operation(e: Endpoint, schema_of: dict) -> dict:
    def content(body: Body) -> dict:
        if isinstance(body, dict):
            return body
        schema = {"oneOf": [schema_of[b] for b in body]} if isinstance(body, tuple) else None
        return {"content": {"application/json": {"schema": schema or schema_of[body]}}}

    operation: dict = {"summary": e.summary}
    if e.request is not None:
        operation["requestBody"] = {"required": e.body_required, **content(e.request)}
    error = {"description": "error", **content(e.error_body)}
    responses = {"200": {"description": e.summary, **content(e.response)}}
    responses |= {str(status): error for status in e.errors}
    responses |= {
        str(a.status): {"description": a.description, **content(a.body)} for a in e.answers
    }
    operation["responses"] = responses
    if e.open_access:
        operation["security"] = []
    return operation


def route(e: Endpoint) -> Route:
    """The Starlette route of `e`: authorisation first (unless open; a refusal is answered by
    `e.unauthorized` when it gives an answer), and an unexpected exception logged and answered
    as a 500."""

    @functools.wraps(e.handler)
    async def handle(request: Request) -> Response:
        service: Service = request.app.state.service
        if not e.open_access:
            try:
                service.authorize(request)
            except ApiError:
                answer = e.unauthorized(request) if e.unauthorized else None
                if answer is None:
                    raise
                return answer
        try:
            return await e.handler(service, request)
        except ApiError:
            raise
        except Exception as error:
            raise internal_error(error) from error

    return Route(e.path, handle, methods=[e.method])
