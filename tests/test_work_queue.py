"""Nodes on the BRIEFS work queue, against a real JetStream: each item handled once across
replicas, never more than `max_in_flight` at a time deployment-wide, gone once acked, and a
give-up recorded with the node's own failure event.

A work queue allows one consumer per subject filter: these tests use `work_bus`, a nats-server
of their own (conftest.py)."""

from __future__ import annotations

import asyncio

from shared import events as ev
from shared import subjects
from shared.consumer import ConsumerRunner
from shared.node import Node
from tests.helpers import briefs_queue_empty, fast, start, unique, wait_for


def item(site: str, session: str) -> ev.BriefRequested:
    return ev.BriefRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                             producer="test", reason="operator", request_id=session)


def brief_failed(event, node, attempts, reason):
    return ev.follow(event, ev.BriefFailed, node, key="failed", node=node, reason=reason, attempts=attempts,
                     request_id=event.request_id, failed_event_id=event.event_id)


async def test_each_item_once_across_replicas_within_the_in_flight_limit(work_bus):
    bus, site, limit = work_bus, unique("wq"), 2
    handled: list[str] = []
    in_flight = peak = 0

    async def handle(event, inputs, ctx):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.2)
        in_flight -= 1
        handled.append(event.session_id)
        return [ctx.follow(ev.BriefFailed, node="probe", reason="a marker, not a failure")]

    node = Node("brief_probe", ("brief_requested",), handle, stream=subjects.BRIEFS_STREAM,
                max_in_flight=limit, failure=brief_failed)
    replicas = [await start(bus, node, fast(concurrency=8)) for _ in range(2)]
    try:
        sessions = [f"lead{i}" for i in range(8)]
        for session in sessions:
            await bus.publish_work(item(site, session))
        await wait_for(lambda: len(handled) >= len(sessions), timeout=20, what="every item handled")
        await asyncio.sleep(0.5)  # a second delivery would show up here
        assert sorted(handled) == sorted(sessions)
        assert peak <= limit, f"{peak} in flight with a limit of {limit}"
        assert all(r.stats.handled > 0 for r in replicas), "both replicas took items"
        info = await bus.js.stream_info(subjects.BRIEFS_STREAM)
        await wait_for(lambda: briefs_queue_empty(bus), what="acked items removed from the work queue")
        assert info.config.retention == "workqueue"
        stored = await bus.read(subjects.conv_of_type("brief_failed", site))
        assert len(stored) == len(sessions), "outputs go to the conversation log"
    finally:
        for runner in replicas:
            await runner.stop()


async def test_a_give_up_is_recorded_with_the_nodes_failure_event(work_bus):
    bus, site = work_bus, unique("wq")

    async def handle(event, inputs, ctx):
        raise RuntimeError("the model is down")

    node = Node("brief_doomed", ("brief_requested",), handle, stream=subjects.BRIEFS_STREAM, failure=brief_failed)
    runner = await start(bus, node)
    try:
        await bus.publish_work(item(site, "lead1"))
        [record] = await wait_for(lambda: bus.read(subjects.conv(site, "lead1", "brief_failed")), timeout=15,
                                  what="a BriefFailed")
        assert record.event.attempts == 3 and "the model is down" in record.event.reason
        assert not await bus.read(subjects.conv(site, "lead1", "turn_failed"))
        # the failure is recorded before the item's copy reaches the DLQ: wait for that too
        await wait_for(lambda: _dead_letters(bus), 5, "the dead letter")
    finally:
        await runner.stop()


async def _dead_letters(bus) -> int:
    return (await bus.js.stream_info(subjects.DLQ_STREAM)).state.messages


async def test_a_work_item_whose_handler_never_answers_is_failed_and_taken_off_the_queue(work_bus):
    """The server gives up after max deliveries (a process dying on each attempt): the item
    is recorded as failed and removed, not left on the work queue for good."""
    bus, site = work_bus, unique("wq")

    async def handle(event, inputs, ctx):
        await asyncio.sleep(30)
        return []

    async def no_heartbeat(msg, progress):
        await asyncio.sleep(3600)

    node = Node("brief_hung", ("brief_requested",), handle, stream=subjects.BRIEFS_STREAM, failure=brief_failed)
    runner = ConsumerRunner(bus, node, fast(max_deliver=2, ack_wait_s=0.3, drain_timeout_s=0.1), start_lookback_s=5)
    runner._keep_alive = no_heartbeat
    await runner.start()
    try:
        await bus.publish_work(item(site, "lead1"))
        [record] = await wait_for(lambda: bus.read(subjects.conv(site, "lead1", "brief_failed")), timeout=15,
                                  what="a BriefFailed")
        assert "2 deliveries" in record.event.reason
        await wait_for(lambda: briefs_queue_empty(bus), what="the item taken off the work queue")
    finally:
        await runner.stop()
