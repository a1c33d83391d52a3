"""Wait for a turn's events: from the log if they are already there, live otherwise.

The deferred-execution pattern: background work (enrichment, retrieval, post-processing)
starts as soon as it can; whoever needs its result waits here, bounded by a deadline, and
goes on without it when it is late.
"""

from __future__ import annotations

import asyncio
import time
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
    those still missing when `timeout_s` has passed. One subscription, one load, more loads
    only while waiting.

    A subscriber can hear of an event a moment before the stream has stored it; such an
    event is folded into the returned state directly (the returned state is a fork of the
    cache's, so no cache ever holds an event the log does not)."""
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
        deadline = time.monotonic() + timeout_s
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


async def race_with_route(bus: Bus, event: ev.Envelope, work: asyncio.Task) -> bool:
    """Wait for `work`; True if this turn was routed away (REDIRECT/BOOKING) first, in which
    case `work` was cancelled. Background nodes (enrichment, retrieval) use it so a turn that
    does not need their result does not pay for it."""
    routed = []

    def route_away(decided: ev.Envelope) -> None:
        if decided.turn == event.turn and decided.route in CANCELLING_ROUTES and not routed:
            routed.append(decided.route)
            work.cancel()

    async def on_route(msg):
        try:
            decided = ev.decode(msg.data)
        except ev.BadEvent:
            return
        if ev.subject_mismatch(decided, msg.subject) is None:
            route_away(decided)

    subject = subjects.conv(event.site, event.session_id, "route_decided")
    # Subscribe first, then look in the log: a route stored in between is seen either way.
    sub = await bus.nc.subscribe(subject, cb=on_route)
    try:
        for record in await bus.read(subject):
            route_away(record.event)
        try:
            await work
        except asyncio.CancelledError:
            if not routed:
                raise  # we are being stopped ourselves
        return bool(routed)
    finally:
        await sub.unsubscribe()
