"""The ingress deployment: takes each HTTP request from Ray Serve's proxy, reads its body, computes
its prefix key and forwards it whole to an engine replica through a handle, whose request router
picks the replica from the key. A request whose replica died before answering is sent again to
another (scoring is idempotent), so a lost replica loses no request."""

import logging

from ray import exceptions as ray_errors
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError
from api.ray_serve.asgi import HttpCall
from api.ray_serve.routing import prefix_key
from api.service import read_body

log = logging.getLogger("api")

RETRIES_HEADER = b"x-scoring-retries"  # present when the request was sent again
# the replica's actor died or became unreachable with the call in it
REPLICA_LOST = (ray_errors.RayActorError, ray_errors.ActorUnavailableError)


class Ingress:
    """Forwards every request to the engine deployment; `retries`: how many more replicas to try
    when one is lost with the request."""

    def __init__(self, engine: DeploymentHandle, max_body_bytes: int, retries: int = 2):
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.retries = retries

    async def __call__(self, request: Request) -> Response:
        try:
            body = await read_body(request, self.max_body_bytes)
        except ApiError as e:
            return e.response()
        call = HttpCall(
            method=request.method,
            path=request.scope["path"],
            query_string=request.scope.get("query_string", b""),
            headers=list(request.scope["headers"]),
            body=body,
            root_path=request.scope.get("root_path", ""),
            client=tuple(request.client) if request.client else None,
        )
        prefix = prefix_key(body)
        for attempt in range(self.retries + 1):
            try:
                answer = await self.engine.handle.remote(call, prefix=prefix)
                break
            except REPLICA_LOST as e:
                if attempt == self.retries:
                    message = f"the engine replicas were lost {attempt + 1} times with this request"
                    return ApiError(503, message, headers={"Retry-After": "1"}).response()
                log.warning("replica lost with a request (%s); sending it again", type(e).__name__)
        response = Response(answer.body, answer.status)
        retried = [(RETRIES_HEADER, b"%d" % attempt)] if attempt else []
        response.raw_headers = [*answer.headers, *retried]
        return response
