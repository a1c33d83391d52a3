"""What an orchestrator relies on: the ops port (/healthz, /readyz, /metrics), NODES, and
the NATS server list, against real nats-server processes (one, and a 3-server cluster)."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from cli.harness.supervisor import free_port
from tests.helpers import gateway_paths, wait_for
from tests.servers import NatsProcess, nats_cluster
from shared import events as ev
from shared import service, subjects
from shared.bus import _ensure_bucket, connect
from shared.config import BusConfig, ConfigError, ConsumerConfig
from shared.consumer import ConsumerRunner
from shared.node import Node
from shared.site_store import SiteConfigSync


def requested(site: str, session: str = "s1") -> ev.TurnRequested:
    return ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                            producer="test", message="hello")


def counting_node(site: str, seen: list[str]) -> Node:
    """A node that notes the sessions of its own site's turns (durables see every site)."""

    async def handle(event, inputs, ctx):
        if event.site == site:
            seen.append(event.session_id)
        return []

    return Node(f"ops_{uuid.uuid4().hex[:8]}", ("turn_requested",), handle)


# --- NODES ------------------------------------------------------------------------------

def _nodes(*names: str) -> list[Node]:
    async def handle(event, inputs, ctx):
        return []

    return [Node(name, ("turn_requested",), handle) for name in names]


def test_nodes_empty_hosts_every_node():
    nodes = _nodes("a", "b", "c")
    assert service.select_nodes("svc", nodes, "") == nodes
    assert service.select_nodes("svc", nodes, " , ") == nodes


def test_nodes_selects_in_the_service_order():
    nodes = _nodes("a", "b", "c")
    assert [n.name for n in service.select_nodes("svc", nodes, "c, a")] == ["a", "c"]


def test_an_unknown_node_stops_the_process_naming_the_known_ones():
    with pytest.raises(ConfigError) as raised:
        service.select_nodes("responder", _nodes("answer_writer", "finalize"), "answer_writter")
    message = str(raised.value)
    assert "answer_writter" in message and "responder" in message
    assert "answer_writer, finalize" in message


async def test_serve_refuses_an_unknown_node_at_start(nats_url):
    settings = service.ProcessSettings(bus=BusConfig(url=nats_url), ops_port=0, nodes="nope")

    async def make_nodes(bus):
        return _nodes("known")

    with pytest.raises(ConfigError, match="its nodes are known"):
        await asyncio.wait_for(service.serve("svc", make_nodes, settings, stop=asyncio.Event()), 20)


async def test_serve_hosts_only_the_selected_nodes(nats_url):
    site, seen_a, seen_b = f"t{uuid.uuid4().hex[:10]}", [], []
    a, b = counting_node(site, seen_a), counting_node(site, seen_b)
    settings = service.ProcessSettings(bus=BusConfig(url=nats_url), ops_port=0, nodes=a.name)

    async def make_nodes(bus):
        return [a, b]

    ready, stop, process = asyncio.Event(), asyncio.Event(), service.Process()
    task = asyncio.create_task(service.serve("svc", make_nodes, settings, ready=ready, stop=stop, process=process))
    try:
        await asyncio.wait_for(ready.wait(), 20)
        assert [r.node.name for r in process.runners] == [a.name]
        await process.bus.publish(requested(site))
        await wait_for(lambda: seen_a, 10, "the hosted node handles the turn")
        with pytest.raises(Exception):
            await process.bus.js.consumer_info(subjects.CONV_STREAM, b.name)
        assert seen_b == []
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


# --- the ops port -----------------------------------------------------------------------

async def test_health_readiness_and_metrics_through_a_nats_restart():
    with tempfile.TemporaryDirectory(prefix="concierge-ops-") as tmp:
        nats = NatsProcess(Path(tmp) / "store")
        nats.start()
        try:
            await _health_readiness_and_metrics(nats)
        finally:
            nats.kill()


async def _health_readiness_and_metrics(nats: NatsProcess) -> None:
    ops_port = free_port()
    settings = service.ProcessSettings(bus=BusConfig(url=nats.url), ops_port=ops_port, ops_host="127.0.0.1",
                                       ops_check_s=0.2)
    site, seen = f"t{uuid.uuid4().hex[:10]}", []
    node = counting_node(site, seen)
    gate = asyncio.Event()

    async def make_nodes(bus):
        await gate.wait()  # models loading: alive, not ready
        return [node]

    ready, stop, process = asyncio.Event(), asyncio.Event(), service.Process()
    task = asyncio.create_task(service.serve("svc", make_nodes, settings, ready=ready, stop=stop, process=process))
    base = f"http://127.0.0.1:{ops_port}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:

        async def status(path: str) -> int:
            try:
                return (await http.get(path)).status_code
            except httpx.TransportError:
                return 0

        try:
            await wait_for(lambda: _is(status("/healthz"), 200), 10, "/healthz answers while starting")
            assert await status("/readyz") == 503  # no consumer bound yet
            gate.set()
            await asyncio.wait_for(ready.wait(), 20)
            await asyncio.sleep(0.5)  # a few checks: every consumer bound, but no site registry yet
            assert await status("/readyz") == 503 and all(runner.bound for runner in process.runners)
            sites_dir = Path(tempfile.mkdtemp(prefix="concierge-sites-"))
            (sites_dir / f"{site}.toml").write_text('name = "Ops"\n')
            await SiteConfigSync(process.bus, sites_dir).sync_once()  # what the router does at start
            await wait_for(lambda: _is(status("/readyz"), 200), 5, "/readyz once the site registry is loaded")

            await process.bus.publish(requested(site))
            await wait_for(lambda: seen, 10, "the node handles the turn")
            text = await wait_for(lambda: _metrics_with(http, f'concierge_node_events_total{{node="{node.name}",outcome="ok"}} 1.0'),
                               5, "the ok counter")
            assert f'concierge_node_handler_seconds_count{{node="{node.name}"}} 1.0' in text
            assert f'concierge_node_in_flight{{node="{node.name}"}} 0.0' in text
            await wait_for(lambda: _metrics_with(http, f'concierge_node_pending{{node="{node.name}"}} 0.0'), 5,
                        "the pending gauge")
            assert (await http.get("/nope")).status_code == 404

            nats.kill()
            await wait_for(lambda: _is(status("/readyz"), 503), 10, "/readyz fails while NATS is down")
            assert await status("/healthz") == 200
            nats.start()
            await wait_for(lambda: _is(status("/readyz"), 200), 15, "/readyz recovers after the reconnect")
            await process.bus.publish(requested(site, "s2"))
            await wait_for(lambda: "s2" in seen, 10, "the node handles turns after the reconnect")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        assert await status("/healthz") == 0  # the ops port closes with the process


async def _is(awaitable, expected):
    return await awaitable == expected


async def _metrics_with(http: httpx.AsyncClient, line: str) -> str | None:
    response = await http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return response.text if line in response.text else None


async def test_a_missing_durable_is_created_again(bus, site):
    seen: list[str] = []
    runner = ConsumerRunner(bus, counting_node(site, seen), ConsumerConfig(ack_wait_s=2.0), start_lookback_s=5)
    await runner.start()
    try:
        assert await runner.check() and runner.bound
        await bus.js.delete_consumer(subjects.CONV_STREAM, runner.durable)
        assert not await runner.check() and not runner.bound
        assert await runner.check() and runner.bound
        await bus.publish(requested(site))
        await wait_for(lambda: seen, 10, "the recreated durable delivers")
    finally:
        await runner.stop()


@pytest.mark.parametrize("ending, outcome", [("completed", "complete"), ("failed", "failed"), (None, "timeout")])
async def test_the_relay_says_how_a_turn_ended(bus, site, ending, outcome):
    from services.gateway.relay import TurnRelay

    cause = requested(site)
    relay = TurnRelay(bus, site, "s1", 1, deadline_s=1.0)
    await relay.open()
    try:
        if ending == "completed":
            await bus.publish(ev.follow(cause, ev.TurnCompleted, "test", metadata={"route": "ANSWER"}))
        elif ending == "failed":
            await bus.publish(ev.follow(cause, ev.TurnFailed, "test", node="test", reason="broken", attempts=1))
        payloads = [p async for batch in relay.batches() for p in batch]
    finally:
        await relay.close()
    assert relay.outcome == outcome
    assert payloads[-1]["type"] == ("complete" if outcome == "complete" else "error")


def test_llm_calls_are_counted_by_role_and_model():
    from prometheus_client import REGISTRY

    from shared import metrics

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    model = f"m{uuid.uuid4().hex[:6]}"
    metrics.observe_llm_call(ev.LLMCall(role="answer", model=model, base_url="x", messages=[], latency_ms=1500,
                                        usage={"prompt_tokens": 120, "completion_tokens": 30}))
    metrics.observe_llm_call(ev.LLMCall(role="answer", model=model, base_url="x", messages=[], latency_ms=10,
                                        error="APIConnectionError: down", fallback_used=True))
    assert value("concierge_llm_calls_total", role="answer", model=model) == 2
    assert value("concierge_llm_errors_total", role="answer", model=model) == 1
    assert value("concierge_llm_fallbacks_total", role="answer", model=model) == 1
    assert value("concierge_llm_tokens_total", role="answer", model=model, kind="prompt") == 120
    assert value("concierge_llm_tokens_total", role="answer", model=model, kind="completion") == 30
    assert value("concierge_llm_call_seconds_count", role="answer", model=model) == 2


def test_the_gateway_serves_metrics_on_its_ops_port_only():
    """Like every process's, the gateway's metrics are on its ops port (OPS_PORT), not on the
    port an ingress publishes (its lifespan starts the ops server: tests/test_e2e_http.py)."""
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    assert "/metrics" not in gateway_paths(create_app(GatewaySettings()))


# --- NATS server lists and clusters -----------------------------------------------------

@pytest.mark.parametrize("order", ["live_first", "dead_first"])
async def test_a_server_list_with_a_dead_server_connects(nats_url, order):
    dead = f"nats://127.0.0.1:{free_port()}"
    url = f"{nats_url},{dead}" if order == "live_first" else f" {dead} , {nats_url} "
    bus = await connect(BusConfig(url=url, dedupe_window_s=120), name="test-list")
    try:
        assert bus.nc.is_connected and bus.nc.connected_url.port == int(nats_url.rsplit(":", 1)[1])
        ack = await bus.publish(requested(f"t{uuid.uuid4().hex[:10]}"))
        assert ack.seq > 0
    finally:
        await bus.close()


def test_an_empty_server_list_is_a_config_error():
    with pytest.raises(ConfigError, match="NATS_URL"):
        BusConfig(url=" , ").servers()


@pytest.mark.timeout(60)
async def test_r3_streams_on_a_cluster_survive_losing_a_server():
    started = time.monotonic()
    with nats_cluster(3) as servers:
        config = BusConfig(url=",".join(s.url for s in servers), replicas=3, dedupe_window_s=120,
                           request_timeout=2.0)

        async def connected():
            try:
                return await connect(config, name="test-cluster")
            except Exception:  # JetStream has no meta leader yet
                return None

        bus = await wait_for(connected, 20, "the cluster elects a JetStream leader")
        site, seen = f"t{uuid.uuid4().hex[:10]}", []
        runner = ConsumerRunner(bus, counting_node(site, seen), ConsumerConfig(ack_wait_s=2.0), start_lookback_s=5)
        try:
            for stream in (subjects.CONV_STREAM, subjects.TOKENS_STREAM, subjects.DLQ_STREAM,
                           f"KV_{subjects.SITE_CONFIG_BUCKET}"):
                info = await bus.js.stream_info(stream)
                assert info.config.num_replicas == 3 and len(info.cluster.replicas) == 2, stream
            await _ensure_bucket(bus.js, "ops_test", None, 1)
            await _ensure_bucket(bus.js, "ops_test", None, 3)  # NATS_REPLICAS raised later
            assert (await bus.js.stream_info("KV_ops_test")).config.num_replicas == 3

            await runner.start()
            await bus.publish(requested(site, "before"))
            await wait_for(lambda: "before" in seen, 10, "consumed on the whole cluster")

            victim = next(s for s in servers if s.port == bus.nc.connected_url.port)
            victim.kill()

            async def published():
                try:
                    return await bus.publish(requested(site, "after"))
                except Exception:  # reconnecting, or a new stream leader being elected
                    return None

            await wait_for(published, 15, "publishing after losing the connected server")
            await wait_for(lambda: "after" in seen, 15, "consumed after losing a server")
            assert bus.nc.connected_url.port != victim.port
        finally:
            if runner.bound:
                await runner.stop()
            await bus.close()
    assert time.monotonic() - started < 30


async def test_streams_lost_with_a_restarted_server_come_back_by_themselves():
    """TOKENS lives in memory: a NATS restart loses it. Before, /readyz stayed 503 for good
    (only a gateway restart recreated it); the reconnect now ensures the topology again."""
    from shared.bus import topology_ready

    with tempfile.TemporaryDirectory(prefix="concierge-restart-") as tmp:
        nats = NatsProcess(Path(tmp) / "store")
        nats.start()
        bus = await connect(BusConfig(url=nats.url), name="test-restart")
        try:
            assert await topology_ready(bus)
            nats.kill()
            nats.start()
            await wait_for(lambda: topology_ready(bus), 10, "the streams are there again after the restart")
            info = await bus.js.stream_info(subjects.TOKENS_STREAM)
            assert info.config.name == subjects.TOKENS_STREAM
        finally:
            await bus.close()
            nats.kill()


async def test_sigusr1s_task_dump_follows_every_awaited_coroutine():
    """What `_dump_tasks` logs for a stuck handler: each coroutine down to what it waits on
    (Task.get_stack shows only the outermost frame, which told nothing of a hung sync)."""
    import asyncio

    from shared.logs import awaiting

    async def innermost():
        await asyncio.Event().wait()

    async def handler():
        await innermost()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0.01)
    try:
        names = [line.split()[-1] for line in awaiting(task.get_coro())]
        assert names[:3] == ["handler", "innermost", "wait"] and names[-1] == "FutureIter"
    finally:
        task.cancel()
