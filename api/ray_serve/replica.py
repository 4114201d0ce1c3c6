"""A replica of the engine deployment: the service's Starlette app, with its engine, answering the
HTTP calls the ingress forwards; and what it tells Ray Serve (health, cached prefixes, queue)."""

import asyncio
from collections import OrderedDict

from ray import serve

from api.app import create_app
from api.ray_serve.asgi import HttpAnswer, HttpCall, InProcessApp
from api.ray_serve.routing import Key
from api.service import Service

REPLICA_HEADER = b"x-scoring-replica"  # which replica answered
HEALTH = HttpCall("GET", "/health")
BLOCK_TOKENS = 64  # about the tokens of a 256-character routing block


class RecentPrefixes:
    """The prefix hashes of the requests this replica served, newest last, at most `capacity`:
    what its KV cache most likely still holds (the cache evicts least recently used too)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def add(self, key: Key) -> None:
        for h in key:
            self._hashes[h] = None
            self._hashes.move_to_end(h)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def hashes(self) -> list[int]:
        return list(self._hashes)


class EngineReplica:
    """One engine, configured by this process's `SCORING_*` variables (the deployment passes the
    driver's), ready when constructed: Ray routes nothing here while it loads and compiles."""

    async def __init__(self, summary_size: int | None = None):
        self.app = create_app()
        self.service: Service = self.app.state.service
        self.runner = InProcessApp(self.app)
        await self.runner.start()
        for name, host in self.service.hosts.items():
            await asyncio.to_thread(host.settled.wait)
            if host.status != "ready":
                await self.runner.stop()
                raise RuntimeError(f"the engine of {name} did not start: {host.error}")
        self.prefixes = RecentPrefixes(summary_size or self._pool_blocks())
        self.name = serve.get_replica_context().replica_id.unique_id.encode()

    def _pool_blocks(self) -> int:
        stats, page = self.service.stats(), self.service.settings.engine.kv_page_size
        tokens = (stats.kv_pages_used + stats.kv_pages_free) * page
        return max(256, tokens // BLOCK_TOKENS)

    async def handle(self, call: HttpCall, prefix: Key = ()) -> HttpAnswer:
        """The app's answer to `call`; `prefix` (the request's routing key) is remembered as
        cached here once the answer is a success."""
        answer = await self.runner(call)
        if answer.status < 400:
            self.prefixes.add(prefix)
        headers = [*answer.headers, (REPLICA_HEADER, self.name)]
        return HttpAnswer(answer.status, headers, answer.body)

    async def check_health(self) -> None:
        """Ray Serve's health check: the app's `/health` must answer 200."""
        answer = await self.runner(HEALTH)
        if answer.status != 200:
            raise RuntimeError(f"/health answered {answer.status}: {answer.body[:200]!r}")

    def record_routing_stats(self) -> dict:
        """What the prefix-affinity router reads: the prefixes this replica most likely holds."""
        return {"prefixes": self.prefixes.hashes()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What the queue-depth autoscaling policy reads."""
        stats = self.service.stats()
        if stats is None:
            return {"queued_tokens": 0.0, "in_flight": 0.0}
        return {"queued_tokens": float(stats.queued_tokens), "in_flight": float(stats.in_flight)}

    async def __del__(self):
        # Ray Serve calls this after the replica's ongoing requests have drained
        await self.runner.stop()
