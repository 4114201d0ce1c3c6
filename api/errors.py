"""Errors as `{"error": {"message", "type", "param", "code"}}` with the same four fields at the
top level too (SGLang's older clients read them there); TEI's requests get TEI's body. The
exception types, their mappings, handlers.

Routes raise `ApiError`; decode and engine failures are turned into one by `decode_error` (which
takes `param` from the field path in msgspec's message) and `engine_error` (which takes it from
the engine's `InvalidInput.field`). A user's mistake is
never a 500; anything unexpected is, with a log line, and the server keeps serving.
"""

import logging
import re

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from api.schemas import ErrorDetail, ErrorResponse, TeiErrorResponse, encode
from engine import EngineClosed, EngineError, EngineOverloaded, InvalidInput, Unsupported

log = logging.getLogger("api")

CLIENT_CLOSED = 499  # nginx's status for a client that went away before the answer

# the error types vLLM and SGLang answer (OpenAI-style clients read them)
TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    CLIENT_CLOSED: "ClientClosedRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An HTTP error answer: status, message, the offending field and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        empty: bool = False,
        unsupported: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or TYPES.get(status, "error")
        self.headers = headers or {}
        self.overloaded = False  # a 503 for too much work, not for a server that is down
        self.empty = empty  # a 400 for no input at all (TEI's `Empty`)
        self.unsupported = unsupported  # a 400 for what the model cannot do (TEI's `Backend`)

    def response(self) -> Response:
        fields = dict(message=self.message, type=self.type, param=self.param, code=self.status)
        body = encode(ErrorResponse(error=ErrorDetail(**fields), detail=self.message, **fields))
        return Response(body, self.status, self.headers, media_type="application/json")


class TeiError(ApiError):
    """An error answered as TEI answers it: `{"error", "error_type"}`, with TEI's status for
    its kind (a bad input is 422 Validation, no input 400 Empty, a full queue 429 Overloaded, a
    verb the model does not serve 424 Backend)."""

    def __init__(self, error: ApiError):
        other = (error.status, "Validation" if error.status < 500 else "Backend")
        status, kind = TEI_KINDS.get(error.status, other)
        if error.status == 503 and not error.overloaded:
            status, kind = 503, "Unhealthy"
        if error.empty:
            status, kind = 400, "Empty"
        if error.unsupported:  # TEI's answer where the model is not of the route's kind
            status, kind = 424, "Backend"
        super().__init__(status, error.message, param=error.param, headers=error.headers)
        self.kind = kind

    def response(self) -> Response:
        body = encode(TeiErrorResponse(error=self.message, error_type=self.kind))
        return Response(body, self.status, self.headers, media_type="application/json")


# our status -> TEI's (status, error_type)
TEI_KINDS = {
    400: (422, "Validation"),
    500: (424, "Backend"),
    503: (429, "Overloaded"),
}


_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<field>[^`]+)`")
# an absolute POSIX or Windows path, `/a/b.py` or `C:\\a`, but not the `/b` of `a/b` or `1/2`
_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[\\/][^\s'\"`:;,()<>]+")
MAX_PUBLIC = 500


def decode_error(error: msgspec.MsgspecError | UnicodeDecodeError) -> ApiError:
    """400 for a body that is not JSON or does not fit the schema, naming the field."""
    if isinstance(error, UnicodeDecodeError):  # msgspec's error for invalid UTF-8 in a string
        return ApiError(400, "invalid JSON: the body is not valid UTF-8")
    message = str(error)
    if not isinstance(error, msgspec.ValidationError):
        return ApiError(400, f"invalid JSON: {message}")
    at = _AT.search(message)
    path = at["path"].replace("[...]", "") if at else ""  # a JSON object's value: the object
    field = _FIELD.match(message)
    if field:
        path = f"{path}.{field['field']}" if path else field["field"]
    return ApiError(400, message, param=path or None)


def engine_error(
    error: Exception, *, retry_after_s: int, renames: dict[str, str] | None = None
) -> ApiError:
    """The answer to an exception from `Engine.score` / `Engine.rerank`.

    `renames` maps the engine's field names to the request's (TEI's `texts` for `documents`).
    """
    if isinstance(error, EngineOverloaded | EngineClosed):
        answer = ApiError(503, str(error), headers={"Retry-After": str(retry_after_s)})
        answer.overloaded = isinstance(error, EngineOverloaded)
        return answer
    if isinstance(error, InvalidInput):  # over-long or too many too: 400, as vLLM answers
        error = error.renamed(renames or {})
        return ApiError(400, str(error), param=error.field)
    if isinstance(error, Unsupported):  # the served model's limit, as vLLM answers it
        return ApiError(400, str(error), unsupported=True)
    if isinstance(error, EngineError):
        log.error("engine failure: %s", error)
        return ApiError(500, f"engine failure: {public_message(str(error))}")
    return internal_error(error)


def internal_error(error: BaseException) -> ApiError:
    """A 500 for a failure that is ours, logged with its traceback."""
    log.error("internal error: %s: %s", type(error).__name__, error, exc_info=error)
    return ApiError(500, f"internal error: {type(error).__name__}: {public_message(str(error))}")


def public_message(message: str) -> str:
    """What a 500's body may show of an exception's text: its first line, file paths replaced.
    The log keeps all of it; a client learns nothing of the server's files or tracebacks."""
    first = message.strip().partition("\n")[0]
    return _PATH.sub("<path>", first)[:MAX_PUBLIC]


async def on_api_error(request: Request, error: ApiError) -> Response:
    return error.response()


async def on_exception(request: Request, error: Exception) -> Response:
    return internal_error(error).response()


def handlers(tei_paths: frozenset[str] = frozenset()) -> dict:
    """The app's exception handlers; an HTTP error of the router's own (a wrong method) on a
    path of `tei_paths` is answered in TEI's shape, as that route's other errors are."""

    async def on_http_exception(request: Request, error: HTTPException) -> Response:
        headers = dict(error.headers or {})
        answer = ApiError(error.status_code, error.detail, headers=headers)
        return (TeiError(answer) if request.url.path in tei_paths else answer).response()

    return {ApiError: on_api_error, HTTPException: on_http_exception, Exception: on_exception}
