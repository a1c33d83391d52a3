"""A partitioned node (shared/partitions.py) against a real JetStream: the server puts each
site's events in the partition `partition_of` computes, two replicas each consume half the
partitions, and a replica that stops or dies has its partitions taken by the other with
no event lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

from shared import events as ev
from shared import partitions, subjects
from shared.consumer import ConsumerRunner
from shared.node import Needs, Node, PermanentError
from shared.partitions import PartitionedRunner
from tests.helpers import fast, requested, unique, wait_for

COUNT = 4


def test_partitions_are_shared_out_in_turn_among_the_sorted_members():
    assert partitions.assignment(["b", "a"], "a", 4) == {0, 2}
    assert partitions.assignment(["b", "a"], "b", 4) == {1, 3}
    assert partitions.assignment(["a"], "a", 4) == {0, 1, 2, 3}
    assert partitions.assignment(["a", "b", "c"], "c", 2) == frozenset()  # more members than partitions
    assert partitions.assignment(["a"], "z", 4) == frozenset()  # not (yet) a member: nothing


async def test_the_server_puts_each_sites_events_in_the_partition_partition_of_computes(bus, site):
    node = unique("probe")
    await partitions.ensure_stream(bus, node, ("turn_requested",), 8, lookback_s=1)
    sites = [f"{site}x{i}" for i in range(40)]
    for name in sites:
        await bus.publish(requested(name))
    stream = partitions.stream_name(node)

    async def stored():
        info = await bus.js.stream_info(stream, subjects_filter="part.>")
        found = {s.split(".")[3]: int(s.split(".")[1]) for s in (info.state.subjects or {})}
        return found if set(sites) <= set(found) else None

    found = await wait_for(stored, 10, "every site's event in the partition stream")
    assert {name: found[name] for name in sites} == {name: partitions.partition_of(name, 8) for name in sites}
    assert len({found[name] for name in sites}) == 8  # forty sites spread over every partition
    await bus.js.delete_stream(stream)


async def test_a_replica_starting_changes_the_partition_stream_only_when_its_partitions_or_types_did(bus, monkeypatch):
    """Every replica asks for the stream at start: one already as it should be is left alone
    (an update on a cluster still electing the stream's leader outlasted the request's
    timeout and stopped both retrievers of the cluster rehearsal); a new count or type
    updates it, keeping where its source started, and the durables past a lowered count go."""
    from nats.js import api

    node = unique("probe")
    updates = []
    update = bus.js.update_stream

    async def counted(config):
        updates.append([t.dest for t in config.sources[0].subject_transforms])
        return await update(config)

    monkeypatch.setattr(bus.js, "update_stream", counted)
    stream = partitions.stream_name(node)
    try:
        await partitions.ensure_stream(bus, node, ("turn_requested",), 4, lookback_s=1)
        started = (await bus.js.stream_info(stream)).config.sources[0].opt_start_time
        await partitions.ensure_stream(bus, node, ("turn_requested",), 4, lookback_s=1)
        assert updates == []  # as it should be: not touched
        for p in range(4):
            await bus.js.add_consumer(stream, api.ConsumerConfig(
                durable_name=partitions.durable(node, p), filter_subject=partitions.filter_subject(p),
                ack_policy=api.AckPolicy.EXPLICIT))
        await partitions.ensure_stream(bus, node, ("turn_requested",), 2, lookback_s=1)
        assert len(updates) == 1 and "partition(2,1)" in updates[0][0]
        info = await bus.js.stream_info(stream)
        assert info.config.sources[0].opt_start_time == started
        assert sorted(c.name for c in await bus.js.consumers_info(stream)) == [
            partitions.durable(node, 0), partitions.durable(node, 1)]
    finally:
        await bus.js.delete_stream(stream)


def _node(name: str, handled: dict, gate: dict, site: str, changes: list) -> Node:
    async def handle(event, inputs, ctx):
        if not event.site.startswith(site):
            return []
        if event.site in gate:
            await gate[event.site].wait()
        handled[event.site].append(ctx.node)
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="partitioned")]

    async def told(owned, count):
        changes.append((owned, count))

    return Node(name, ("turn_requested",), handle, partitions=COUNT, on_partitions=told)


def _replica(bus, node: Node, member: str, who: dict) -> PartitionedRunner:
    def runner(partition: int) -> ConsumerRunner:
        made = ConsumerRunner(bus, node, fast(ack_wait_s=1.5), start_lookback_s=5, partition=partition)
        original = made.node.handle

        async def handle(event, inputs, ctx):  # which member handled it
            out = await original(event, inputs, ctx)
            if out:
                who[event.site].append(member)
            return out

        made.node = Node(node.name, node.consumes, handle, node.needs, partitions=node.partitions)
        return made

    return PartitionedRunner(bus, node, runner, member, ttl_s=2.0, lookback_s=5)


async def _die(replica: PartitionedRunner) -> None:
    """As a SIGKILL would: no key removed, nothing given back, in-flight handlers gone."""
    replica.membership._task.cancel()
    for runner in replica.runners.values():
        runner._stopping = True
        runner._loop_task.cancel()
        for task in list(runner._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await runner._psub.unsubscribe()
        if runner._advisory_sub:
            await runner._advisory_sub.unsubscribe()


async def test_two_replicas_share_the_partitions_and_one_that_stops_or_dies_has_them_moved(bus, site):
    name = unique("parted")
    handled, who, gate, changes = defaultdict(list), defaultdict(list), {}, []
    node = _node(name, handled, gate, site, changes)
    a, b = _replica(bus, node, "a", who), _replica(bus, node, "b", who)
    try:
        await a.start()
        assert a.owned == set(range(COUNT)) and a.bound
        await b.start()
        await wait_for(lambda: a.owned == {0, 2} and b.owned == {1, 3}, 10, "the partitions shared out")
        # a told what it kept (b told its own, either first): a's partitions leave its `owned`
        # when it starts stopping them, and it is told once they have stopped.
        await wait_for(lambda: (frozenset({0, 2}), COUNT) in changes[-2:], 10, "a told of the partitions it kept")

        sites = [f"{site}s{i}" for i in range(16)]
        for s in sites:
            await bus.publish(requested(s))
        await wait_for(lambda: all(handled[s] for s in sites), 15, "every site's question handled")
        owner = {0: "a", 2: "a", 1: "b", 3: "b"}
        assert {s: who[s] for s in sites} == {s: [owner[partitions.partition_of(s, COUNT)]] for s in sites}
        assert {len(v) for v in handled.values()} == {1}

        # b stops as a rolling update stops it: a takes its partitions at its next beat.
        await b.stop()
        await wait_for(lambda: a.owned == set(range(COUNT)), 5, "b's partitions taken at once")

        # b back; then a dies holding a question of one of its partitions, unacked.
        b = _replica(bus, node, "b", who)
        await b.start()
        await wait_for(lambda: a.owned == {0, 2} and b.owned == {1, 3}, 10, "shared again")
        held = next(f"{site}h{i}" for i in range(100) if partitions.partition_of(f"{site}h{i}", COUNT) in a.owned)
        gate[held] = asyncio.Event()
        await bus.publish(requested(held))
        await wait_for(lambda: any(r.stats.in_flight for r in a.runners.values()), 10, "a at work on it")
        await _die(a)
        del gate[held]
        later = [f"{site}l{i}" for i in range(8)]
        for s in later:
            await bus.publish(requested(s))
        await wait_for(lambda: b.owned == set(range(COUNT)), 10, "a's partitions moved when its key expired")
        await wait_for(lambda: handled[held] and all(handled[s] for s in later), 15,
                       "the dead replica's question and the later ones answered")
        assert who[held] == ["b"] and all(who[s] == ["b"] for s in later)
        assert b.moves >= 4
        a = None
    finally:
        for replica in (a, b):
            if replica is not None:
                await replica.stop()
        with contextlib.suppress(Exception):
            await bus.js.delete_stream(partitions.stream_name(name))


async def test_an_event_from_a_partition_is_read_where_it_sits_in_the_log(bus, site):
    """The runner of a partition gives the handler the event's CONV subject and sequence:
    no envelope/subject mismatch, and reads see the log at least that far."""
    name, seen = unique("where"), []

    async def handle(event, inputs, ctx):
        if event.site == site and event.session_id == "bad":
            raise PermanentError("no knowledge base")
        if event.site == site:
            seen.append(inputs.state.last_seq)
            return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="found")]
        return []

    node = Node(name, ("turn_requested",), handle, Needs(state=True), partitions=2)
    await partitions.ensure_stream(bus, name, node.consumes, 2, lookback_s=5)
    runner = ConsumerRunner(bus, node, fast(), start_lookback_s=5, partition=partitions.partition_of(site, 2))
    await runner.start()
    try:
        ack = await bus.publish(requested(site))
        await wait_for(lambda: seen, 10, "handled")
        assert seen == [ack.seq] and runner.stats.bad_events == 0
        stored = [r.event for r in await bus.read(subjects.conversation(site, "s1"))]
        assert any(isinstance(e, ev.RouteDecided) for e in stored)
        # A failure ends in the turn's TurnFailed and a dead letter naming the CONV subject
        # (what `concierge erase-visitor` and an operator read), not the partition's copy.
        await bus.publish(requested(site, session="bad"))
        failed = await wait_for(lambda: bus.last(subjects.conv(site, "bad", "turn_failed")), 10, "the failure")
        assert failed.node == name
        letter = await bus.js.get_last_msg(subjects.DLQ_STREAM, subjects.dlq(name))
        assert letter.headers["Concierge-Subject"] == subjects.conv(site, "bad", "turn_requested")
    finally:
        await runner.stop()
        await bus.js.delete_stream(partitions.stream_name(name))
