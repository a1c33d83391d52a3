"""What the log says of a conversation's turns, for the gateway: which turn a message sent
again started, whether the last turn ended, and the gateway's own end of a turn nothing
ended (a `TurnFailed`). A turn ends only in the log: the session guard keeps a second
request out while a turn streams, the log decides whether it is over."""

from __future__ import annotations

import logging
import time

from shared import events as ev
from shared import subjects
from shared.bus import Bus

log = logging.getLogger(__name__)

OVERDUE_MARGIN_S = 5.0  # after a turn's deadline, before another request may end it


def sent_before(state, client_message_id: str | None) -> int | None:
    """The turn an earlier try of this message started (the newest turn, if it carries the
    same client message id), or None: the message starts a turn of its own."""
    record = state.turns.get(state.turn)
    if client_message_id is None or record is None or record.client_message_id != client_message_id:
        return None
    return state.turn


def turn_ended(state) -> bool:
    """No turn yet, or the newest one completed, failed or was blocked (per the log)."""
    record = state.turns.get(state.turn)
    return state.turn == 0 or (record is not None and record.status in ("completed", "failed", "blocked"))


async def end_turn(bus: Bus, requested: ev.TurnRequested, reason: str) -> None:
    """Store the gateway's `TurnFailed` for a turn nothing ended (one per turn: derived id).
    A failure to store it is logged: the next request of the session tries again."""
    failed = ev.follow(requested, ev.TurnFailed, "gateway", key="deadline", node="gateway", reason=reason,
                       attempts=0, failed_event_id=requested.event_id)
    try:
        await bus.publish(failed)
    except Exception:
        log.exception("could not store the end of an overdue turn", extra={"turn": requested.turn})


async def end_overdue_turn(bus: Bus, site: str, session_id: str, turn: int, deadline_s: float) -> bool:
    """True when the session's unfinished turn `turn` is past its deadline (plus a margin for
    its own relay to say so first) and is now ended in the log; False while it may still end."""
    requested = await bus.last(subjects.conv(site, session_id, "turn_requested"))
    if not (isinstance(requested, ev.TurnRequested) and requested.turn == turn):
        return True
    if time.time() - requested.ts < deadline_s + OVERDUE_MARGIN_S:
        return False
    await end_turn(bus, requested, f"no outcome within the turn deadline ({deadline_s:g} s); ended by the next request")
    return True
