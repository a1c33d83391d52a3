"""enrichment: given the session so far, when a turn is requested, then the
`EnrichmentCompleted` it decides (a known company named, an unknown visitor, nothing to do
on a later turn, a retry after an outage, a turn routed away), its Redis and sources
injected (a real Redis, no NATS); and the node on the bus: new identifying data across
turns, raw IPs kept out of the log, a route arriving while a source is slow."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from services.enricher import enrichment
from services.enricher.chain import Enricher
from services.enricher.settings import DATASET
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, IpDatasetSource, ReturningVisitorSource, RevealSource,
)
from shared import events as ev
from shared import privacy, subjects
from tests.helpers import decide, fast, isolated, start, wait_for

KEYS = privacy.PrivacySettings()  # the development IP hash key


def enricher(redis, sources, deadline_s=1.5) -> Enricher:
    return Enricher(redis=redis, cache=CacheSource(redis), returning=ReturningVisitorSource(redis),
                    sources=sources, deadline_s=deadline_s)


def offline(redis):
    """The node as `make run` has it: reveal data, then the offline IP dataset."""
    return enrichment.make_node(enricher(redis, [RevealSource(), IpDatasetSource(DATASET)]))


def turn(site, session, n, visitor=None, ip="127.0.0.1"):
    return ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=n, ts=ev.now(),
                            producer="test", message="hello", visitor=visitor,
                            ip_hash=KEYS.ip_hash(ip) if ip else None)


async def test_a_first_turn_from_a_known_company_names_it(redis, site):
    await redis.set(privacy.raw_ip_key(site, "k1"), "127.0.0.1", ex=60)
    (done,) = (await decide(offline(redis), turn(site, "k1", 1))).events
    assert done.ran and done.profile.status == "completed" and done.profile.company_name.startswith("Northwind")
    assert done.profile.ip == KEYS.ip_hash("127.0.0.1")  # the hash, never the address
    assert done.sources["ip_dataset"] == "hit" and done.trouble == []


async def test_an_unknown_visitor_gets_an_unknown_profile_and_no_retry(redis, site):
    await redis.set(privacy.raw_ip_key(site, "u1"), "10.9.9.9", ex=60)
    (done,) = (await decide(offline(redis), turn(site, "u1", 1, ip="10.9.9.9"))).events
    assert done.ran and done.profile.status == "unknown" and done.profile.company_name == "unknown"
    assert done.sources["ip_dataset"] == "miss" and done.trouble == []  # a miss is an answer, not an outage


async def test_the_email_a_visitor_gave_is_in_their_profile_when_no_source_knows_them(redis, site):
    (done,) = (await decide(offline(redis), turn(site, "e1", 1, visitor={"email": "ada@example.com"}, ip=None))).events
    assert done.profile.email == "ada@example.com" and done.profile.company_name == "unknown"


async def test_a_later_turn_with_nothing_new_is_not_enriched_again(redis, site):
    node = offline(redis)
    await redis.set(privacy.raw_ip_key(site, "l1"), "127.0.0.1", ex=60)
    first = turn(site, "l1", 1)
    (enriched,) = (await decide(node, first)).events
    (done,) = (await decide(node, turn(site, "l1", 2), first, enriched)).events
    assert not done.ran and done.sources == {} and done.profile.company_name == "unknown"


async def test_an_enrichment_cut_short_by_an_outage_runs_again_next_turn(redis, site):
    """Redis down when the turn started (the raw IP never reached it): the enrichment says
    why (`trouble`) and the visitor's next turn enriches them, instead of never."""
    node = offline(redis)
    first = turn(site, "o1", 1)  # an IP hash, but no raw IP in Redis: the outage
    (cut,) = (await decide(node, first)).events
    assert cut.ran and cut.profile.company_name == "unknown" and cut.trouble == ["raw IP missing"]

    await redis.set(privacy.raw_ip_key(site, "o1"), "127.0.0.1", ex=60)  # Redis is back
    second = turn(site, "o1", 2)
    (again,) = (await decide(node, second, first, cut)).events
    assert again.ran and again.profile.company_name.startswith("Northwind") and again.trouble == []

    (idle,) = (await decide(node, turn(site, "o1", 3), first, cut, second, again)).events
    assert not idle.ran  # nothing to retry any more


@pytest.mark.parametrize("route, cancelled", [("REDIRECT", True), ("BOOKING", True), ("ANSWER", False)])
async def test_a_turn_already_routed_away_is_not_enriched(redis, site, route, cancelled):
    await redis.set(privacy.raw_ip_key(site, "r1"), "127.0.0.1", ex=60)
    request = turn(site, "r1", 1)
    routed = ev.follow(request, ev.RouteDecided, "intent_router", route=route, reason="t")
    (done,) = (await decide(offline(redis), request, routed)).events
    assert done.cancelled == cancelled
    if cancelled:
        assert done.sources == {"cache": "cancelled", "returning_visitor": "cancelled", "reveal": "cancelled",
                                "ip_dataset": "cancelled"} and done.profile.company_name == "unknown"
    else:
        assert done.profile.company_name.startswith("Northwind")


# --- the node, through the bus --------------------------------------------------------------



async def start_node(bus, enricher, site):
    return await start(bus, isolated(enrichment.make_node(enricher), site),
                       fast(max_deliver=2, ack_wait_s=5, backoff_s=(0.05,), concurrency=8))


async def enrichments(bus, site, session):
    return [r.event for r in await bus.read(subjects.conv(site, session, "enrichment_completed"))]


async def _len_at_least(coro, n):
    return len(await coro) >= n


async def test_node_enriches_first_turn_and_keeps_raw_ip_out_of_events(bus, redis, site):
    runner = await start_node(bus, enricher(redis, [RevealSource(), IpDatasetSource(DATASET)]), site)
    try:
        await redis.set(privacy.raw_ip_key(site, "v1"), "127.0.0.1", ex=60)
        await bus.publish(turn(site, "v1", 1))
        (done,) = await wait_for(lambda: enrichments(bus, site, "v1"))
        assert done.ran and done.profile.company_name.startswith("Northwind")
        assert done.profile.ip == KEYS.ip_hash("127.0.0.1")

        await bus.publish(turn(site, "v1", 2))  # nothing new: no enrichment run, but an answer
        await wait_for(lambda: _len_at_least(enrichments(bus, site, "v1"), 2))
        second = (await enrichments(bus, site, "v1"))[1]
        assert not second.ran and second.profile.company_name == "unknown"

        await bus.publish(turn(site, "v1", 3, visitor={"reveal": {"company": "NewCo"}}))  # new identifying data
        await wait_for(lambda: _len_at_least(enrichments(bus, site, "v1"), 3))
        third = (await enrichments(bus, site, "v1"))[2]
        assert third.ran and third.profile.company_name == "NewCo"
        assert "cache" not in third.sources and "returning_visitor" not in third.sources

        raw = b"".join([r.event.__class__.__name__.encode() + ev.encode(r.event)
                        for r in await bus.read(subjects.conversation(site, "v1"))])
        assert b"127.0.0.1" not in raw
    finally:
        await runner.stop()


async def test_redirect_route_cancels_unfinished_enrichment(bus, redis, providers, site):
    async with httpx.AsyncClient() as client:
        slow = Guarded(IpApiSource(f"{providers.url}/slow", "secret", client), timeout_s=5.0, retries=0)
        runner = await start_node(bus, enricher(redis, [slow], deadline_s=5.0), site)
        try:
            await redis.set(privacy.raw_ip_key(site, "c1"), "192.0.2.5", ex=60)
            requested = turn(site, "c1", 1, ip="192.0.2.5")
            await bus.publish(requested)
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await bus.publish(ev.follow(requested, ev.RouteDecided, "router", route="REDIRECT", reason="support"))
            (done,) = await wait_for(lambda: enrichments(bus, site, "c1"))
            assert time.monotonic() - started < 2.5  # the slow source alone would take 5 s
            assert done.cancelled and done.sources["ip_api"] == "cancelled"
        finally:
            await runner.stop()
