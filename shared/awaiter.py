"""Wait for an event of a given turn: from the log if it is already there, live otherwise.

The deferred-execution pattern: background work (enrichment, retrieval) starts at the
turn's beginning; whoever needs its result waits here, bounded by a deadline, and goes on
without it when it is late.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from shared import events as ev
from shared import subjects
from shared.bus import Bus


async def turn_event(
    bus: Bus, site: str, session_id: str, turn: int, event_type: str, timeout_s: float,
    match: Callable[[ev.Envelope], bool] = lambda e: True,
) -> ev.Envelope | None:
    """The first `event_type` event of `turn` that satisfies `match`, or None after `timeout_s`."""
    subject = subjects.conv(site, session_id, event_type)
    found: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_message(msg):
        try:
            event = ev.decode(msg.data)
        except ev.BadEvent:
            return
        if event.turn == turn and match(event) and not found.done():
            found.set_result(event)

    # Subscribe first, then look in the log: an event stored in between is seen either way.
    sub = await bus.nc.subscribe(subject, cb=on_message)
    try:
        for record in await bus.read(subject):
            if record.event.turn == turn and match(record.event):
                return record.event
        return await asyncio.wait_for(found, timeout_s)
    except asyncio.TimeoutError:
        return None
    finally:
        await sub.unsubscribe()
