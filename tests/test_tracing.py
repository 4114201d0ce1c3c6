"""Tracing (`api.tracing`, `api.otlp`): an OTLP/HTTP collector in this process receives the
trace of a `/v1/score` request to a hypercorn server and of `/v1/embeddings` requests to an
in-process app: the request's span, child of the caller's `traceparent`, with a span per engine
stage as long as the answer's `x-*-time` header says; errors as errors. Off, OpenTelemetry is
never imported."""

import gzip
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx2
import msgspec
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from starlette.testclient import TestClient

import api
from api import tracing
from api.app import create_app
from api.settings import ServerConfig, settings_from_env
from engine import Timings
from tests.test_api_support import (
    ROOT,
    device_faults,
    hypercorn_server,
    score_cases,
    tiny_env,
    wait_until,
)
from tests.test_embed import tiny_embedder

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
STAGES = {"tokenize", "queue", "batch_build", "plan", "pack", "device", "dispatch"}
PARENTS = {"plan": "batch_build", "pack": "batch_build", "dispatch": "device"}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start: int  # ns since the epoch
    end: int
    kind: int
    status: int
    attributes: dict
    service: str

    @property
    def ms(self) -> float:
        return (self.end - self.start) / 1e6


class Collector:
    """An OTLP/HTTP traces endpoint on a thread of this process: each span posted to it,
    decoded from its protobuf `ExportTraceServiceRequest`."""

    def __init__(self):
        self.spans: list[Span] = []
        self.changed = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self):
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                status = 404 if self.path != "/v1/traces" else 200
                if status == 200:
                    collector.add(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        return Handler

    def add(self, request: ExportTraceServiceRequest) -> None:
        spans = [
            _span(span, _attributes(resource.resource.attributes)["service.name"])
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.changed:
            self.spans += spans
            self.changed.notify_all()

    def wait_for(self, found: Callable[[list[Span]], object], timeout: float = 120.0):
        """`found(spans)` once it is true of the spans received (it fails after `timeout` s)."""
        with self.changed:
            result = self.changed.wait_for(lambda: found(self.spans), timeout)
        assert result, f"not received in {timeout} s; received: {[s.name for s in self.spans]}"
        return result

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _span(span, service: str) -> Span:
    return Span(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        start=span.start_time_unix_nano,
        end=span.end_time_unix_nano,
        kind=span.kind,
        status=span.status.code,
        attributes=_attributes(span.attributes),
        service=service,
    )


def _attributes(pairs) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in pairs}


@pytest.fixture(scope="module")
def collector():
    collector = Collector()
    yield collector
    collector.close()


def request_trace(spans: list[Span], route: str, trace_id: str | None = None):
    """The request span of `route` (of trace `trace_id`, when given) and its trace's spans by
    name, once the request's span has come; else None."""
    name = f"POST {route}"
    roots = [s for s in spans if s.name == name and trace_id in (None, s.trace_id)]
    if not roots:
        return None
    root = roots[-1]
    return root, {s.name: s for s in spans if s.trace_id == root.trace_id and s is not root}


def assert_stages(root: Span, stages: dict[str, Span], headers) -> None:
    """The stage spans: each as long as its header says (to its 3 decimals in ms), inside its
    parent, laid end to end from the first, within the request's span."""
    assert set(stages) == STAGES
    for name, span in stages.items():
        header = float(headers[f"x-{name.replace('_', '-')}-time"])
        assert abs(span.ms - header) <= 0.0005 + 1e-6, (name, span.ms, header)
        parent = stages[PARENTS[name]] if name in PARENTS else root
        assert span.parent_id == parent.span_id
        assert span.kind == SpanProto.SPAN_KIND_INTERNAL
    top = [stages[name] for name in tracing.TOP]
    assert all(a.end == b.start for a, b in itertools.pairwise(top))
    assert root.start <= top[0].start and top[-1].end <= root.end
    assert stages["plan"].start == stages["batch_build"].start
    assert stages["pack"].start == stages["plan"].end
    assert stages["dispatch"].start == stages["device"].start


def test_a_score_request_is_traced_with_its_stages(collector, tiny_path, tmp_path):
    env = tiny_env(
        tiny_path,
        SCORING_OTLP_TRACES_ENDPOINT=collector.url,
        SCORING_OTLP_SERVICE_NAME="scorer",
        OTEL_BSP_SCHEDULE_DELAY="50",  # ms: spans leave at once
    )
    body = score_cases()[0]
    with hypercorn_server("asyncio", env, tmp_path / "server.log") as server:
        r = httpx2.post(
            f"{server.url}/v1/score", json=body, headers={"traceparent": TRACEPARENT}, timeout=120
        )
        assert r.status_code == 200, r.text
        root, stages = collector.wait_for(lambda s: request_trace(s, "/v1/score", TRACE_ID))
    assert (root.trace_id, root.parent_id) == (TRACE_ID, CALLER_SPAN)
    assert (root.kind, root.status, root.service) == (SpanProto.SPAN_KIND_SERVER, 0, "scorer")
    answer = r.json()
    assert root.attributes == {
        "http.request.method": "POST",
        "http.route": "/v1/score",
        "http.response.status_code": 200,
        "scoring.model": answer["model"],
        "scoring.items": len(body["items"]),
        "scoring.prompt_tokens": answer["usage"]["prompt_tokens"],
        "scoring.cached_tokens": 0,
    }
    assert_stages(root, stages, r.headers)
    assert not any("/health" in s.name for s in collector.spans)  # engine routes only


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return tiny_embedder(tmp_path_factory.mktemp("embedders"), "bert-cls-normalised")


def test_embeddings_requests_are_traced_and_flushed_when_the_app_stops(
    collector, embedder, monkeypatch
):
    # no batch leaves on its own for 10 minutes: what arrives, the app's stop sent
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    env = tiny_env(embedder, SCORING_OTLP_TRACES_ENDPOINT=collector.url)
    app = create_app(settings_from_env(env))
    with TestClient(app) as client:
        assert wait_until(lambda: client.get("/health").status_code == 200)
        ok = client.post("/v1/embeddings", json={"input": ["a text", "another text"]})
        assert ok.status_code == 200, ok.text
        refused = client.post("/v1/embeddings", json={"input": []})
        assert refused.status_code == 400
        invoked = client.post("/invocations", json={"input": "a text"})  # as /v1/embeddings
        assert invoked.status_code == 200, invoked.text

        def on_fire(inputs) -> None:
            raise RuntimeError("device on fire")

        with device_faults(app.state.service.host.engine, on_fire):
            failed = client.post("/v1/embeddings", json={"input": ["a text"]})
        assert failed.status_code == 500
        assert not request_traces(collector.spans)  # nothing sent before the app stops
    collector.wait_for(lambda spans: len(request_traces(spans)) == 3)
    root, stages = collector.wait_for(lambda spans: request_trace(spans, "/invocations"))
    assert root.attributes["scoring.items"] == 1
    assert_stages(root, stages, invoked.headers)
    by_status = {
        root.attributes["http.response.status_code"]: (root, stages)
        for root, stages in request_traces(collector.spans)
    }
    root, stages = by_status[200]
    assert root.parent_id == "" and root.service == "llm-scoring-engine"
    assert root.attributes["scoring.items"] == 2
    assert root.attributes["scoring.prompt_tokens"] == ok.json()["usage"]["prompt_tokens"]
    assert_stages(root, stages, ok.headers)
    root, stages = by_status[400]
    assert (root.status, stages, "scoring.model" in root.attributes) == (0, {}, False)
    root, stages = by_status[500]
    assert (root.status, stages) == (Status.STATUS_CODE_ERROR, {})
    assert root.attributes["error.type"] == "500"


def request_traces(spans: list[Span]) -> list:
    """`request_trace` of each `/v1/embeddings` request received."""
    trace_ids = {s.trace_id for s in spans if s.name == "POST /v1/embeddings"}
    return [request_trace(spans, "/v1/embeddings", t) for t in trace_ids]


def test_stages_are_laid_end_to_end_inside_the_engine_time():
    t = Timings(
        tokenize=0.001,
        queue=0.002,
        batch_build=0.003,
        plan=0.001,
        pack=0.002,
        device=0.004,
        dispatch=0.001,
        total=0.015,
    )
    laid = {s.name: s for s in tracing.stages(t, 10**12)}
    ms = lambda at: round((at - 10**12) / 1e6, 6)
    assert {n: (s.parent, ms(s.start_ns), ms(s.end_ns)) for n, s in laid.items()} == {
        "tokenize": (None, -15, -14),
        "queue": (None, -14, -12),
        "batch_build": (None, -12, -9),
        "plan": ("batch_build", -12, -11),
        "pack": ("batch_build", -11, -9),
        "device": (None, -9, -5),
        "dispatch": ("device", -9, -8),
    }  # the 5 ms beyond the stages (hops, the answer gathered) at the end
    # several batches' stages outlast the total: they end at the end
    overlapped = tracing.stages(msgspec.structs.replace(t, total=0.005), 10**12)
    assert (ms(overlapped[0].start_ns), ms(overlapped[-2].end_ns)) == (-10, 0)


@pytest.mark.parametrize(
    "endpoint, url",
    [
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
        ("https://collector/otlp/v1/traces", "https://collector/otlp/v1/traces"),
        ("collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ],
)
def test_traces_url(endpoint, url):
    assert tracing.traces_url(endpoint) == url


def test_tracing_without_opentelemetry_names_the_setting_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # an ImportError
    monkeypatch.delitem(sys.modules, "api.otlp", raising=False)
    monkeypatch.delattr(api, "otlp", raising=False)
    server = ServerConfig(otlp_traces_endpoint="http://127.0.0.1:9/v1/traces")

    async def start() -> None:
        async with tracing.exporting(server):
            pass

    with pytest.raises(RuntimeError, match=r"SCORING_OTLP_TRACES_ENDPOINT.*\[tracing\]"):
        anyio.run(start)


OFF = """
import json, sys, time
from starlette.testclient import TestClient
from api.app import create_app
from api.tracing import TraceRequests

app = create_app()
with TestClient(app) as client:
    while client.get("/health").status_code != 200:
        time.sleep(0.05)
    body = {"query": [1, 2, 3], "items": [[4, 5], [6]], "label_token_ids": [264, 265]}
    assert client.post("/v1/score", json=body).status_code == 200
traced = any(m.cls is TraceRequests for m in app.user_middleware)
print(json.dumps([traced, sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))
"""


def test_off_opentelemetry_is_never_imported(tiny_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCORING_", "OTEL_"))}
    env |= tiny_env(tiny_path) | {"JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", OFF], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [False, []]
