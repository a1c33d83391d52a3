"""A turn's route as the store gives it (shared/store/routes.py), against a real nats-server:
background work (retrieval, enrichment) racing it is cancelled by its turn's REDIRECT or
BOOKING route, heard on one subscription the store keeps; the log is read only for a turn
requested before that subscription could hear every route (just made, or the connection
went since)."""

from __future__ import annotations

import asyncio
import time

import msgspec

from shared import events as ev
from shared import subjects
from shared.bus import Position
from shared.store import JetStreamStore
from shared.store.routes import RouteWatch
from tests.helpers import turn, unique


def later(request: ev.TurnRequested) -> ev.TurnRequested:
    """The request as if made after the watch could hear everything (its clock margin past)."""
    return msgspec.structs.replace(request, ts=time.time() + 2 * RouteWatch.CLOCK_MARGIN_S)


def routed(request: ev.TurnRequested, route: str) -> ev.RouteDecided:
    return ev.follow(request, ev.RouteDecided, "intent_router", route=route, reason="t", intent="SUPPORT")


async def forever():
    await asyncio.sleep(60)


def counting_reads(bus) -> list[str]:
    reads: list[str] = []
    real = bus.read

    async def read(subject, *args, **kwargs):
        reads.append(subject)
        return await real(subject, *args, **kwargs)

    bus.read = read
    return reads


def counting_subscriptions(bus, monkeypatch) -> list[str]:
    subscribed: list[str] = []
    subscribe = bus.nc.subscribe

    async def counted(subject, *args, **kwargs):
        subscribed.append(subject)
        return await subscribe(subject, *args, **kwargs)

    monkeypatch.setattr(bus.nc, "subscribe", counted)
    return subscribed


async def test_a_route_stored_before_the_watch_is_found_in_the_log(bus, site):
    session = unique("s")
    request = turn(site, session, 1, "My invoice is wrong")
    await bus.publish(request)
    await bus.publish(routed(request, "REDIRECT"))
    reads = counting_reads(bus)
    work = asyncio.ensure_future(forever())
    route = await JetStreamStore(bus).route(request)
    assert await asyncio.wait_for(route.race(work), 5)
    assert work.cancelled() and len(reads) == 1


async def test_once_the_watch_hears_everything_a_route_cancels_without_reading_the_log(bus, site, monkeypatch):
    store = JetStreamStore(bus)
    subscribed = counting_subscriptions(bus, monkeypatch)
    reads = counting_reads(bus)
    session = unique("s")
    # Routed away while the work runs.
    first = later(turn(site, session, 1, "My invoice is wrong"))
    work = asyncio.ensure_future(forever())
    racing = asyncio.ensure_future((await store.route(first)).race(work))
    await asyncio.sleep(0.1)
    await bus.publish(routed(first, "BOOKING"))
    assert await asyncio.wait_for(racing, 5) and work.cancelled()
    # Routed away before the work started: cancelled at once.
    second = later(turn(site, session, 2, "I want a demo"))
    await bus.publish(routed(second, "REDIRECT"))
    await asyncio.sleep(0.1)
    work = asyncio.ensure_future(forever())
    assert await asyncio.wait_for((await store.route(second)).race(work), 5) and work.cancelled()
    # An ANSWER route (and another session's route) lets the work finish.
    third = later(turn(site, session, 3, "How much is it?"))
    await bus.publish(routed(third, "ANSWER"))
    await bus.publish(routed(later(turn(site, unique("other"), 3, "Bye")), "REDIRECT"))
    await asyncio.sleep(0.1)
    route = await store.route(third)
    assert not await asyncio.wait_for(route.race(asyncio.ensure_future(asyncio.sleep(0.2))), 5)
    assert reads == []
    assert len(subscribed) == 1  # one watch for all of the store's races, made once


async def test_races_that_start_together_share_the_stores_one_watch(bus, site, monkeypatch):
    """A service's handlers start at once (a backlog delivered as it starts): each one's first
    race must not make a watch of its own (a subscription to every route, never ended)."""
    store = JetStreamStore(bus)
    subscribed = counting_subscriptions(bus, monkeypatch)
    session = unique("s")
    routes = await asyncio.gather(*(store.route(later(turn(site, session, n, "Hi"))) for n in (1, 2, 3)))
    assert len(subscribed) == 1
    await bus.publish(routed(later(turn(site, session, 2, "Hi")), "REDIRECT"))
    work = asyncio.ensure_future(forever())
    assert await asyncio.wait_for(routes[1].race(work), 5) and work.cancelled()


async def test_a_route_looked_up_in_the_log_is_read_at_the_handled_events_position(bus, site):
    """The log read of a race the watch does not cover is held to the handled event (`at`),
    as every read for a handler is (a replica behind it waits; see tests/test_bus.py)."""
    session = unique("s")
    request = turn(site, session, 1, "My invoice is wrong")
    await bus.publish(request)
    decided = routed(request, "BOOKING")
    at = Position(subjects.conv(site, session, "route_decided"), (await bus.publish(decided)).seq)
    asked = []
    real = bus.read

    async def read(subject, *args, **kwargs):
        asked.append(kwargs.get("at"))
        return await real(subject, *args, **kwargs)

    bus.read = read
    work = asyncio.ensure_future(forever())
    route = await JetStreamStore(bus).route(request, at=at)
    assert await asyncio.wait_for(route.race(work), 5) and work.cancelled()
    assert asked == [at]


async def test_after_a_reconnect_the_log_is_read_again(bus, site):
    watch = await RouteWatch.on(bus.nc)
    await asyncio.sleep(RouteWatch.CLOCK_MARGIN_S + 0.1)
    request = turn(site, unique("s"), 1, "My invoice is wrong")  # requested now, while connected
    assert watch.covers(request)
    bus.nc.stats["reconnects"] += 1  # what nats-py counts when the connection came back
    try:
        assert not watch.covers(request)  # routes published while it was down were not heard
        assert watch.covers(later(request))
    finally:
        bus.nc.stats["reconnects"] -= 1
