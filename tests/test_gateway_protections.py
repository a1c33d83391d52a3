"""Abuse gate rules (pure) and the Redis rate limiter."""

from __future__ import annotations

import uuid

from shared import events as ev
from shared import language
from shared.state import Record, fold
from services.gateway import abuse_gate
from services.gateway.rate_limit import RateLimiter


def state_after(*messages, hacks=0, blocked_after=()):
    events = []
    for turn, message in enumerate(messages, start=1):
        kind = ev.TurnBlocked if turn in blocked_after else ev.TurnRequested
        common = dict(event_id=ev.new_id(), site="a", session_id="s", turn=turn, ts=1.0)
        if kind is ev.TurnBlocked:
            events.append(ev.TurnBlocked(**common, reason="spam", reply="r", message_chars=len(message)))
        else:
            events.append(ev.TurnRequested(**common, message=message))
    for _ in range(hacks):
        events.append(ev.RouteDecided(event_id=ev.new_id(), site="a", session_id="s", turn=1, ts=1.0,
                                      route="REDIRECT", reason="hack", intent="HACK", hack_increment=1))
    return fold([Record(seq=i + 1, subject="x", event=e) for i, e in enumerate(events)])


def test_the_fourth_identical_message_is_blocked_and_a_different_one_unblocks():
    assert abuse_gate.check(state_after(), "hello") is None
    assert abuse_gate.check(state_after("hello"), "Hello ") is None
    assert abuse_gate.check(state_after("hello", "hello"), "hello") is None
    assert abuse_gate.check(state_after("hello", "hello", "HELLO"), "hello") == "spam"
    # Blocked turns do not reset the count: the fifth is blocked too ...
    assert abuse_gate.check(state_after("hello", "hello", "hello", "hello", blocked_after=(4,)), "hello") == "spam"
    # ... and a different message goes through.
    assert abuse_gate.check(state_after("hello", "hello", "hello", "hello", blocked_after=(4,)), "pricing?") is None


def test_two_hack_turns_block_for_good_and_outrank_the_rest():
    assert abuse_gate.check(state_after("x", hacks=1), "hi") is None
    assert abuse_gate.check(state_after("x", hacks=2), "a perfectly fine question") == "hack"
    assert abuse_gate.check(state_after("hello", "hello", "hello", hacks=2), "hello" * 4000) == "hack"


def test_spam_outranks_length_and_length_blocks_long_messages():
    long = "y" * (abuse_gate.MAX_MESSAGE_CHARS + 1)
    assert abuse_gate.check(state_after(), long) == "length"
    assert abuse_gate.check(state_after(), "y" * abuse_gate.MAX_MESSAGE_CHARS) is None
    assert abuse_gate.check(state_after(long, long, long), long) == "spam"


def test_replies_are_localized():
    assert abuse_gate.language({"language": "fr-FR"}, None) == "fr"
    assert abuse_gate.language(None, "nl-BE,nl;q=0.9,en;q=0.8") == "nl"
    assert abuse_gate.language(None, "ja,ko") == "en"
    assert abuse_gate.language({"language": "ja"}, "de-DE,de;q=0.9") == "de"  # the widget's first, when we have it
    for reason in ("hack", "spam", "length"):  # a reply in every language the replies speak
        replies = {abuse_gate.reply(reason, lang) for lang in language.LANGUAGES}
        assert len(replies) == len(language.LANGUAGES)


async def test_rate_limit_per_ip_and_per_site(redis):
    site = f"rl{uuid.uuid4().hex[:6]}"
    limiter = RateLimiter(redis, per_ip=3, per_site=5)
    now = 60 * 16_667 + 20.0  # 20 s into a window
    assert [await limiter.retry_after(site, "ipA", now) for _ in range(3)] == [None, None, None]
    assert await limiter.retry_after(site, "ipA", now) == 41  # the window ends in 40 s
    assert await limiter.retry_after(site, "ipB", now) is None  # another visitor: fine ...
    assert await limiter.retry_after(site, "ipC", now) == 41  # ... until the site's own limit
    assert await limiter.retry_after(site, "ipA", now + 60) is None  # next window
    # A limiter of its own name (the votes') counts apart from the chat's.
    assert await RateLimiter(redis, per_ip=3, per_site=5, name="rl-votes").retry_after(site, "ipA", now) is None


async def test_rate_limit_lets_requests_through_when_redis_is_down():
    from shared import redis_client

    dead = redis_client.connect("redis://127.0.0.1:1/0")
    assert await RateLimiter(dead, 1, 1).retry_after("x", "y") is None
    await dead.aclose()


def test_the_visitor_ip_is_counted_from_the_right_of_x_forwarded_for():
    """The left of X-Forwarded-For is whatever the client wrote; the ingress appends on the right."""
    from starlette.requests import Request

    from services.gateway.access import client_ip

    def request(forwarded: str) -> Request:
        return Request({"type": "http", "headers": [(b"x-forwarded-for", forwarded.encode())],
                        "client": ("10.0.0.9", 1234)})

    assert client_ip(request("1.2.3.4, 203.0.113.7"), hops=1) == "203.0.113.7"
    assert client_ip(request("203.0.113.7, not-an-ip"), hops=1) == "10.0.0.9"
    assert client_ip(request("spoofed, 203.0.113.7, 10.1.1.1"), hops=2) == "203.0.113.7"
    assert client_ip(request("203.0.113.7"), hops=2) == "10.0.0.9"  # fewer hops than proxies: not trusted
    assert client_ip(request("1.2.3.4"), hops=0) == "10.0.0.9"


async def test_a_turns_guard_is_taken_over_only_when_old_and_never_an_erases(bus, site):
    import asyncio

    from shared.session_guard import SessionGuard

    guard = SessionGuard(bus, ttl_s=60)
    held = await guard.acquire(site, "s1")  # a gateway that then died without releasing it
    assert held is not None and await guard.acquire(site, "s1") is None
    assert await guard.take_over_ended(site, "s1", min_age_s=5) is None  # too fresh: maybe still starting
    await asyncio.sleep(0.3)
    taken = await guard.take_over_ended(site, "s1", min_age_s=0.2)
    assert taken is not None and taken != held
    await guard.release(site, "s1", held)  # the dead holder's late release does not free the new hold
    assert await guard.acquire(site, "s1") is None
    assert await guard.acquire(site, "erasing", holder=b"erasing") is not None
    await asyncio.sleep(0.3)
    assert await guard.take_over_ended(site, "erasing", min_age_s=0.2) is None


async def test_a_released_session_is_taken_again_in_one_write_unless_someone_wrote_since(bus, site):
    """Each turn takes and releases the session's key: the next turn on this replica writes
    once, expecting its own release's delete marker (no create-read-write of nats-py's
    `create` over a deleted key); another replica's turn in between is still seen."""
    from shared.session_guard import SessionGuard

    mine, other = SessionGuard(bus, ttl_s=60), SessionGuard(bus, ttl_s=60)
    reads = []
    real_get = mine.kv.get

    async def get(key, *args, **kwargs):
        reads.append(key)
        return await real_get(key, *args, **kwargs)

    mine.kv.get = get
    first = await mine.acquire(site, "s1")
    await mine.release(site, "s1", first)
    second = await mine.acquire(site, "s1")
    assert second is not None and second > first and reads == []
    assert await other.acquire(site, "s1") is None  # held: the one write took it
    await mine.release(site, "s1", second)
    theirs = await other.acquire(site, "s1")  # another replica's turn after our release
    assert theirs is not None
    assert await mine.acquire(site, "s1") is None  # our remembered marker is stale: held, refused
    await other.release(site, "s1", theirs)
    assert await mine.acquire(site, "s1") is not None  # the long way round, once free


def test_a_turn_has_ended_when_the_log_says_so():
    from services.gateway.turns import turn_ended
    from shared.state import ConversationState, TurnRecord

    assert turn_ended(ConversationState())
    for status, ended in (("completed", True), ("failed", True), ("blocked", True), ("requested", False)):
        assert turn_ended(ConversationState(turn=2, turns={2: TurnRecord(turn=2, status=status)})) is ended
