"""Prometheus metrics: request counts by status (and by the model asked), per-stage latency
histograms, and the engine's counters (queue depth, real vs padded batch tokens, prefix tokens
saved, compiles) read at scrape time, each labelled with its `model` where the server serves
several. Each app owns its registry, so several apps can live in one process.
"""

import contextlib
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.errors import ApiError
from engine import EngineStats, Timings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGES = Timings.__struct_fields__  # batch_build and device each also split in two
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The service's metrics; `render()` is the `/metrics` body."""

    def __init__(self, stats: Callable[[], list[tuple[str, EngineStats]]]):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "scoring_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.stages = Histogram(
            "scoring_stage_seconds",
            "Per-request time in each engine stage",
            ["stage"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.items = Counter(
            "scoring_items",
            "Items scored (documents for rerank)",
            ["route"],
            registry=self.registry,
        )
        self.model_requests = Counter(
            "scoring_model_requests",
            "Requests each model was asked to answer, by model and status",
            ["model", "status"],
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(stats))

    def observe(self, route: str, timings: Timings, items: int) -> None:
        """Record one successful request's stage times and item count."""
        for stage in STAGES:
            self.stages.labels(stage).observe(getattr(timings, stage))
        self.items.labels(route).inc(items)

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    @contextlib.contextmanager
    def answering(self, model: str) -> Iterator[None]:
        """Count one request to `model` by how the block ends: 200, the status of an ApiError
        raised, else 500."""
        status = 500
        try:
            yield
            status = 200
        except ApiError as e:
            status = e.status
            raise
        finally:
            self.model_requests.labels(model, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """The engines' own counters, read when Prometheus scrapes (nothing while they load): one
    engine's as they are, several engines' each with its `model` label."""

    def __init__(self, stats: Callable[[], list[tuple[str, EngineStats]]]):
        self.stats = stats  # (served name, stats) of each ready engine, in order

    def describe(self) -> list[Metric]:
        return []  # dynamic: the engines may not exist yet

    def collect(self) -> Iterator[Metric]:
        engines = self.stats()
        if len(engines) == 1:
            yield from _engine_metrics(engines[0][1])
            return
        merged: dict[str, Metric] = {}
        for name, s in engines:
            for m in _engine_metrics(s):
                into = merged.setdefault(m.name, Metric(m.name, m.documentation, m.type))
                into.samples += [x._replace(labels={**x.labels, "model": name}) for x in m.samples]
        yield from merged.values()


def _engine_metrics(s: EngineStats) -> Iterator[Metric]:
    yield _gauge("scoring_queue_depth", "Requests waiting to be batched", s.queue_depth)
    yield _gauge("scoring_queued_tokens", "Tokens of the requests waiting", s.queued_tokens)
    yield _gauge("scoring_requests_in_flight", "Requests inside the engine", s.in_flight)
    yield _counter("scoring_batches", "Batches run on the device", s.batches)
    runners = CounterMetricFamily(
        "scoring_runner_batches", "Batches run by each device runner", labels=["runner"]
    )
    for i, n in enumerate(s.runner_batches):
        runners.add_metric([str(i)], n)
    yield runners
    yield _counter("scoring_failed_batches", "Batches whose device step failed", s.failed_batches)
    tokens = CounterMetricFamily(
        "scoring_batch_tokens", "Batch tokens, real or padding", labels=["kind"]
    )
    tokens.add_metric(["real"], s.real_tokens)
    tokens.add_metric(["padded"], s.padded_tokens)
    yield tokens
    yield _counter(
        "scoring_prefix_tokens_saved",
        "Tokens not computed thanks to shared prefixes",
        s.prefix_tokens_saved,
    )
    yield _counter("scoring_compiles", "Programs compiled", s.compiles)
    yield _gauge(
        "scoring_grid_compiled",
        "1 once the bucket grid is compiled (0 while it compiles in the background)",
        float(s.grid_compiled),
    )
    yield _counter("scoring_device_busy_seconds", "Time the device ran batches", s.device_busy_s)
    cache = CounterMetricFamily(
        "scoring_tokenizer_cache", "Tokenizer cache lookups", labels=["result"]
    )
    cache.add_metric(["hit"], s.cache_hits)
    cache.add_metric(["miss"], s.cache_misses)
    yield cache
    yield from _kv_cache_metrics(s)


def _kv_cache_metrics(s: EngineStats) -> Iterator[Metric]:
    prefix = CounterMetricFamily(
        "scoring_prefix_cache_tokens",
        "Cacheable prefix tokens, read from the KV cache (hit) or computed (miss)",
        labels=["result"],
    )
    prefix.add_metric(["hit"], s.prefix_cache_hit_tokens)
    prefix.add_metric(["miss"], s.prefix_cache_miss_tokens)
    yield prefix
    yield _counter("scoring_kv_pages_evicted", "KV pool pages evicted", s.kv_pages_evicted)
    pages = GaugeMetricFamily("scoring_kv_pages", "KV pool pages by state", labels=["state"])
    pages.add_metric(["used"], s.kv_pages_used)
    pages.add_metric(["free"], s.kv_pages_free)
    yield pages


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class CountRequests:
    """ASGI middleware counting every HTTP answer by route and status (500 if none was sent)."""

    def __init__(self, app, metrics: Metrics, routes: frozenset[str]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        answer = StatusSend(send)
        try:
            await self.app(scope, receive, answer)
        finally:
            path = route_path(scope)
            self.metrics.count(path if path in self.routes else "other", answer.status)


class StatusSend:
    """An ASGI `send` that passes every message on and keeps the answer's status (500 until a
    response starts: what a request that fails unanswered is counted as)."""

    def __init__(self, send):
        self.send = send
        self.status = 500

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


def route_path(scope) -> str:
    """The path the routes match: behind a proxy's prefix (`root_path`), the path without it."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root + "/") else path
