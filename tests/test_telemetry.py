"""One turn is one trace across nodes; logs are JSON carrying the conversation."""

from __future__ import annotations

import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import events as ev
from shared import logs, telemetry
from shared.consumer import ConsumerRunner
from shared.node import Node
from tests.helpers import fast, own, requested, unique, wait_for

exporter = InMemorySpanExporter()


def setup_module():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


async def test_trace_context_travels_in_nats_headers(bus, site):
    async def route(event, inputs, ctx):
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="t")]

    done = []

    async def respond(event, inputs, ctx):
        done.append(event.event_id)
        return []

    runners = [
        ConsumerRunner(bus, Node(unique("tr_route"), ("turn_requested",), own(site, route)), fast(), start_lookback_s=5),
        ConsumerRunner(bus, Node(unique("tr_resp"), ("route_decided",), own(site, respond)), fast(), start_lookback_s=5),
    ]
    for r in runners:
        await r.start()
    try:
        with trace.get_tracer("test").start_as_current_span("chat turn") as root:
            await bus.publish(requested(site))
        await wait_for(lambda: done)
    finally:
        for r in runners:
            await r.stop()
    trace_id = root.get_span_context().trace_id
    names = {s.name for s in exporter.get_finished_spans() if s.context.trace_id == trace_id}
    assert f"{runners[0].durable} turn_requested" in names
    assert f"{runners[1].durable} route_decided" in names


def test_a_message_without_trace_context_costs_no_span_unless_this_process_exports():
    """No exporter here (telemetry.setup found none) and nothing carried: the inert span, no
    context made current; a message that carries a trace context goes on in that trace."""
    tracer = trace.get_tracer("test")
    before = trace.get_current_span()
    with telemetry.handling(tracer, "quiet", {"Nats-Msg-Id": "x"}) as span:
        assert span is trace.INVALID_SPAN and trace.get_current_span() is before
    with tracer.start_as_current_span("upstream") as upstream:
        headers: dict[str, str] = {}
        telemetry.inject(headers)
    assert "traceparent" in headers
    with telemetry.handling(tracer, "carried", headers) as span:
        assert span.get_span_context().trace_id == upstream.get_span_context().trace_id
        assert trace.get_current_span() is span
    assert "carried" in {s.name for s in exporter.get_finished_spans()}
    outside: dict[str, str] = {}
    telemetry.inject(outside)  # no span, no baggage: nothing to carry
    assert outside == {}


def test_json_logs_carry_site_session_and_turn(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.setup("test")
    try:
        with logs.conversation("acme", "s1", 3):
            logging.getLogger("concierge.test").info("hello", extra={"node": "n"})
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    entry = json.loads(line)
    assert entry["msg"] == "hello" and entry["site"] == "acme" and entry["session_id"] == "s1"
    assert entry["turn"] == 3 and entry["node"] == "n" and entry["service"] == "test"
