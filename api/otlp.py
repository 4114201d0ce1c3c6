"""The OpenTelemetry half of `api.tracing`, imported only when tracing is on: the app's own
tracer provider (not the process-wide one, so several apps can live in one process), whose
spans leave in batches over OTLP/HTTP protobuf, and the spans of each answered request.

The exporter also reads OpenTelemetry's own variables: `OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
`..._TIMEOUT`, `..._COMPRESSION`, `..._CERTIFICATE`; so do the batches (`OTEL_BSP_*`: how
often they leave, how many spans wait), the sampler (`OTEL_TRACES_SAMPLER`: by default every
request is traced unless its `traceparent` says it is not sampled) and the resource
(`OTEL_RESOURCE_ATTRIBUTES`).
"""

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROPAGATOR = TraceContextTextMapPropagator()  # W3C `traceparent` / `tracestate`


class Traces:
    """Spans of the app's requests, sent to the OTLP/HTTP traces endpoint `url`."""

    def __init__(self, url: str, service_name: str):
        resource = Resource.create({SERVICE_NAME: service_name})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("api")

    def record(self, answered) -> None:
        """The spans of `answered` (an `api.tracing.Answered`): the request's (a server span,
        child of the caller's `traceparent` where it sent one) and its stages' inside it. A
        5xx answer is an error; a 4xx is the client's, so its status is left unset (as
        OpenTelemetry's HTTP conventions have it for a server)."""
        a = answered
        attributes = {
            "http.request.method": a.method,
            "http.route": a.route,
            "http.response.status_code": a.status,
            **a.attributes,
        }
        span = self.tracer.start_span(
            f"{a.method} {a.route}",
            PROPAGATOR.extract(a.headers),
            SpanKind.SERVER,
            attributes,
            start_time=a.start_ns,
        )
        self._stages(span, a.stages)
        if a.status >= 500:
            span.set_attribute("error.type", str(a.status))
            span.set_status(Status(StatusCode.ERROR, f"answered {a.status}"))
        if a.error is not None:
            span.record_exception(a.error)
        span.end(a.end_ns)

    def _stages(self, request, stages) -> None:
        spans = {None: request}
        for stage in stages:
            inside = trace.set_span_in_context(spans[stage.parent])
            span = self.tracer.start_span(stage.name, inside, start_time=stage.start_ns)
            span.end(stage.end_ns)
            spans[stage.name] = span

    def shutdown(self) -> None:
        """Send the spans still waiting, then stop (blocks until the endpoint answers or
        the exporter's timeout)."""
        self.provider.shutdown()
