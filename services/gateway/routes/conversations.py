"""A site's conversations, for operators (under the operator prefix: operator.py):

- `GET conversations`: newest first, one line each (turns, routes, intents, failed /
  blocked turns, lead captured), filtered by `route`, `intent`, `failed`, `blocked`, `lead`;
  read from the log in one pass (`limit`, at most 500 conversations);
- `GET conversations/{session_id}/events`: its whole event log (the operator UI's timeline);
- `GET conversations/{session_id}/state`: its folded state, or with `at` the state after
  that event.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from shared import events as ev
from shared import subjects
from shared.state import fold
from services.gateway.errors import NotFound
from services.gateway.openapi import SessionId, SiteId

router = APIRouter()
MAX_CONVERSATIONS = 500


def summary(events: list[ev.Envelope]) -> dict:
    """One conversation as a line of the list."""
    routes, intents, failed, blocked, lead, turns = [], [], [], [], False, set()
    first = events[0]
    last_message = ""
    for event in events:
        match event:
            case ev.TurnRequested():
                turns.add(event.turn)
                last_message = event.message[:120]
            case ev.TurnBlocked():
                turns.add(event.turn)
                blocked.append(event.turn)
            case ev.RouteDecided():
                routes.append(event.route)
                intents.append(event.intent)
            case ev.TurnFailed():
                failed.append(event.turn)
            case ev.LeadCaptured():
                lead = True
    return {"session_id": first.session_id, "started": first.ts, "last": events[-1].ts, "turns": len(turns),
            "routes": sorted(set(routes)), "intents": sorted(set(intents)), "failed_turns": sorted(set(failed)),
            "blocked_turns": blocked, "lead_captured": lead, "last_message": last_message}


@router.get("/conversations")
async def conversations(request: Request, site: SiteId,
                        route: Annotated[Literal["ANSWER", "REDIRECT", "BOOKING", "HANDOFF"] | None, Query()] = None,
                        intent: Annotated[str | None, Query(max_length=32)] = None,
                        failed: bool | None = None, blocked: bool | None = None, lead: bool | None = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_CONVERSATIONS)] = 100):
    """The site's conversations, newest first, filtered."""
    by_session: dict[str, list[ev.Envelope]] = {}
    for record in await request.app.state.bus.read(subjects.conversation(site, "*")):
        if ev.is_conversation(record.event.session_id):  # not the site's own logs (sources, triage, config)
            by_session.setdefault(record.event.session_id, []).append(record.event)
    rows = sorted((summary(events) for events in by_session.values()), key=lambda r: r["last"], reverse=True)
    rows = [r for r in rows
            if (route is None or route in r["routes"]) and (intent is None or intent in r["intents"])
            and (failed is None or bool(r["failed_turns"]) == failed)
            and (blocked is None or bool(r["blocked_turns"]) == blocked)
            and (lead is None or r["lead_captured"] == lead)]
    return {"site": site, "conversations": rows[:limit], "total": len(rows)}


@router.get("/conversations/{session_id}/events")
async def conversation_events(request: Request, site: SiteId, session_id: SessionId):
    """A conversation's whole event log."""
    records = await request.app.state.bus.read(subjects.conversation(site, session_id))
    if not records:
        raise NotFound(f"no conversation {site}/{session_id}")
    payload = [
        {"seq": r.seq, "subject": r.subject, "type": ev.event_type(r.event), "event": ev.to_builtins(r.event)}
        for r in records
    ]
    return Response(msgspec.json.encode({"site": site, "session_id": session_id, "events": payload}),
                    media_type="application/json")


@router.get("/conversations/{session_id}/state")
async def conversation_state(request: Request, site: SiteId, session_id: SessionId,
                             at: Annotated[int | None, Query(ge=1, description="the state after this event")] = None):
    """A conversation's folded state; with `at`, the state folded from its events up to that
    stream sequence."""
    if at is not None:
        records = await request.app.state.bus.read(subjects.conversation(site, session_id))
        state = fold(r for r in records if r.seq <= at)
    else:
        state = await request.app.state.store.state(site, session_id)
    if state.event_count == 0:
        raise NotFound(f"no conversation {site}/{session_id}")
    return Response(msgspec.json.encode(state), media_type="application/json")
