"""The log feed (shared/store/feed.py): a followed conversation's cached state is kept current
from the log as it is stored (CachedStore.follow), so a handler's load needs no read, and is never wrong: a
break in the feed, a memory that does not reach back, a rewritten log or a feed that went
quiet all end in a read."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from shared import events as ev
from shared import subjects
from shared.bus import Position, connect
from shared.config import BusConfig
from shared.state import ConversationState, Record, apply, encode_state, fold
from shared.store import CachedStore, FoldCache, JetStreamStore, cached
from shared.store.feed import WAIT_S, LogFeed
from shared.store.jetstream import read_snapshot
from tests.test_store import GatedReads, _stored, publish_turns


@pytest.fixture
async def store(bus):
    """A process's store (the services' and the gateway's), not following the log."""
    store = CachedStore(bus)
    yield store
    await store.close()


@pytest.fixture
async def followed(store):
    """A process's store following the log: its feed keeps attached states current."""
    await store.follow()
    return store


async def handler_load(store, site, session, at: Position):
    """A handler's load: the state for the event at `at`."""
    return await store.state(site, session, at=at)


def request(site: str, session: str, turn: int) -> ev.TurnRequested:
    return ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(),
                            producer="test", message=f"q{turn}")


async def read_and_attached(bus, site: str, session: str, store: CachedStore) -> None:
    """A conversation of two turns, loaded for its second turn's request once the feed has
    delivered it: read once, attached."""
    await publish_turns(bus, site, session, 1)
    at = await _stored(bus, request(site, session, 2))
    assert await store.feed.reach(at.seq)
    await handler_load(store, site, session, at)
    assert store.cache.attached(site, session)


async def test_a_followed_conversation_is_read_once_and_then_kept_current(bus, site, followed):
    await publish_turns(bus, site, "a", 1)
    request = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="a", turn=2, ts=ev.now(),
                               producer="test", message="q2")
    at = await _stored(bus, request)
    reads = GatedReads(bus)
    reads.open.set()
    assert await followed.feed.reach(at.seq)  # a read attaches once the feed has delivered its event
    first = await handler_load(followed, site, "a", at)
    assert reads.calls == 1 and followed.cache.attached(site, "a")
    handed = encode_state(first)
    later = [ev.follow(request, ev.IntentClassified, "router", intent="LEARN", confidence=0.9, classifier="local"),
             ev.follow(request, ev.EnrichmentCompleted, "enricher", profile=ev.VisitorProfile(company_name="Beta")),
             ev.follow(request, ev.ResponseCompleted, "answer_writer", node="answer_writer", text="a2",
                       token_count=1)]
    states = []
    for event in later:
        at = await _stored(bus, event)
        states.append(await handler_load(followed, site, "a", at))
    assert reads.calls == 1  # every later load found the feed's state current
    full = fold(await reads.read(subjects.conversation(site, "a")))
    assert states[-1] == full and full.visitor_profile.company_name == "Beta"
    assert "intent_classified" in states[0].turns[2].seen and "response_completed" not in states[0].turns[2].seen
    assert encode_state(first) == handed  # what a handler was given never changes
    assert followed.feed.breaks == 0


async def test_a_load_waits_for_the_feed_to_reach_its_event_rather_than_reading(bus, site, followed):
    await read_and_attached(bus, site, "w", followed)
    reads = GatedReads(bus)
    reads.open.set()
    followed.feed.position = 0  # as if the handler had its event before the feed did
    at = await _stored(bus, request(site, "w", 3))
    state = await handler_load(followed, site, "w", at)
    assert reads.calls == 0 and state.turn == 3


async def test_a_feed_gone_quiet_costs_one_wait_then_loads_read(bus, site, followed):
    feed = followed.feed
    await read_and_attached(bus, site, "q", followed)
    await feed._sub.unsubscribe()  # the feed hears nothing more, and does not know it
    reads = GatedReads(bus)
    reads.open.set()
    at = await _stored(bus, request(site, "q", 3))
    started = asyncio.get_running_loop().time()
    lagging = REGISTRY.get_sample_value("concierge_log_feed_breaks_total", {"reason": "lagging"}) or 0
    state = await handler_load(followed, site, "q", at)
    assert state.turn == 3 and reads.calls == 1
    assert WAIT_S <= asyncio.get_running_loop().time() - started < 1
    assert not followed.cache.attached(site, "q") and feed.breaks == 1
    assert REGISTRY.get_sample_value("concierge_log_feed_breaks_total", {"reason": "lagging"}) == lagging + 1
    at = await _stored(bus, request(site, "q", 4))
    started = asyncio.get_running_loop().time()
    assert (await handler_load(followed, site, "q", at)).turn == 4 and reads.calls == 2
    assert asyncio.get_running_loop().time() - started < WAIT_S  # detached: read at once
    assert followed.cache.attached(site, "q") is False


async def test_a_process_that_does_not_follow_reads_for_every_event(bus, site, store):
    assert store.feed is None
    await publish_turns(bus, site, "n", 1)
    reads = GatedReads(bus)
    reads.open.set()
    for turn in (2, 3):
        at = await _stored(bus, ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="n",
                                                 turn=turn, ts=ev.now(), producer="test", message="q"))
        assert (await handler_load(store, site, "n", at)).turn == turn
    assert reads.calls == 2


async def routed(bus, site: str, session: str, store: CachedStore) -> tuple[ev.TurnRequested, ev.RouteDecided,
                                                                             Position]:
    """An attached conversation whose second turn is routed: the route (the event a waiting
    handler acts on) and where it sits, delivered by the feed."""
    await read_and_attached(bus, site, session, store)
    cause = request(site, session, 2)
    decided = ev.follow(cause, ev.RouteDecided, "intent_router", route="ANSWER", reason="test")
    handled = await _stored(bus, decided)
    assert await store.feed.reach(handled.seq)
    return cause, decided, handled


async def wait_for_retrieval(store: CachedStore, decided: ev.RouteDecided, handled: Position, timeout_s: float):
    """A handler acting on the route that waits for its turn's retrieval."""
    return await store.turn_state(decided, {"retrieval_completed"}, timeout_s, at=handled)


async def test_a_following_process_waits_for_a_turns_events_on_its_feed_without_a_read_or_a_subscription(
        bus, site, followed, monkeypatch):
    feed = followed.feed
    cause, decided, handled = await routed(bus, site, "aw", followed)
    reads = GatedReads(bus)
    reads.open.set()
    subscribed = []
    subscribe = bus.nc.subscribe

    async def counted(subject, *args, **kwargs):
        subscribed.append(subject)
        return await subscribe(subject, *args, **kwargs)

    monkeypatch.setattr(bus.nc, "subscribe", counted)
    monkeypatch.setattr(cached, "WATCH_RECHECK_S", 10.0)  # only the feed's wake-up can end the wait in time
    waiting = asyncio.ensure_future(wait_for_retrieval(followed, decided, handled, 5.0))
    await asyncio.sleep(0.1)
    assert not waiting.done() and (site, "aw") in feed._changes  # not stored yet: it waits on the feed
    await bus.publish(ev.follow(cause, ev.RetrievalCompleted, "retrieval"))
    state = await asyncio.wait_for(waiting, 1)
    assert "retrieval_completed" in state.turns[2].seen
    assert state == fold(await reads.read(subjects.conversation(site, "aw")))  # the log as stored
    assert reads.calls == 0 and subscribed == []
    assert feed._changes == {}  # nothing left waiting


async def test_a_wait_on_the_feed_ends_at_its_deadline_without_what_did_not_come(bus, site, followed):
    _, decided, handled = await routed(bus, site, "late", followed)
    reads = GatedReads(bus)
    reads.open.set()
    started = asyncio.get_running_loop().time()
    state = await wait_for_retrieval(followed, decided, handled, 0.2)
    assert 0.2 <= asyncio.get_running_loop().time() - started < 1
    assert "route_decided" in state.turns[2].seen and "retrieval_completed" not in state.turns[2].seen
    assert reads.calls == 0 and followed.feed._changes == {}


async def test_a_wait_whose_feed_breaks_reads_the_log_and_still_gets_the_event(bus, site, followed, monkeypatch):
    feed = followed.feed
    cause, decided, handled = await routed(bus, site, "br", followed)
    reads = GatedReads(bus)
    reads.open.set()
    monkeypatch.setattr(cached, "WATCH_RECHECK_S", 10.0)  # the break itself must wake the wait
    waiting = asyncio.ensure_future(wait_for_retrieval(followed, decided, handled, 5.0))
    await asyncio.sleep(0.05)
    assert (site, "br") in feed._changes and reads.calls == 0  # waiting on the feed
    feed._break()  # as a restarted consumer does: the conversation is no longer kept
    await asyncio.sleep(0.05)
    assert reads.calls >= 1 and feed._changes == {}  # gone to the subscription and the log at once
    await bus.publish(ev.follow(cause, ev.RetrievalCompleted, "retrieval"))
    state = await asyncio.wait_for(waiting, 2)
    assert "retrieval_completed" in state.turns[2].seen


async def test_a_wait_whose_state_leaves_the_cache_reads_the_log_without_waiting_out_its_deadline(
        bus, site, followed):
    cause, decided, handled = await routed(bus, site, "ev", followed)
    waiting = asyncio.ensure_future(wait_for_retrieval(followed, decided, handled, 5.0))
    await asyncio.sleep(0.05)
    assert (site, "ev") in followed.feed._changes  # waiting on the feed
    followed.cache.drop(site, "ev")  # evicted, or a rewritten log: nothing tells the waiter
    await bus.publish(ev.follow(cause, ev.RetrievalCompleted, "retrieval"))
    state = await asyncio.wait_for(waiting, 1)
    assert "retrieval_completed" in state.turns[2].seen


# --- the feed's rules, message by message (no server) -------------------------------------


def message(site: str, session: str, turn: int, kind=ev.TurnRequested, **fields):
    fields = fields or {"message": f"q{turn}"}
    event = kind(event_id=ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(), producer="test",
                 **fields)
    return subjects.conv(site, session, ev.event_type(event)), ev.encode(event)


def read_state(records: list[tuple[int, str, bytes]]) -> ConversationState:
    state = ConversationState()
    for seq, subject, data in records:
        apply(state, Record(seq=seq, subject=subject, event=ev.decode(data)))
    return state


class Log:
    """A stream's messages as the feed would be delivered them."""

    def __init__(self, feed: LogFeed, consumer: str = "c1"):
        self.feed, self.consumer, self.seq, self.consumer_seq = feed, consumer, 0, 0
        self.stored: list[tuple[int, str, bytes]] = []

    def store(self, subject: str, data: bytes, deliver: bool = True) -> int:
        self.seq += 1
        self.stored.append((self.seq, subject, data))
        if deliver:
            self.consumer_seq += 1
            self.feed.take(self.seq, self.consumer_seq, self.consumer, subject, data)
        return self.seq

    def conversation(self, site: str, session: str) -> list[tuple[int, str, bytes]]:
        return [r for r in self.stored if subjects.in_conversation(r[1], site, session)]


def attached(session: str = "a", turns: int = 1) -> tuple[FoldCache, LogFeed, Log]:
    """A feed that delivered `turns` turns of conversation s/`session`, whose state is cached
    and attached."""
    cache = FoldCache()
    feed = LogFeed(cache)
    log_ = Log(feed)
    for turn in range(1, turns + 1):
        log_.store(*message("s", session, turn))
    cache.put(read_state(log_.conversation("s", session)))
    feed.attach("s", session, upto=log_.seq)
    return cache, feed, log_


async def test_attaching_folds_what_the_feed_delivered_past_the_read():
    cache = FoldCache()
    feed, log_ = LogFeed(cache), None
    log_ = Log(feed)
    log_.store(*message("s", "a", 1))
    read = read_state(log_.conversation("s", "a"))  # a read made for the event at seq 1
    log_.store(*message("s", "b", 1))
    log_.store(*message("s", "a", 2))  # delivered while that read was on its way back
    cache.put(read)
    feed.attach("s", "a", upto=1)
    assert cache.attached("s", "a") and cache.peek("s", "a") == read_state(log_.conversation("s", "a"))
    log_.store(*message("s", "a", 3))
    feed.fold("s", "a")
    assert cache.get("s", "a") == read_state(log_.conversation("s", "a")) and feed.current("s", "a", log_.seq)


async def test_attaching_is_refused_when_the_feed_memory_does_not_reach_back():
    cache = FoldCache()
    feed = LogFeed(cache, recent=2)
    log_ = Log(feed)
    log_.store(*message("s", "a", 1))
    read = read_state(log_.conversation("s", "a"))
    for turn in (1, 2, 3):  # three more messages: the memory (two) no longer reaches seq 1
        log_.store(*message("s", f"x{turn}", 1))
    cache.put(read)
    feed.attach("s", "a", upto=1)
    assert not cache.attached("s", "a")
    feed.attach("s", "a", upto=2)  # a read made later: everything after it is remembered
    assert cache.attached("s", "a")


async def test_a_message_the_feed_missed_detaches_every_state():
    cache = FoldCache()
    feed = LogFeed(cache)
    log_ = Log(feed)
    for session in ("a", "b"):
        log_.store(*message("s", session, 1))
        cache.put(read_state(log_.conversation("s", session)))
        feed.attach("s", session, upto=log_.seq)
    log_.consumer_seq += 1  # a delivery dropped (a slow subscription): the consumer sequence skips
    log_.store(*message("s", "a", 2))
    assert not cache.attached("s", "a") and not cache.attached("s", "b") and feed.breaks == 1
    # A consumer made again after a reset starts its sequence over: a break too.
    cache.put(read_state(log_.conversation("s", "a")))
    feed.attach("s", "a", upto=log_.seq)
    assert cache.attached("s", "a")
    log_.consumer, log_.consumer_seq = "c2", 0
    log_.store(*message("s", "a", 3))
    assert not cache.attached("s", "a") and feed.breaks == 2


async def test_a_rewritten_log_drops_the_cached_state():
    cache, feed, log_ = attached(turns=2)
    log_.store(*message("s", "a", 1, message="[erased]"))  # an erasure appends the log again
    feed.fold("s", "a")
    assert cache.peek("s", "a") is None and not cache.attached("s", "a")


async def test_a_state_given_out_is_never_changed_and_one_nobody_has_is_folded_in_place():
    cache, feed, log_ = attached()
    given = cache.get("s", "a")
    handed = encode_state(given)
    log_.store(*message("s", "a", 1, ev.IntentClassified, intent="LEARN", confidence=0.9, classifier="local"))
    feed.fold("s", "a")
    folded = cache.peek("s", "a")
    assert folded is not given and encode_state(given) == handed  # a fork
    log_.store(*message("s", "a", 2))
    feed.fold("s", "a")
    assert cache.peek("s", "a") is folded and folded.turn == 2  # nobody had it: in place
    assert folded == read_state(log_.conversation("s", "a"))


async def test_undecodable_messages_are_skipped_as_a_read_skips_them():
    cache, feed, log_ = attached()
    log_.store(subjects.conv("s", "a", "turn_requested"), b"\x00garbage")
    subject, data = message("s", "other", 2)  # an envelope naming another conversation
    log_.store(subjects.conv("s", "a", "turn_requested"), data)
    log_.store(*message("s", "a", 2))
    feed.fold("s", "a")
    state = cache.peek("s", "a")
    assert state.turn == 2 and state.event_count == 2 and cache.attached("s", "a")


async def test_a_conversation_the_gateway_makes_up_is_read_from_nothing_and_kept_current(bus, site, followed):
    state = followed.begin(site, "new")  # the gateway issued this session id: nothing to read
    assert state.event_count == 0 and followed.cache.attached(site, "new")
    request = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="new", turn=1, ts=ev.now(),
                               producer="gateway", message="q1")
    await bus.publish(request)
    await bus.publish(ev.follow(request, ev.TurnCompleted, "finalize", metadata={}))
    read_tails = []
    original = bus.read

    async def read(*args, **kwargs):
        records = await original(*args, **kwargs)
        read_tails.append(len(records))
        return records

    bus.read = read
    full = fold(await original(subjects.conversation(site, "new")))
    await asyncio.wait_for(_until(lambda: followed.cache.peek(site, "new").last_seq == full.last_seq), 5)
    # The next turn's start: the cached state is current, the read after it finds nothing.
    assert await followed.state(site, "new") == full and read_tails == [0]


async def test_a_first_turn_load_looks_for_no_snapshot(bus, site, monkeypatch):
    kv = bus.bucket(subjects.SNAPSHOT_BUCKET)
    looked = []
    get = kv.get

    async def counted(key, *args, **kwargs):
        looked.append(key)
        return await get(key, *args, **kwargs)

    monkeypatch.setattr(kv, "get", counted)
    for i, store in enumerate((CachedStore(bus), JetStreamStore(bus))):
        looked.clear()
        first, second = f"{i}f1", f"{i}f2"
        at = await _stored(bus, ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=first, turn=1,
                                                 ts=ev.now(), producer="test", message="q1"))
        assert (await store.state(site, first, at=at, turn=1)).turn == 1
        assert looked == []
        await publish_turns(bus, site, second, 1)
        at = await _stored(bus, ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=second, turn=2,
                                                 ts=ev.now(), producer="test", message="q2"))
        assert (await store.state(site, second, at=at, turn=2)).turn == 2
        assert looked == [subjects.kv_key(site, second)]


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)


async def test_a_conversation_the_feed_keeps_current_is_still_snapshotted(nats_url, site):
    """The gateway's turn-start load finds nothing new to read (the feed folded it all), and
    still writes the snapshot once SNAPSHOT_EVERY events are past the last one."""
    bus = await connect(BusConfig(url=nats_url, snapshot_every=4), name="test-feed")
    store = CachedStore(bus)
    await store.follow()
    try:
        store.begin(site, "snap")
        await publish_turns(bus, site, "snap", 2)  # 8 events
        full = fold(await bus.read(subjects.conversation(site, "snap")))
        await asyncio.wait_for(_until(lambda: store.cache.peek(site, "snap").last_seq == full.last_seq), 5)
        state = await store.state(site, "snap", write_snapshot=True)
        await store.snapshots_written()
        snapshot, _ = await read_snapshot(bus, site, "snap")
        assert snapshot == state == full
    finally:
        await store.close()
        await bus.close()


async def test_a_feed_made_again_before_its_first_message_does_not_replay_the_log(bus, site, store):
    await publish_turns(bus, site, "old", 1)  # the log has history (this test's and others')
    before = (await bus.js.stream_info(subjects.CONV_STREAM)).state.last_seq
    await store.follow()
    feed = store.feed
    jsi = feed._sub._sub._jsi
    assert feed.position == 0 and jsi._sseq == before
    await jsi.reset_ordered_consumer(jsi._sseq + 1)  # what a missed heartbeat does
    at = await _stored(bus, ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="new",
                                             turn=1, ts=ev.now(), producer="test", message="q1"))
    assert await feed.reach(at.seq, timeout_s=5)
    assert feed.position == at.seq and min(s for s, _, _ in feed._recent) > before


async def test_a_read_made_before_the_feed_reached_its_event_does_not_attach():
    cache = FoldCache()
    feed = LogFeed(cache)
    log_ = Log(feed)
    log_.store(*message("s", "a", 1))
    seq = log_.store(*message("s", "a", 2), deliver=False)  # stored, not delivered to the feed yet
    cache.put(read_state(log_.conversation("s", "a")))
    feed.attach("s", "a", upto=seq)
    assert not cache.attached("s", "a")


def test_a_conversation_is_read_off_its_event_subjects_only():
    assert subjects.conversation_of(subjects.conv("s", "a", "turn_requested")) == ("s", "a")
    assert subjects.conversation_of(subjects.tokens("s", "a", 1)) is None
    assert subjects.conversation_of("conv.s.a") is None
