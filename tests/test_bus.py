"""The bus against a real JetStream: topology, dedupe, optimistic concurrency, reads."""

from __future__ import annotations

import pytest

from shared import events as ev
from shared import subjects
from shared.bus import ConcurrencyConflict, ensure_topology, topology_ready


def requested(site: str, session: str, turn: int, message: str = "hi", event_id: str | None = None):
    return ev.TurnRequested(
        event_id=event_id or ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(),
        producer="test", message=message,
    )


async def test_topology_is_idempotent(bus):
    await ensure_topology(bus)
    await ensure_topology(bus)
    assert await topology_ready(bus)
    info = await bus.js.stream_info(subjects.CONV_STREAM)
    assert info.config.allow_direct and "conv.>" in info.config.subjects


async def test_same_event_id_is_stored_once(bus, site):
    event = requested(site, "s1", 1)
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert not first.duplicate and second.duplicate
    assert len(await bus.read(subjects.conversation(site, "s1"))) == 1


async def test_two_gateways_cannot_start_the_same_turn(bus, site):
    await bus.publish(requested(site, "s1", 1), expected_subject_seq=0)
    with pytest.raises(ConcurrencyConflict):
        # A second gateway read the same (empty) conversation and tries turn 1 too.
        await bus.publish(requested(site, "s1", 1), expected_subject_seq=0)
    stored = await bus.read(subjects.conversation(site, "s1"))
    assert [r.event.turn for r in stored] == [1]
    ack = await bus.publish(requested(site, "s1", 2), expected_subject_seq=stored[-1].seq)
    assert ack.seq > stored[-1].seq


async def test_read_returns_one_conversation_in_order_across_batches(bus, site):
    for i in range(1, 8):
        await bus.publish(requested(site, "a", i, f"a{i}"))
        await bus.publish(requested(site, "b", i, f"b{i}"))
    records = await bus.read(subjects.conversation(site, "a"), batch=3)
    assert [r.event.message for r in records] == [f"a{i}" for i in range(1, 8)]
    assert all(r.subject.startswith(f"conv.{site}.a.") for r in records)
    tail = await bus.read(subjects.conversation(site, "a"), after_seq=records[3].seq, batch=2)
    assert [r.event.message for r in tail] == ["a5", "a6", "a7"]
    assert await bus.read(subjects.conversation(site, "nobody")) == []
