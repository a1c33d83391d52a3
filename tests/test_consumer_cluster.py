"""A node starting on a cluster that answers late (leaders still being elected): it asks
for its durable again instead of the process exiting. Real nats-servers."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from shared.bus import connect
from shared.config import BusConfig
from shared.consumer import ConsumerRunner
from shared.node import Node
from tests.helpers import fast, requested, wait_for
from tests.servers import nats_cluster


@pytest.mark.timeout(90)
async def test_a_node_started_while_the_cluster_has_no_quorum_starts_once_it_has_one():
    started = time.monotonic()
    with nats_cluster(3) as servers:
        config = BusConfig(url=",".join(s.url for s in servers), replicas=3, dedupe_window_s=120,
                           request_timeout=2.0)

        async def connected():
            try:
                return await connect(config, name="test-start")
            except Exception:  # no JetStream meta leader yet
                return None

        bus = await wait_for(connected, 30, "the cluster elects a JetStream leader")
        site, seen = f"t{uuid.uuid4().hex[:10]}", []

        async def handle(event, inputs, ctx):
            if event.site == site:
                seen.append(event.session_id)
            return []

        runner = ConsumerRunner(bus, Node(f"late_{uuid.uuid4().hex[:8]}", ("turn_requested",), handle), fast(),
                                start_lookback_s=5)
        survivor = next(s for s in servers if s.port == bus.nc.connected_url.port)
        down = [s for s in servers if s is not survivor]
        try:
            for server in down:
                server.kill()  # one server of three: no quorum, JetStream does not answer
            starting = asyncio.create_task(runner.start())
            await asyncio.sleep(3)
            assert not starting.done(), "the start gave up (or succeeded) without a quorum"
            for server in down:
                server.start()
            await asyncio.wait_for(starting, 50)
            assert runner.bound
            await wait_for(lambda: _published(bus, site), 20, "publishing once the cluster is back")
            await wait_for(lambda: seen, 20, "the node consumes")
        finally:
            if runner.bound:
                await runner.stop()
            await bus.close()
    assert time.monotonic() - started < 80


async def _published(bus, site) -> bool:
    try:
        await bus.publish(requested(site, "s1"))
        return True
    except Exception:  # a stream leader still being elected
        return False
