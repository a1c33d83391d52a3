"""Reading the log on a cluster: every replica of an R3 stream answers direct gets, one
that has not stored the newest events too. A node must still read at least up to the
event it handles (issue #17). Real nats-servers; one of them cut off from its peers by
proxies on its routes, so that it is behind while its clients still reach it (and, its
peers' subscriptions gone with the routes, answers their reads alone)."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import nats.errors
import pytest

from shared import subjects
from shared.bus import Bus, Position, StaleRead, connect
from shared.config import BusConfig
from shared.consumer import ConsumerRunner
from shared.node import Needs, Node
from shared.store import JetStreamStore
from tests.helpers import fast, requested, wait_for
from tests.servers import CutOff, nats_cluster_with_cut_off_member

CUT_S = 1.0  # how long the server stays cut off: with its routes back, under a raft election timeout


async def _connected(url: str) -> Bus | None:
    try:
        return await connect(BusConfig(url=url, replicas=3, dedupe_window_s=120, request_timeout=5.0), name="test")
    except Exception:  # no JetStream meta leader yet
        return None


async def _reader(url: str, timeout: float = 5.0) -> Bus:
    """A bus on one server only (no reconnecting elsewhere): its reads go through that server."""
    nc = await nats.connect(url, allow_reconnect=False)
    return Bus(nc=nc, js=nc.jetstream(timeout=timeout), config=BusConfig(url=url, request_timeout=timeout))


async def _leaders_elsewhere(bus: Bus, server: str, durable: str | None = None) -> None:
    """Move the conversation stream's leader (and the durable's) off `server`: a cut-off
    leader would stop the cluster instead of falling behind it."""
    apis = [(f"STREAM.LEADER.STEPDOWN.{subjects.CONV_STREAM}", lambda: bus.js.stream_info(subjects.CONV_STREAM))]
    if durable:
        apis.append((f"CONSUMER.LEADER.STEPDOWN.{subjects.CONV_STREAM}.{durable}",
                     lambda: bus.js.consumer_info(subjects.CONV_STREAM, durable)))
    for api, info in apis:
        async def elsewhere():
            try:
                leader = (await info()).cluster.leader
                if leader == server:
                    await bus.nc.request(f"$JS.API.{api}", b"", timeout=5)
            except (nats.errors.Error, asyncio.TimeoutError):  # electing
                return False
            return bool(leader) and leader != server

        await wait_for(elsewhere, 20, f"{api}: a leader on another server than {server}")


async def _answering_alone_and_behind(member: CutOff, read, behind) -> None:
    """Until reads through the cut-off `member` (`read`, no floor) answer what `behind` says
    is stale, several times running: it has noticed its routes gone (reads no longer
    wander to its peers over them) and answers direct gets (after a change of leader a
    replica takes them up again only once caught up)."""
    answered = 0

    async def alone_and_behind():
        nonlocal answered
        try:
            answered = answered + 1 if behind(await read()) else 0
        except Exception:  # noqa: BLE001 - a read still lost on a closing route, or no responder yet
            answered = 0
        return answered >= 5

    # 30 s: on a loaded machine (a fresh clone's suite, three workers) the cut-off member has
    # once taken longer than 15 s to answer alone; alone it takes a few seconds.
    await wait_for(alone_and_behind, 30, f"{member.server.name} cut off, answering reads without the newest event")


@pytest.mark.timeout(90)
async def test_a_handler_reads_the_log_up_to_its_event_from_a_replica_behind():
    started = time.monotonic()
    with nats_cluster_with_cut_off_member() as (servers, member):
        healthy = ",".join(s.url for s in servers if s is not member.server)
        bus = await wait_for(lambda: _connected(healthy), 30, "the cluster elects a JetStream leader")
        reader, probe = await _reader(member.server.url), await _reader(member.server.url, timeout=0.5)
        site, read, isolated = f"t{uuid.uuid4().hex[:10]}", {}, asyncio.Event()

        class ReadOnceIsolated(JetStreamStore):
            """Reads the log (no snapshot: the reader opened no bucket) from the cut-off member;
            the second turn's once it answers behind."""

            async def state(self, site_, session_id, at=None, turn=0):
                if site_ == site and turn == 2:
                    await isolated.wait()
                return await self._folded(site_, session_id, None, at)

        async def handle(event, inputs, ctx):
            # What the intent router does: act on the folded conversation.
            if event.site == site:
                read[event.turn] = sorted(inputs.state.turns)
            return []

        node = Node(f"cut_{uuid.uuid4().hex[:8]}", ("turn_requested",), handle, needs=Needs(state=True))
        runner = ConsumerRunner(bus, node, fast(ack_wait_s=10.0), store=ReadOnceIsolated(reader), start_lookback_s=5)
        try:
            await runner.start()
            await _leaders_elsewhere(bus, member.server.name, node.name)
            first = requested(site, "s1", turn=1)
            await bus.publish(first)
            await wait_for(lambda: 1 in read, 15, "the first turn handled")
            assert read[1] == [1]

            member.cut()
            second = requested(site, "s1", turn=2)
            await bus.publish(second)  # the two others store it: a quorum
            await _answering_alone_and_behind(member, lambda: probe.read(subjects.conversation(site, "s1")),
                                      lambda records: [r.event.event_id for r in records] == [first.event_id])
            isolated.set()
            asyncio.get_running_loop().call_later(CUT_S, member.restore)
            await wait_for(lambda: 2 in read, 20, "the second turn handled")
            assert read[2] == [1, 2], "the handler was given a log older than its event"
        finally:
            member.restore()
            isolated.set()
            await runner.stop()
            for client in (reader, probe, bus):
                await client.close()
    assert time.monotonic() - started < 60


@pytest.mark.timeout(90)
async def test_last_waits_for_the_event_and_a_replica_that_stays_behind_fails_the_read():
    with nats_cluster_with_cut_off_member() as (servers, member):
        healthy = ",".join(s.url for s in servers if s is not member.server)
        bus = await wait_for(lambda: _connected(healthy), 30, "the cluster elects a JetStream leader")
        reader = await _reader(member.server.url, timeout=1.0)
        site = f"t{uuid.uuid4().hex[:10]}"
        subject = subjects.conv(site, "s1", "turn_requested")
        try:
            await _leaders_elsewhere(bus, member.server.name)
            await bus.publish(requested(site, "s1", turn=1))
            await wait_for(lambda: reader.last(subject), 10, "the first turn on every server")
            member.cut()
            second = requested(site, "s1", turn=2)
            ack = await bus.publish(second)
            await _answering_alone_and_behind(member, lambda: reader.last(subject), lambda last: last and last.turn == 1)
            at = Position(subject, ack.seq)
            with pytest.raises(StaleRead):  # behind for longer than the request timeout
                await reader.last(subject, at=at)
            member.restore()
            reader.config.request_timeout = 5.0
            assert (await reader.last(subject, at=at)).event_id == second.event_id
        finally:
            member.restore()
            await reader.close()
            await bus.close()
