"""The conversation store a service or the gateway uses: `JetStreamStore` with the last
folded state of recent conversations kept in this process (`FoldCache`), kept current by the
log as it is stored (`LogFeed`, feed.py), and loads of one conversation at once sharing reads.

Only a starting point: a load for an event reads the log after the cached state unless the
cached state holds that event already (or the feed keeps it current up to there), so a
cached state is never stale, just shorter to bring up to date. Everything here belongs to
one `CachedStore` object, made once per process (shared/service.py, the gateway's app):
nothing is kept in module globals, nothing depends on the calling task's context.

The states it gives out are shared: the cache's own, never changed after (a load with new
events folds them into a fork, state.fork), so a handler only reads its inputs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Callable

from shared import subjects
from shared.bus import Bus, Position
from shared.state import ConversationState, fork
from shared.store.feed import LogFeed
from shared.store.jetstream import (JetStreamStore, encoded, fold_into, read_snapshot, seen, stored)

log = logging.getLogger(__name__)

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
        self._attached: set[tuple[str, str]] = set()  # kept current by the log feed (shared/store/feed.py)
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



# Reads in flight a load waits for, one after another, before reading for itself (each one it
# waits for began before its own event was read, so more than one is rare).
JOINS = 3
WATCH_RECHECK_S = 0.1  # how often a wait on the feed's state looks whether the feed still keeps it


class CachedStore(JetStreamStore):
    def __init__(self, bus: Bus, cache_size: int = 4096):
        super().__init__(bus)
        self.cache = FoldCache(cache_size)
        self.feed: LogFeed | None = None  # while the store follows the log (`follow`)
        self._reads: dict[tuple[str, str], asyncio.Future] = {}  # loads in flight, each one's state once read
        self._writing: set[asyncio.Task] = set()  # snapshots being written

    # --- following the log ------------------------------------------------------------------

    async def follow(self) -> None:
        """Keep the cached states current from the log as it is stored, so that handlers'
        loads need no read (a service whose nodes fold state), and the gateway's turn-start
        loads read only what the feed has not folded yet."""
        if self.feed is None or not self.feed.following:
            if self.feed is not None:
                await self.feed.stop()
            feed = LogFeed(self.cache)
            await feed.start(self.bus)
            self.feed = feed

    async def close(self) -> None:
        """Stop following the log; wait for the snapshots being written."""
        if self.feed is not None:
            feed, self.feed = self.feed, None
            await feed.stop()
        await self.snapshots_written()

    def begin(self, site: str, session_id: str) -> ConversationState:
        """The state of a conversation this process has just made up (a session id it issued):
        empty, with nothing to read. Cached as the conversation's, and when the store follows
        the log the feed keeps it current from its first event, so the next turn's load reads
        only what the feed has not folded yet."""
        state = ConversationState(site=site, session_id=session_id)
        self.cache.put(state)
        if self.feed is not None:
            self.feed.adopt(site, session_id)
        return state

    # --- state ----------------------------------------------------------------------------

    async def state(self, site: str, session_id: str, at: Position | None = None, turn: int = 0,
                    write_snapshot: bool = False) -> ConversationState:
        """`JetStreamStore.state`, from the cache. For a handler's event (`at` in this
        conversation) a cached state that holds it already is the answer, with no read (a
        read for an earlier event that found this one stored; the feed's folds); and loads
        of one conversation at once share reads: a load joins the read in flight for the
        conversation when that read's state holds this load's event, otherwise it reads what
        follows it. (The router's analyses of one `TurnRequested` arrive together, in
        any order: reading for each one's event while another's read was in flight read the
        same events up to three times.)

        `write_snapshot`: a load whose state holds SNAPSHOT_EVERY events or more past the
        conversation's last snapshot (the one this process read or wrote) stores the state as
        the new snapshot, in the background. One load per turn asks for it, the gateway's as
        the turn starts: a snapshot every few turns, not every turn, and not by each service
        (each write is the whole state encoded and stored; most of five services' writes
        would be another's compare-and-set loser)."""
        floor = _floor(at, site, session_id)
        if floor is None:
            return await self._load(site, session_id, None, write_snapshot)
        key, feed = (site, session_id), self.feed
        if await self._kept_current(site, session_id, floor):
            feed.fold(site, session_id)
            cached = self.cache.get(site, session_id)
            if cached is not None:
                return cached
        for _ in range(JOINS):
            cached = self.cache.get(site, session_id)
            if cached is not None and cached.last_seq >= floor:
                return cached
            shared = self._reads.get(key)
            if shared is None:
                break
            try:
                state = await asyncio.shield(shared)
            except Exception:  # noqa: BLE001 - its read failed: this load reads for itself
                break
            if state.last_seq >= floor:
                return state
        read = asyncio.get_running_loop().create_future()
        self._reads[key] = read
        try:
            state = await self._load(site, session_id, at, write_snapshot, snapshot=turn != 1)
            if feed is not None and feed is self.feed:
                feed.attach(site, session_id, floor)
            read.set_result(state)
            return state
        except BaseException as exc:
            read.set_exception(exc if isinstance(exc, Exception) else RuntimeError("load cancelled"))
            read.exception()  # retrieved: no "never retrieved" warning when nobody joined
            raise
        finally:
            if self._reads.get(key) is read:
                del self._reads[key]

    async def _own(self, site: str, session_id: str, at: Position | None) -> ConversationState:
        # A fork, not a deep copy: a turn_state wait only folds events into it and reads it.
        return fork(await self._load(site, session_id, at, False))

    async def turn_state(self, event, wanted: set[str], timeout_s: float,
                         at: Position | None = None) -> ConversationState:
        """`JetStreamStore.turn_state`; while the feed keeps the conversation current, the
        state it keeps, as each of the conversation's events is stored: no subscription and
        no read (the cache's own state). The deadline counts from this call either way."""
        deadline = time.monotonic() + timeout_s
        followed = await self._watch(event.site, event.session_id, at,
                                     lambda state: wanted <= seen(state, event.turn), deadline)
        if followed is not None:
            return followed
        return await super().turn_state(event, wanted, deadline - time.monotonic(), at)

    async def _kept_current(self, site: str, session_id: str, floor: int) -> bool:
        """Whether the log feed keeps the conversation's cached state current up to `floor`
        (the handled event), once the feed has reached it; a feed that does not within
        `feed.WAIT_S` is lagging, and every state is detached."""
        feed = self.feed
        if feed is None or not self.cache.attached(site, session_id):
            return False
        if not await feed.reach(floor):
            feed.lagging(floor)
            return False
        return feed.current(site, session_id, floor)

    async def _watch(self, site: str, session_id: str, at: Position | None,
                     done: Callable[[ConversationState], bool], deadline: float) -> ConversationState | None:
        """The state the log feed keeps current, once `done(state)` or at `deadline`
        (time.monotonic). None when the feed does not keep the conversation current up to
        the handled event (not following, the state not attached, the feed lags or breaks
        while waiting): the caller reads the log."""
        feed, floor = self.feed, _floor(at, site, session_id)
        if floor is None or not await self._kept_current(site, session_id, floor):
            return None
        while feed.current(site, session_id, floor):
            change = feed.changed(site, session_id)
            try:
                feed.fold(site, session_id)
                state = self.cache.peek(site, session_id)
                if state is None:
                    return None
                remaining = deadline - time.monotonic()
                if done(state) or remaining <= 0:
                    return self.cache.get(site, session_id)
                # Woken by the conversation's next message or a break; a state dropped from the
                # cache meanwhile (evicted, a rewritten log) wakes nobody: looked at again shortly.
                await asyncio.wait((change,), timeout=min(remaining, WATCH_RECHECK_S))
            finally:
                feed.unwatch(site, session_id, change)
        return None

    async def _load(self, site: str, session_id: str, at: Position | None, write_snapshot: bool,
                    snapshot: bool = True) -> ConversationState:
        """The cache's state brought up to date (never change it). `snapshot`: False, a state
        not cached is folded from the log's start without looking for a snapshot (whose
        revision stays unknown)."""
        cache = self.cache
        start = cache.get(site, session_id)
        cached = start is not None
        revision = cache.revision(site, session_id) if cached else None
        if start is None:
            if snapshot:
                start, revision = await read_snapshot(self.bus, site, session_id)
            else:
                revision = UNKNOWN
        had_start = start is not None
        start, tail = await self._tail(site, session_id, start, at)
        if had_start and start is None:  # a rewritten log: folded from the beginning
            cache.drop(site, session_id)
        if cached and start is not None and any(r.seq > start.last_seq for r in tail):
            start = fork(start)  # handed out as it is: new events go into a fork of it
        try:
            # A fork of the cached state, or a snapshot's (decoded just now: ours), folded forward.
            state = fold_into(start if start is not None else ConversationState(), tail)
        except Exception:
            cache.drop(site, session_id)  # half-applied: never start from it again
            raise
        if not state.site:
            state.site, state.session_id = site, session_id
        cache.put(state)
        if not cached:
            cache.set_revision(site, session_id, revision)
            cache.set_snapshotted(site, session_id, start.event_count if start is not None else 0)
        # Counted from the last snapshot written or being written (`_snapshot_later` marks it at
        # once): requests of a session that start while a write is under way do not write it
        # again. Whether this load read anything does not matter: the feed folds a
        # conversation's events before the gateway's next turn-start load.
        past_snapshot = state.event_count - cache.snapshotted(site, session_id)
        if write_snapshot and past_snapshot >= self.bus.config.snapshot_every:
            self._snapshot_later(state, revision)
        return state

    def _snapshot_later(self, state: ConversationState, revision: int | None) -> None:
        """Write the state's snapshot after the load has returned: it shortens a later cold
        load, so nobody should wait for it (two KV round trips and the state's encoding).
        The state is encoded now, the write goes out in the background."""
        bus, cache = self.bus, self.cache
        data = encoded(bus, state)
        if data is None:
            return

        event_count = state.event_count
        before = cache.snapshotted(state.site, state.session_id)
        cache.set_snapshotted(state.site, state.session_id, event_count)  # being written: not again

        async def store(site: str, session_id: str, revision: int | None) -> None:
            try:
                if revision == UNKNOWN:
                    _, revision = await read_snapshot(bus, site, session_id)
                # The next write starts from this one's revision; a lost race leaves it unknown
                # (and the snapshot to the writer who won, as recent as this one).
                written = await stored(bus, site, session_id, data, revision)
                cache.set_revision(site, session_id, written or UNKNOWN)
            except Exception:  # noqa: BLE001 - a missing snapshot only means a longer fold
                cache.set_revision(site, session_id, UNKNOWN)
                if cache.snapshotted(site, session_id) == event_count:
                    cache.set_snapshotted(site, session_id, before)  # a later load tries again
                log.exception("snapshot write failed", extra={"site": site, "session_id": session_id})

        task = asyncio.create_task(store(state.site, state.session_id, revision), name="snapshot-write")
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def snapshots_written(self) -> None:
        """Until the snapshots being written in the background are (tests, a process stopping)."""
        await asyncio.gather(*self._writing, return_exceptions=True)


def _floor(at: Position | None, site: str, session_id: str) -> int | None:
    """The log position of the event acted on, when it is this conversation's."""
    if at is None or not subjects.matches(subjects.conversation(site, session_id), at.subject):
        return None
    return at.seq
