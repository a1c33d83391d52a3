"""OpenTelemetry traces whose context rides in NATS headers, so one turn is one trace.

`OTEL_TRACES_EXPORTER` picks the exporter: `none` (default), `console`, or `otlp`
(OTLP over HTTP; the standard `OTEL_EXPORTER_OTLP_*` variables configure it).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping

from opentelemetry import baggage, context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_configured = False
_exporting = False  # a tracer provider is set: spans are recorded here
# The headers the default propagators (W3C trace context and baggage) read.
CARRIED = ("traceparent", "baggage")


def setup(service: str) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    # Read here, at start-up only (beside logs.setup), like the OTEL_EXPORTER_OTLP_* variables
    # the exporter reads itself (tests/test_settings.py lists this read).
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter_name in ("", "none"):
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"concierge-{service}"}))
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: use none, console or otlp")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _exporting
    _exporting = True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str]) -> None:
    """Put the current trace context into outgoing NATS headers (nothing when there is none)."""
    if _exporting or trace.get_current_span().get_span_context().is_valid or baggage.get_all():
        propagate.inject(headers)


def carried(headers: Mapping[str, str] | None) -> bool:
    """Whether incoming headers carry a trace context (or baggage) to go on with."""
    return bool(headers) and any(name in headers for name in CARRIED)


@contextmanager
def handling(tracer: trace.Tracer, name: str, headers: Mapping[str, str] | None) -> Iterator[trace.Span]:
    """The span of handling one message, in the trace its headers carry. With nothing to
    record (no exporter in this process, no trace context in the headers) it is the inert
    span the no-op tracer would make, without the context work around it (extracting,
    attaching, starting a span), which every message would otherwise pay for nothing."""
    if not _exporting and not carried(headers):
        yield trace.INVALID_SPAN
        return
    with continued(headers), tracer.start_as_current_span(name) as span:
        yield span


@contextmanager
def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context carried by incoming headers current."""
    token = context.attach(propagate.extract(dict(headers or {})))
    try:
        yield
    finally:
        context.detach(token)
