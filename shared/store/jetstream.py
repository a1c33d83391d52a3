"""The conversation store on JetStream: a conversation's state is its latest KV snapshot
plus the log after it, folded.

Snapshots are an optimisation only: `state` gives the same state as folding the whole log
(the property tests hold it to that), and a missing, stale or unreadable snapshot just means
a longer fold. Every read for a handler is given the position of the event it acts on
(`at`), so it sees the log at least up to that event, even from a replica behind it.

This store keeps nothing between calls: each `state` is a read (a CLI, a test, a process
that folds nothing). Services and the gateway use `CachedStore` (cached.py) over it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError

from shared import accounts, briefs
from shared import events as ev
from shared import subjects
from shared.bus import Bus, Position
from shared.events import SCHEMA_VERSION
from shared.state import ConversationState, Record, apply
from shared.store.routes import Route, RouteWatch, WatchedRoute

log = logging.getLogger(__name__)

# Pauses between looks at the log while waiting. The subscription hears almost every
# awaited event; the log is only read again for one published in the moment between the
# first look and the subscription, so the pauses grow rather than reloading every 50 ms
# of a long wait (each look is a read and a fold).
RECHECK_S = (0.05, 0.1, 0.2, 0.4)
STORED_RECHECK_S = (0.0, 0.002, 0.005, 0.01, 0.02)  # pauses before looking for a heard event in the log


# What the fold makes of a log (shared/state.py): raised when it changes, so a snapshot the
# earlier fold wrote is not extended by the new one (the conversation is folded again from
# its log). 1: `sector_enriched`, enrichment's sector kept over the conversation's guess.
STATE_VERSION = 1


class Snapshot(msgspec.Struct, kw_only=True):
    schema_version: int
    state: ConversationState
    state_version: int = 0


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
    if snap.schema_version != SCHEMA_VERSION or snap.state_version != STATE_VERSION:
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
    data = encoded(bus, state)
    return data is not None and await stored(bus, state.site, state.session_id, data, revision) is not None


def encoded(bus: Bus, state: ConversationState) -> bytes | None:
    data = _encoder.encode(Snapshot(schema_version=SCHEMA_VERSION, state=state, state_version=STATE_VERSION))
    if len(data) > bus.max_event_bytes:
        log.warning("state too big to snapshot", extra={"site": state.site, "session_id": state.session_id,
                                                        "bytes": len(data)})
        return None
    return data


async def stored(bus: Bus, site: str, session_id: str, data: bytes, revision: int | None) -> int | None:
    """The snapshot's new revision, or None when another writer got there first."""
    kv = bus.bucket(subjects.SNAPSHOT_BUCKET)
    key = subjects.kv_key(site, session_id)
    try:
        if revision is None:
            return await kv.create(key, data)
        return await kv.update(key, data, last=revision)
    except (KeyWrongLastSequenceError, BadRequestError):
        return None


def fold_into(state: ConversationState, records: list) -> ConversationState:
    """Apply `records` to `state` itself (a state no one else holds yet), skipping those it
    holds already."""
    for record in records:
        if record.seq > state.last_seq:
            apply(state, record)
    return state


def rewritten(tail: list[Record], folded_turn: int) -> bool:
    """Turns already folded, appended again: the log was rewritten (a visitor's erasure)."""
    return any(isinstance(r.event, ev.TurnRequested) and r.event.turn <= folded_turn for r in tail)


def seen(state: ConversationState, turn: int) -> set[str]:
    record = state.turns.get(turn)
    return set(record.seen) if record else set()


class JetStreamStore:
    """Reads a conversation from the bus: its state, its events, a turn's route, a site's leads."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self._route_watch: RouteWatch | None = None  # made at the first race (`route`), then kept
        self._making_route_watch = asyncio.Lock()

    # --- state ----------------------------------------------------------------------------

    async def state(self, site: str, session_id: str, at: Position | None = None, turn: int = 0) -> ConversationState:
        """The conversation's state holding its log up to `at` at least (None: as stored now).
        The caller only reads it. `turn`: of the event acted on; in a first turn there is no
        snapshot to look up (the gateway writes the first one past SNAPSHOT_EVERY events)."""
        start, _ = await read_snapshot(self.bus, site, session_id) if turn != 1 else (None, None)
        return await self._folded(site, session_id, start, at)

    async def _folded(self, site: str, session_id: str, start: ConversationState | None,
                      at: Position | None) -> ConversationState:
        """`start` (a state of our own) with the log after it folded in."""
        start, tail = await self._tail(site, session_id, start, at)
        state = fold_into(start if start is not None else ConversationState(), tail)
        if not state.site:
            state.site, state.session_id = site, session_id
        return state

    async def _tail(self, site: str, session_id: str, start: ConversationState | None,
                    at: Position | None) -> tuple[ConversationState | None, list[Record]]:
        """The log after `start`, and `start`; or, when the log was rewritten since (a
        visitor's erasure: turns `start` holds appended again), the whole log and None."""
        after, folded_turn = (start.last_seq, start.turn) if start else (0, 0)
        tail = await self.bus.read(subjects.conversation(site, session_id), after_seq=after, at=at)
        if start is not None and rewritten(tail, folded_turn):
            return None, await self.bus.read(subjects.conversation(site, session_id), at=at)
        return start, tail

    async def _own(self, site: str, session_id: str, at: Position | None) -> ConversationState:
        """The state as `state` gives it, but the caller's to fold into."""
        return await self.state(site, session_id, at)

    async def turn_state(self, event: ev.Envelope, wanted: set[str], timeout_s: float,
                         at: Position | None = None) -> ConversationState:
        """The conversation's state with the `wanted` event types of `event`'s turn in it,
        or without those still missing when `timeout_s` has passed: one subscription, one
        load, more loads only while waiting.

        A subscriber can hear of an event a moment before the stream has stored it; such an
        event is folded into the returned state directly, after a short look for it in the log
        (so the state is one the log reproduces: its `last_seq` says what the node saw)."""
        site, session_id, turn = event.site, event.session_id, event.turn
        deadline = time.monotonic() + timeout_s
        if timeout_s <= 0:  # not waiting: no subscription to set up and tear down on the hot path
            return await self._own(site, session_id, at)
        heard: dict[str, ev.Envelope] = {}
        complete = asyncio.Event()
        missing: set[str] = set(wanted)

        async def on_message(msg):
            kind = msg.subject.rsplit(".", 1)[-1]
            if kind in missing and kind not in heard:
                try:
                    got = ev.decode(msg.data)
                except ev.BadEvent:
                    return
                if got.turn == turn and ev.subject_mismatch(got, msg.subject) is None:
                    heard[kind] = got
                    if missing <= heard.keys():
                        complete.set()

        sub = await self.bus.nc.subscribe(subjects.conversation(site, session_id), cb=on_message)
        try:
            state = await self._own(site, session_id, at)
            missing -= seen(state, turn)
            pauses = iter(RECHECK_S)
            while missing and not missing <= heard.keys() and (remaining := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(complete.wait(), min(remaining, next(pauses, RECHECK_S[-1])))
                except asyncio.TimeoutError:
                    # An event published just before we subscribed, and stored just after we
                    # looked, reaches neither: look at the log again.
                    state = await self._own(site, session_id, at)
                    missing -= seen(state, turn)
            for pause in STORED_RECHECK_S:
                if not (set(heard) - seen(state, turn)):
                    return state
                await asyncio.sleep(pause)
                state = await self._own(site, session_id, at)
            done = seen(state, turn)
            for kind, got in heard.items():
                if kind not in done:
                    apply(state, Record(seq=state.last_seq, subject=subjects.conv(site, session_id, kind), event=got))
            return state
        finally:
            await sub.unsubscribe()

    # --- typed reads ------------------------------------------------------------------------

    async def events(self, site: str, session_id: str, kind: str, at: Position | None = None) -> list[ev.Envelope]:
        """Every stored event of type `kind` in the conversation, in log order."""
        return [r.event for r in await self.bus.read(subjects.conv(site, session_id, kind), at=at)]

    async def latest(self, site: str, session_id: str, kind: str, at: Position | None = None) -> ev.Envelope | None:
        """The conversation's newest stored event of type `kind`, or None."""
        return await self.bus.last(subjects.conv(site, session_id, kind), at=at)

    async def open_briefs(self, site: str) -> list[ev.BriefCompleted]:
        """The latest brief of each of the site's open leads (shared/briefs.py)."""
        return await briefs.open_briefs(self.bus, site)

    async def portfolio(self, site: str, account_id: str) -> tuple[ev.Account | None, list[ev.Deal]]:
        """The site's account `account_id` (None: no such account) and its historical deals,
        newest first (shared/accounts.py)."""
        found = await accounts.account(self.bus, site, account_id) if account_id else None
        return found, await accounts.deals(self.bus, site)

    async def accounts(self, site: str) -> list[ev.Account]:
        """Every account of the site, by name (shared/accounts.py)."""
        return await accounts.accounts(self.bus, site)

    async def route(self, event: ev.Envelope, at: Position | None = None) -> Route:
        """`event`'s turn's route as it is decided, for racing work the route may cancel."""
        if self._route_watch is None:
            # One watch a store: races that start together (a backlog's handlers as a service
            # starts) wait for the first one's, rather than each subscribing to every route.
            async with self._making_route_watch:
                if self._route_watch is None:
                    self._route_watch = await RouteWatch.on(self.bus.nc)
        return WatchedRoute(self._route_watch, self.bus, event, at)

    def kb_vectors(self):
        """The site knowledge base's vectors bucket (shared/kb_vectors.py), or None."""
        return self.bus.kv.get(subjects.KB_VECTORS_BUCKET)
