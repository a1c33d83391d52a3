"""A turn's route, as the store gives it to a node that cancels work routed away.

The deferred-execution pattern: background work (enrichment, retrieval) starts as soon as it
can; a REDIRECT or BOOKING route for the turn makes its result useless, so the work is
cancelled as soon as the route is known. A node declares it (`Needs(route=True)`) and gets a
`Route` in its inputs: `await inputs.route.race(work)`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from typing import Callable, Iterable, Protocol

from nats.aio.client import Client as NATS

from shared import events as ev
from shared import subjects
from shared.bus import Bus, Position

# Routes that answer without background results: work still running for them is wasted.
CANCELLING_ROUTES = ("REDIRECT", "BOOKING")


class Route(Protocol):
    async def race(self, work: asyncio.Task) -> bool:
        """Wait for `work`; True if the turn was routed away (REDIRECT/BOOKING) first, in
        which case `work` was cancelled."""


class RouteWatch:
    """Every conversation's `RouteDecided`, heard on one subscription a store keeps (not a
    subscribe, a log read and an unsubscribe per turn: retrieval races each turn's route).
    REDIRECT and BOOKING routes are remembered (the newest MAX_REMEMBERED), so a race that
    starts after its turn was routed away is cancelled at once.

    A route published while the subscription was not in place (before it was made, or while
    the connection was down) was not heard: a turn requested before the watch could hear
    everything, allowing CLOCK_MARGIN_S for the clocks of the machines, is looked up in
    the log as before. A bus with no live connection never hears anything."""

    MAX_REMEMBERED = 50_000
    CLOCK_MARGIN_S = 1.0

    def __init__(self, nc, live: bool):
        # Weakly: the store that keeps the watch may outlive its connection (tests).
        self._nc, self.live = weakref.ref(nc), live
        self._routes: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self._followers: dict[tuple[str, str, int], list[Callable[[str], None]]] = {}
        self._hearing_since = float("inf")  # wall time from which every route was heard
        self._reconnects = 0

    @classmethod
    async def on(cls, nc) -> "RouteWatch":
        watch = cls(nc, live=isinstance(nc, NATS))
        await watch._subscribe(nc)
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


class WatchedRoute:
    """`event`'s turn's route as a `RouteWatch` hears it, or the log has it when the watch may
    have missed it."""

    def __init__(self, watch: RouteWatch, bus: Bus, event: ev.Envelope, at: Position | None):
        self._watch, self._bus, self._event, self._at = watch, bus, event, at

    async def race(self, work: asyncio.Task) -> bool:
        event = self._event
        routed: list[str] = []

        def route_away(route: str) -> None:
            if route in CANCELLING_ROUTES and not routed:
                routed.append(route)
                work.cancel()

        stop = self._watch.follow(event, route_away)
        try:
            if not self._watch.covers(event):  # a route stored before the watch heard everything
                for record in await self._bus.read(subjects.conv(event.site, event.session_id, "route_decided"),
                                                   at=self._at):
                    if record.event.turn == event.turn:
                        route_away(record.event.route)
            return await _awaited(work, routed)
        finally:
            stop()


class LoggedRoute:
    """The route as a given log has it (a replay, a test): decided already, or never."""

    def __init__(self, event: ev.Envelope, logged: Iterable[ev.Envelope]):
        self._routes = [e.route for e in logged if isinstance(e, ev.RouteDecided) and e.turn == event.turn
                        and e.route in CANCELLING_ROUTES]

    async def race(self, work: asyncio.Task) -> bool:
        if self._routes:
            work.cancel()
        return await _awaited(work, self._routes)


async def _awaited(work: asyncio.Task, routed: list[str]) -> bool:
    try:
        await work
    except asyncio.CancelledError:
        if not routed:
            raise  # we are being stopped ourselves
    return bool(routed)
