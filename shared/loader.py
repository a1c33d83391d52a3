"""Rebuild a conversation's state: the latest KV snapshot plus the log after it.

Snapshots are an optimisation only: `load` gives the same state as folding the whole
log (the property tests hold it to that), and a missing, stale or unreadable snapshot
just means a longer fold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Callable

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, BadRequestError

from shared import events as ev
from shared import subjects
from shared.bus import Bus, reading_floor
from shared.events import SCHEMA_VERSION
from shared.feed import LogFeed
from shared.state import ConversationState, apply, copy_state, fork

log = logging.getLogger(__name__)


class Snapshot(msgspec.Struct, kw_only=True):
    schema_version: int
    state: ConversationState


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Snapshot)


async def read_snapshot(bus: Bus, site: str, session_id: str) -> tuple[ConversationState | None, int | None]:
    """The stored snapshot and its KV revision, or (None, None)."""
    try:
        entry = await bus.bucket(subjects.SNAPSHOT_BUCKET).get(subjects.kv_key(site, session_id))
    except KeyNotFoundError:
        return None, None
    if not entry.value:
        return None, entry.revision
    try:
        snap = _decoder.decode(entry.value)
    except msgspec.MsgspecError as exc:
        log.warning("unreadable snapshot ignored", extra={"site": site, "session_id": session_id, "error": str(exc)})
        return None, entry.revision
    if snap.schema_version != SCHEMA_VERSION:
        return None, entry.revision
    if snap.state.event_count and (snap.state.site, snap.state.session_id) != (site, session_id):
        # Filed under another conversation's key: never fold someone else's state into this one.
        log.warning("snapshot of another conversation ignored", extra={
            "site": site, "session_id": session_id, "snapshot_of": f"{snap.state.site}/{snap.state.session_id}"})
        return None, entry.revision
    return snap.state, entry.revision


async def write_snapshot(bus: Bus, state: ConversationState, revision: int | None) -> bool:
    """Compare-and-set, so a slower writer never replaces a newer snapshot. A state too
    big for the bus is not snapshotted (the log still has it all; loads fold longer)."""
    return await _store(bus, state.site, state.session_id, _encoded(bus, state), revision)


def _encoded(bus: Bus, state: ConversationState) -> bytes | None:
    data = _encoder.encode(Snapshot(schema_version=SCHEMA_VERSION, state=state))
    if len(data) > bus.max_event_bytes:
        log.warning("state too big to snapshot", extra={"site": state.site, "session_id": state.session_id,
                                                        "bytes": len(data)})
        return None
    return data


async def _store(bus: Bus, site: str, session_id: str, data: bytes | None, revision: int | None) -> bool:
    return data is not None and await _stored(bus, site, session_id, data, revision) is not None


async def _stored(bus: Bus, site: str, session_id: str, data: bytes, revision: int | None) -> int | None:
    """The snapshot's new revision, or None when another writer got there first."""
    kv = bus.bucket(subjects.SNAPSHOT_BUCKET)
    key = subjects.kv_key(site, session_id)
    try:
        if revision is None:
            return await kv.create(key, data)
        return await kv.update(key, data, last=revision)
    except (KeyWrongLastSequenceError, BadRequestError):
        return None


# A snapshot revision this process does not know (another process wrote since): a write
# reads the snapshot's revision first. (None: no snapshot stored, a write creates it.)
UNKNOWN = 0


class FoldCache:
    """The last folded state of recently used conversations, in this process, and the
    revision of their stored snapshot as far as this process knows it.

    Only a starting point: a load reads the log after the cached sequence (a handler's
    load not when the cached state holds its event already), so a cached state is never
    stale, just shorter to bring up to date. It matters because
    JetStream finds a conversation's next events by scanning the stream from the start
    sequence: reading from a recent sequence is cheap, reading from an old one is not.
    A cached state is never changed: a load with new events folds them into a fork of it
    (state.fork) and caches that, so the states handed to handlers stay as they were.
    """

    def __init__(self, size: int = 4096):
        self.size = size
        self._states: OrderedDict[tuple[str, str], ConversationState] = OrderedDict()
        self._revisions: dict[tuple[str, str], int | None] = {}
        self._snapshotted: dict[tuple[str, str], int] = {}  # event_count of the last snapshot known
        self._attached: set[tuple[str, str]] = set()  # kept current by the log feed (shared/feed.py)
        # States the log feed folded and nobody has been given since: it may fold into them in
        # place, without a fork per event.
        self._unlent: set[tuple[str, str]] = set()

    def revision(self, site: str, session_id: str) -> int | None:
        return self._revisions.get((site, session_id), UNKNOWN)

    def set_revision(self, site: str, session_id: str, revision: int | None) -> None:
        if (site, session_id) in self._states:
            self._revisions[(site, session_id)] = revision

    def snapshotted(self, site: str, session_id: str) -> int:
        """How many of the conversation's events its last known snapshot holds (0: none)."""
        return self._snapshotted.get((site, session_id), 0)

    def set_snapshotted(self, site: str, session_id: str, event_count: int) -> None:
        if (site, session_id) in self._states:
            self._snapshotted[(site, session_id)] = event_count

    def get(self, site: str, session_id: str) -> ConversationState | None:
        """The cached state, to be used as it is: never changed after (its holder may keep it)."""
        state = self._states.get((site, session_id))
        if state is not None:
            self._states.move_to_end((site, session_id))
            self._unlent.discard((site, session_id))
        return state

    def peek(self, site: str, session_id: str) -> ConversationState | None:
        """The cached state for the log feed to fork, not given out."""
        return self._states.get((site, session_id))

    def unlent(self, site: str, session_id: str) -> ConversationState | None:
        """The cached state if the log feed folded it and nobody got it since (`get`): the
        feed may fold more into it in place."""
        return self._states.get((site, session_id)) if (site, session_id) in self._unlent else None

    def put(self, state: ConversationState, unlent: bool = False) -> None:
        """Keep `state` itself (not a copy): the caller hands it over. `unlent`: the log
        feed's fork, which no one else holds."""
        key = (state.site, state.session_id)
        cached = self._states.get(key)
        if cached is None or cached.last_seq < state.last_seq:  # equal: it holds this state already
            self._states[key] = state
            self._states.move_to_end(key)
            if unlent:
                self._unlent.add(key)
            else:
                self._unlent.discard(key)
            while len(self._states) > self.size:
                old, _ = self._states.popitem(last=False)
                self._revisions.pop(old, None)
                self._snapshotted.pop(old, None)
                self._attached.discard(old)
                self._unlent.discard(old)

    def drop(self, site: str, session_id: str) -> None:
        self._states.pop((site, session_id), None)
        self._revisions.pop((site, session_id), None)
        self._snapshotted.pop((site, session_id), None)
        self._attached.discard((site, session_id))
        self._unlent.discard((site, session_id))

    def attached(self, site: str, session_id: str) -> bool:
        """Whether the log feed keeps this conversation's cached state current."""
        return (site, session_id) in self._attached

    def attach(self, site: str, session_id: str) -> None:
        if (site, session_id) in self._states:
            self._attached.add((site, session_id))

    def detach_all(self) -> None:
        self._attached.clear()


_cache = FoldCache()
# The log pushed to this process (shared/feed.py) while it follows it (`follow`), and how
# many of its services asked for it (one a process, but a test may run several in one).
_feed: LogFeed | None = None
_followers = 0


async def follow(bus: Bus) -> LogFeed:
    """Keep this process's cached states current from the log as it is stored, so that
    handlers' loads need no read (a service whose nodes fold state, shared/service.py), and
    the gateway's turn-start loads read only what the feed has not folded yet. One feed a
    process: a second service in it (tests) shares it, or starts it again on its own
    connection when the first one's is closed."""
    global _feed, _followers
    if _feed is None or not _feed.following:
        if _feed is not None:
            await _feed.stop()
        feed = LogFeed(_cache)
        await feed.start(bus)
        _feed = feed
    _followers += 1
    return _feed


async def unfollow() -> None:
    global _feed, _followers
    _followers = max(0, _followers - 1)
    if _followers == 0 and _feed is not None:
        feed, _feed = _feed, None
        await feed.stop()


def begin(site: str, session_id: str) -> ConversationState:
    """The state of a conversation this process has just made up (a session id it issued):
    empty, with nothing to read. Cached as the conversation's (the cache's own: only read
    it), and when the process follows the log the feed keeps it current from its first
    event, so the next turn's load reads only what the feed has not folded yet."""
    state = ConversationState(site=site, session_id=session_id)
    _cache.put(state)
    if _feed is not None:
        _feed.adopt(site, session_id)
    return state


# The loads of a conversation in flight in this process (`load_for_event`): each one's state,
# once read.
_reads: dict[tuple[str, str], asyncio.Future] = {}
# Reads in flight a load waits for, one after another, before reading for itself (each one it
# waits for began before its own event was read, so more than one is rare).
JOINS = 3


async def load_for_event(bus: Bus, site: str, session_id: str, turn: int = 0) -> ConversationState:
    """`load` for a handler's inputs, inside `reading_from` (the event it acts on): the state
    must hold the log up to that event, nothing more is asked. So a cached state that holds
    it already is the answer, with no read (a read for an earlier event that found this one
    stored); and loads of one conversation at once share reads. A load joins the read in
    flight for the conversation: when that read's state holds this load's event (its read
    went at least as far: the same event, or one stored after; or it found this one stored
    when it reached the server), it is the answer; otherwise this load reads what follows
    it. The router's three analyses of one `TurnRequested` arrive together, in any order:
    reading for each one's event while another's read was in flight read the same events
    up to three times. A load that must see the log as it is now (the awaiter's looks after
    a wake-up) is not this one: it calls `load`.

    The state is the cache's own, not a copy (handlers only read it, and a copy would be
    the whole conversation deep-copied for each of them): a handler must not change its
    inputs.

    `turn`: the acted-on event's. A conversation in its first turn has no snapshot to look
    up (the gateway writes the first one at a turn's start, past SNAPSHOT_EVERY events), so
    a first read goes straight to the log: one round trip, not two, for every node's first
    load of a new conversation. (A snapshot there could only be a rewritten log's; folding
    without it gives the same state.)"""
    floor = current_floor(site, session_id)
    if floor is None:
        return await load(bus, site, session_id)
    key = (site, session_id)
    feed = _feed
    if await _kept_current(site, session_id, floor):
        feed.fold(site, session_id)
        cached = _cache.get(site, session_id)
        if cached is not None:
            return cached
    for _ in range(JOINS):
        cached = _cache.get(site, session_id)
        if cached is not None and cached.last_seq >= floor:
            return cached
        shared = _reads.get(key)
        if shared is None:
            break
        try:
            state = await asyncio.shield(shared)
        except Exception:  # noqa: BLE001 - its read failed: this load reads for itself
            break
        if state.last_seq >= floor:
            return state
    read = asyncio.get_running_loop().create_future()
    _reads[key] = read
    try:
        state = await _load(bus, site, session_id, True, False, snapshot=turn != 1)
        if feed is not None:
            feed.attach(site, session_id, floor)
        read.set_result(state)
        return state
    except BaseException as exc:
        read.set_exception(exc if isinstance(exc, Exception) else RuntimeError("load cancelled"))
        read.exception()  # retrieved: no "never retrieved" warning when nobody joined
        raise
    finally:
        if _reads.get(key) is read:
            del _reads[key]


async def _kept_current(site: str, session_id: str, floor: int) -> bool:
    """Whether this process's log feed keeps the conversation's cached state current up to
    `floor` (the handled event), once the feed has reached it; a feed that does not within
    `feed.WAIT_S` is lagging, and every state is detached."""
    feed = _feed
    if feed is None or not _cache.attached(site, session_id):
        return False
    if not await feed.reach(floor):
        feed.lagging(floor)
        return False
    return feed.current(site, session_id, floor)


WATCH_RECHECK_S = 0.1  # how often a wait on the feed's state looks whether the feed still keeps it


async def watch(site: str, session_id: str, done: Callable[[ConversationState], bool],
                deadline: float) -> ConversationState | None:
    """The state the log feed keeps current, once `done(state)` or at `deadline`
    (time.monotonic), for a handler that waits for its turn's events (shared/awaiter.py):
    no subscription, no read. The cache's own state, as `load_for_event` gives it. None
    when the feed does not keep the conversation current up to the handled event (the
    process does not follow the log, the state is not attached, the feed lags or breaks
    while waiting): the caller reads the log."""
    feed, floor = _feed, current_floor(site, session_id)
    if floor is None or not await _kept_current(site, session_id, floor):
        return None
    while feed.current(site, session_id, floor):
        change = feed.changed(site, session_id)
        try:
            feed.fold(site, session_id)
            state = _cache.peek(site, session_id)
            if state is None:
                return None
            remaining = deadline - time.monotonic()
            if done(state) or remaining <= 0:
                return _cache.get(site, session_id)
            # Woken by the conversation's next message or a break; a state dropped from the
            # cache meanwhile (evicted, a rewritten log) wakes nobody: looked at again shortly.
            await asyncio.wait((change,), timeout=min(remaining, WATCH_RECHECK_S))
        finally:
            feed.unwatch(site, session_id, change)
    return None


def current_floor(site: str, session_id: str) -> int | None:
    """The log position of the event being acted on when it is this conversation's."""
    floor = reading_floor()
    if floor is None or not subjects.matches(subjects.conversation(site, session_id), floor.subject):
        return None
    return floor.seq


async def load(bus: Bus, site: str, session_id: str, use_snapshot: bool = True,
               write_snapshot: bool = False, forked: bool = False, shared: bool = False) -> ConversationState:
    """The conversation's state: the cached or snapshotted state plus the log after it,
    as the caller's own copy.

    `shared`: the cache's own state, no copy, for a caller that only reads it (the
    gateway's turn start: a deep copy of the whole conversation per turn, for reading a
    few fields). Later loads never change it (they fold new events into a fork).

    `forked`: a fork of the cached state (state.fork) rather than a deep copy, for a caller
    that only folds events into it (`apply`) and reads it: the awaiter, which would
    otherwise deep-copy the whole conversation at every look.

    `write_snapshot`: a load whose state holds SNAPSHOT_EVERY events or more past the
    conversation's last snapshot (the one this process read or wrote) stores the state as
    the new snapshot (in the background). One load per turn asks for it, the gateway's as
    the turn starts: a snapshot every few turns (a turn is 15 to 20 events), not every turn
    (each write is the whole state encoded and stored, and a cold load folds at most
    SNAPSHOT_EVERY events and a turn more). The nodes' loads only read snapshots; when
    each of the five services wrote one, most of every turn's snapshot writes were wasted
    (each of them another's compare-and-set loser, or a copy of the same state)."""
    state = await _load(bus, site, session_id, use_snapshot, write_snapshot)
    if not use_snapshot or shared:
        return state
    return fork(state) if forked else copy_state(state)


async def _load(bus: Bus, site: str, session_id: str, use_snapshot: bool,
                write_snapshot: bool, snapshot: bool = True) -> ConversationState:
    """The cache's state brought up to date (use_snapshot; never change it), or a fold of the
    whole log. `snapshot`: False, a state not cached is folded from the log's start without
    looking for a snapshot (whose revision stays unknown)."""
    start = _cache.get(site, session_id) if use_snapshot else None
    cached = start is not None
    revision = _cache.revision(site, session_id) if cached else None
    if start is None and use_snapshot:
        if snapshot:
            start, revision = await read_snapshot(bus, site, session_id)
        else:
            revision = UNKNOWN
    after, folded_turn = (start.last_seq, start.turn) if start else (0, 0)
    tail = await bus.read(subjects.conversation(site, session_id), after_seq=after)
    if start is not None and any(isinstance(r.event, ev.TurnRequested) and r.event.turn <= folded_turn for r in tail):
        # Turns we have already folded, appended again: the log was rewritten (a visitor's
        # erasure). Fold it from the beginning.
        _cache.drop(site, session_id)
        start = None
        tail = await bus.read(subjects.conversation(site, session_id))
    if cached and start is not None and any(r.seq > start.last_seq for r in tail):
        start = fork(start)  # handed out as it is: new events go into a fork of it
    try:
        # A fork of the cached state, or a snapshot's (decoded just now: ours), folded forward.
        state = fold_into(start if start is not None else ConversationState(), tail)
    except Exception:
        _cache.drop(site, session_id)  # half-applied: never start from it again
        raise
    if not state.site:
        state.site, state.session_id = site, session_id
    if not use_snapshot:
        return state
    _cache.put(state)
    if not cached:
        _cache.set_revision(site, session_id, revision)
        _cache.set_snapshotted(site, session_id, start.event_count if start is not None else 0)
    # Counted from the last snapshot written or being written (`_snapshot_later` marks it at
    # once): requests of a session that start while a write is under way (turned away as
    # busy, say) do not write it again. Whether this load read anything does not matter: the
    # log feed folds a conversation's events before the gateway's next turn-start load, whose
    # read then finds nothing new.
    past_snapshot = state.event_count - _cache.snapshotted(site, session_id)
    if write_snapshot and past_snapshot >= bus.config.snapshot_every:
        _snapshot_later(bus, state, revision)
    return state


_writing: set[asyncio.Task] = set()


def _snapshot_later(bus: Bus, state: ConversationState, revision: int | None) -> None:
    """Write the state's snapshot after the load has returned: it shortens a later cold
    load, so a handler should not wait for it (two KV round trips and the state's
    encoding, on the first load of a turn). The state is encoded now, the write goes out in
    the background."""
    data = _encoded(bus, state)
    if data is None:
        return

    event_count = state.event_count
    before = _cache.snapshotted(state.site, state.session_id)
    _cache.set_snapshotted(state.site, state.session_id, event_count)  # being written: not again

    async def store(site: str, session_id: str, revision: int | None) -> None:
        try:
            if revision == UNKNOWN:
                _, revision = await read_snapshot(bus, site, session_id)
            # The next write starts from this one's revision; a lost race leaves it unknown
            # (and the snapshot to the writer who won, as recent as this one).
            stored = await _stored(bus, site, session_id, data, revision)
            _cache.set_revision(site, session_id, stored or UNKNOWN)
        except Exception:  # noqa: BLE001 - a missing snapshot only means a longer fold
            _cache.set_revision(site, session_id, UNKNOWN)
            if _cache.snapshotted(site, session_id) == event_count:
                _cache.set_snapshotted(site, session_id, before)  # a later load tries again
            log.exception("snapshot write failed", extra={"site": site, "session_id": session_id})

    task = asyncio.create_task(store(state.site, state.session_id, revision), name="snapshot-write")
    _writing.add(task)
    task.add_done_callback(_writing.discard)


async def snapshots_written() -> None:
    """Until the snapshots being written in the background are (tests, a process stopping)."""
    await asyncio.gather(*_writing, return_exceptions=True)


def fold_into(state: ConversationState, records: list) -> ConversationState:
    """Apply `records` to `state` itself (a state no one else holds yet), skipping those it
    holds already."""
    for record in records:
        if record.seq > state.last_seq:
            apply(state, record)
    return state
