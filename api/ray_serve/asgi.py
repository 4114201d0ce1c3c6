"""An ASGI app driven inside this process: its lifespan started and stopped, and requests
answered whole. A replica runs the service's Starlette app this way, behind a Ray handle."""

import asyncio
from collections.abc import Callable

import msgspec

Headers = list[tuple[bytes, bytes]]


class HttpCall(msgspec.Struct, frozen=True):
    """One HTTP request, as the ingress forwards it."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Headers = []
    body: bytes = b""
    root_path: str = ""
    client: tuple[str, int] | None = None


class HttpAnswer(msgspec.Struct, frozen=True):
    """The whole HTTP response to an `HttpCall`."""

    status: int
    headers: Headers
    body: bytes


class LifespanError(RuntimeError):
    """The app's startup or shutdown failed."""


class InProcessApp:
    """Runs `app`'s lifespan in a task of the current asyncio loop and answers `HttpCall`s."""

    def __init__(self, app: Callable):
        self.app = app
        self._to_app: asyncio.Queue = asyncio.Queue()
        self._from_app: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Run the app's startup; LifespanError if it fails."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._lifespan("startup")

    async def stop(self) -> None:
        """Run the app's shutdown (the engine drains and closes)."""
        if self._task is not None and not self._task.done():
            await self._lifespan("shutdown")
            await self._task

    async def _lifespan(self, phase: str) -> None:
        await self._to_app.put({"type": f"lifespan.{phase}"})
        reply = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait({reply, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():  # the app returned or raised without answering
            reply.cancel()
            error = self._task.exception()
            raise LifespanError(f"the app's {phase} failed: {error!r}") from error
        message = reply.result()
        if message["type"] != f"lifespan.{phase}.complete":
            raise LifespanError(f"the app's {phase} failed: {message.get('message', '')}")

    async def __call__(self, call: HttpCall) -> HttpAnswer:
        """The app's answer to `call`. Cancelling the caller disconnects the request."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": call.method,
            "scheme": "http",
            "path": call.path,
            "raw_path": call.path.encode(),
            "root_path": call.root_path,
            "query_string": call.query_string,
            "headers": call.headers,
            "client": call.client,
            "server": None,
        }
        answer = _Answer()
        await self.app(scope, _receiver(call.body), answer.send)
        return answer.whole()


def _receiver(body: bytes) -> Callable:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until this call is cancelled
        raise AssertionError("unreachable")

    return receive


class _Answer:
    def __init__(self):
        self.status = 500
        self.headers: Headers = []
        self.chunks: list[bytes] = []

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))

    def whole(self) -> HttpAnswer:
        return HttpAnswer(self.status, self.headers, b"".join(self.chunks))
