"""Wait for a turn's events: from the log if they are already there, live otherwise.

The deferred-execution pattern: background work (enrichment, retrieval, post-processing)
starts as soon as it can; whoever needs its result waits here, bounded by a deadline, and
goes on without it when it is late.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from typing import Callable

from nats.aio.client import Client as NATS

from shared import events as ev
from shared import loader, subjects
from shared.bus import Bus
from shared.state import ConversationState, Record, apply

# Pauses between looks at the log while waiting. The subscription hears almost every
# awaited event; the log is only read again for one published in the moment between the
# first look and the subscription, so the pauses grow rather than reloading every 50 ms
# of a long wait (each look is a read and a fold).
RECHECK_S = (0.05, 0.1, 0.2, 0.4)
STORED_RECHECK_S = (0.0, 0.002, 0.005, 0.01, 0.02)  # pauses before looking for a heard event in the log
# Routes that answer without background results: work still running for them is wasted.
CANCELLING_ROUTES = ("REDIRECT", "BOOKING")


async def turn_state(bus: Bus, site: str, session_id: str, turn: int, wanted: set[str],
                     timeout_s: float) -> ConversationState:
    """The conversation's state with the `wanted` event types of `turn` in it, or without
    those still missing when `timeout_s` has passed.

    In a process that follows the log (shared/feed.py), the state its feed keeps current,
    as each of the conversation's events is stored (`loader.watch`): no subscription and no
    read; the cache's own state, which the caller only reads (as a handler's inputs). Otherwise,
    or when the feed stops keeping it (a break, a lag): one subscription, one load, more loads
    only while waiting. The deadline counts from this call, whichever way it waits.

    A subscriber can hear of an event a moment before the stream has stored it; such an
    event is folded into the returned state directly (on that way the returned state is a
    fork of the cache's, so no cache ever holds an event the log does not)."""
    deadline = time.monotonic() + timeout_s
    followed = await loader.watch(site, session_id, lambda state: wanted <= _seen(state, turn), deadline)
    if followed is not None:
        return followed
    timeout_s = deadline - time.monotonic()
    if timeout_s <= 0:  # not waiting: no subscription to set up and tear down on the hot path
        return await loader.load(bus, site, session_id, forked=True)
    heard: dict[str, ev.Envelope] = {}
    complete = asyncio.Event()
    missing: set[str] = set(wanted)

    async def on_message(msg):
        kind = msg.subject.rsplit(".", 1)[-1]
        if kind in missing and kind not in heard:
            try:
                event = ev.decode(msg.data)
            except ev.BadEvent:
                return
            if event.turn == turn and ev.subject_mismatch(event, msg.subject) is None:
                heard[kind] = event
                if missing <= heard.keys():
                    complete.set()

    sub = await bus.nc.subscribe(subjects.conversation(site, session_id), cb=on_message)
    try:
        state = await loader.load(bus, site, session_id, forked=True)
        missing -= _seen(state, turn)
        pauses = iter(RECHECK_S)
        while missing and not missing <= heard.keys() and (remaining := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(complete.wait(), min(remaining, next(pauses, RECHECK_S[-1])))
            except asyncio.TimeoutError:
                # An event published just before we subscribed, and stored just after we
                # looked, reaches neither: look at the log again.
                state = await loader.load(bus, site, session_id, forked=True)
                missing -= _seen(state, turn)
        # Heard is not yet stored: look in the log again, briefly, so the state is one the log
        # can reproduce (its `last_seq` says what the node saw, for replay); only an event
        # still not stored then is folded in directly.
        for pause in STORED_RECHECK_S:
            if not (set(heard) - _seen(state, turn)):
                return state
            await asyncio.sleep(pause)
            state = await loader.load(bus, site, session_id, forked=True)
        seen = _seen(state, turn)
        for kind, event in heard.items():
            if kind not in seen:
                apply(state, Record(seq=state.last_seq, subject=subjects.conv(site, session_id, kind), event=event))
        return state
    finally:
        await sub.unsubscribe()


def _seen(state: ConversationState, turn: int) -> set[str]:
    record = state.turns.get(turn)
    return set(record.seen) if record else set()


class RouteWatch:
    """Every conversation's `RouteDecided`, heard on one subscription a process keeps (not a
    subscribe, a log read and an unsubscribe per turn: retrieval races each turn's route).
    REDIRECT and BOOKING routes are remembered (the newest MAX_REMEMBERED), so a race that
    starts after its turn was routed away is cancelled at once.

    A route published while the subscription was not in place (before it was made, or while
    the connection was down) was not heard: a turn requested before the watch could hear
    everything, allowing CLOCK_MARGIN_S for the clocks of the machines, is looked up in
    the log as before. A bus with no live connection (a replay's) never hears anything."""

    MAX_REMEMBERED = 50_000
    CLOCK_MARGIN_S = 1.0

    def __init__(self, nc, live: bool):
        # Weakly: the watch is the value of a weak-keyed map whose key is this connection.
        self._nc, self.live = weakref.ref(nc), live
        self._routes: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self._followers: dict[tuple[str, str, int], list[Callable[[str], None]]] = {}
        self._hearing_since = float("inf")  # wall time from which every route was heard
        self._reconnects = 0

    @classmethod
    async def of(cls, bus: Bus) -> "RouteWatch":
        watch = _watches.get(bus.nc)
        if watch is None:
            watch = _watches[bus.nc] = cls(bus.nc, live=isinstance(bus.nc, NATS))
            await watch._subscribe(bus.nc)
        return watch

    async def _subscribe(self, nc) -> None:
        self._reconnects = self._reconnect_count()
        await nc.subscribe(subjects.conv("*", "*", "route_decided"), cb=self._heard)
        if self.live:
            await nc.flush()  # the server has the subscription: from now on, every route is heard
            self._hearing_since = time.time()

    def _reconnect_count(self) -> int:
        nc = self._nc()
        return nc.stats.get("reconnects", 0) if self.live and nc is not None else 0

    async def _heard(self, msg) -> None:
        try:
            decided = ev.decode(msg.data)
        except ev.BadEvent:
            return
        if (not isinstance(decided, ev.RouteDecided) or decided.route not in CANCELLING_ROUTES
                or ev.subject_mismatch(decided, msg.subject) is not None):
            return
        key = (decided.site, decided.session_id, decided.turn)
        self._routes[key] = decided.route
        if len(self._routes) > self.MAX_REMEMBERED:
            self._routes.popitem(last=False)
            self._hearing_since = time.time()  # an older turn's route may be forgotten now
        for follower in self._followers.get(key, ()):
            follower(decided.route)

    def covers(self, event: ev.Envelope) -> bool:
        """Whether any route of `event`'s turn was heard: the turn was requested after the
        watch could hear every route (and nothing was missed since)."""
        if self._reconnect_count() != self._reconnects:  # the connection went: routes may be missed
            self._reconnects, self._hearing_since = self._reconnect_count(), time.time()
        return event.ts - self.CLOCK_MARGIN_S >= self._hearing_since

    def follow(self, event: ev.Envelope, on_route: Callable[[str], None]) -> Callable[[], None]:
        """Call `on_route` with the REDIRECT or BOOKING route of `event`'s turn: now, when it
        was heard already, or when it is. Returns what stops following."""
        key = (event.site, event.session_id, event.turn)
        self._followers.setdefault(key, []).append(on_route)
        if key in self._routes:
            on_route(self._routes[key])

        def stop() -> None:
            followers = self._followers.get(key, [])
            if on_route in followers:
                followers.remove(on_route)
            if not followers:
                self._followers.pop(key, None)
        return stop


_watches: "weakref.WeakKeyDictionary[object, RouteWatch]" = weakref.WeakKeyDictionary()


async def race_with_route(bus: Bus, event: ev.Envelope, work: asyncio.Task) -> bool:
    """Wait for `work`; True if this turn was routed away (REDIRECT/BOOKING) first, in which
    case `work` was cancelled. Background nodes (enrichment, retrieval) use it so a turn that
    does not need their result does not pay for it."""
    routed = []

    def route_away(route: str) -> None:
        if route in CANCELLING_ROUTES and not routed:
            routed.append(route)
            work.cancel()

    watch = await RouteWatch.of(bus)
    stop = watch.follow(event, route_away)
    try:
        if not watch.covers(event):  # a route stored before the watch heard everything
            for record in await bus.read(subjects.conv(event.site, event.session_id, "route_decided")):
                if record.event.turn == event.turn:
                    route_away(record.event.route)
        try:
            await work
        except asyncio.CancelledError:
            if not routed:
                raise  # we are being stopped ourselves
        return bool(routed)
    finally:
        stop()
