"""Wait for a turn's events: from the log if they are already there, live otherwise.

The deferred-execution pattern: background work (enrichment, retrieval, post-processing)
starts as soon as it can; whoever needs its result waits here, bounded by a deadline, and
goes on without it when it is late.
"""

from __future__ import annotations

import asyncio
from shared import events as ev
from shared import loader, subjects
from shared.bus import Bus
from shared.state import ConversationState


async def turn_state(bus: Bus, site: str, session_id: str, turn: int, wanted: set[str],
                     timeout_s: float) -> ConversationState:
    """The conversation's state once `wanted` event types of `turn` are stored, or when
    `timeout_s` has passed, whichever is first. One subscription, one or two loads."""
    arrived: set[str] = set()
    complete = asyncio.Event()
    missing: set[str] = set(wanted)

    async def on_message(msg):
        kind = msg.subject.rsplit(".", 1)[-1]
        if kind in missing:
            try:
                event = ev.decode(msg.data)
            except ev.BadEvent:
                return
            if event.turn == turn:
                arrived.add(kind)
                if missing <= arrived:
                    complete.set()

    sub = await bus.nc.subscribe(subjects.conversation(site, session_id), cb=on_message)
    try:
        state = await loader.load(bus, site, session_id)
        record = state.turns.get(turn)
        missing -= set(record.seen if record else ())
        if not missing or missing <= arrived:
            return state
        try:
            await asyncio.wait_for(complete.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return await loader.load(bus, site, session_id)
    finally:
        await sub.unsubscribe()
