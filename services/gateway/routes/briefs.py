"""Lead briefs, for operators (under the operator prefix: operator.py): read the briefs and
the triage the enricher wrote, and queue new ones (shared/briefs.py).

- `GET  briefs`: every lead of the site and its latest brief, one line each;
- `GET  briefs/{session_id}`: that lead's latest BriefCompleted in full, or its BriefFailed
  (404: not a lead, or no brief yet);
- `POST briefs` (body optional, `{"leads": [session, ...]}`; none: every lead): one work
  item per lead, 202 with their request ids (404: a session is no lead);
- `POST triage`: a triage of the open leads, 202 with its request id;
- `GET  triage`: the latest triage, its items ranked (404: none yet).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Request

from shared import briefs
from shared import events as ev
from shared import subjects
from services.gateway.errors import NotFound
from services.gateway.openapi import SessionId, SiteId
from services.gateway.schemas import decode

router = APIRouter()
SessionToken = Annotated[str, msgspec.Meta(pattern=subjects.TOKEN_RE.pattern)]


class BriefsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    leads: list[SessionToken] | None = None


_decoder = msgspec.json.Decoder(BriefsRequest)


@router.get("/briefs")
async def list_briefs(request: Request, site: SiteId):
    """Every lead of the site, newest capture first, with its latest brief's standing."""
    bus = request.app.state.bus
    captures = await briefs.leads(bus, site)
    latest = await briefs.outcomes(bus, site)
    rows = [briefs.row(capture, latest.get(session)) for session, capture in captures.items()]
    return {"site": site, "leads": sorted(rows, key=lambda r: r["captured"], reverse=True)}


@router.get("/briefs/{session_id}")
async def show_brief(request: Request, site: SiteId, session_id: SessionId):
    """The lead's latest brief outcome: a BriefCompleted in full, or its BriefFailed."""
    latest = (await briefs.outcomes(request.app.state.bus, site, session_id)).get(session_id)
    if latest is None:
        raise NotFound(f"no brief for {site}/{session_id}")
    return {"site": site, "session_id": session_id, "type": ev.event_type(latest), "event": ev.to_builtins(latest)}


@router.post("/briefs", status_code=202)
async def request_briefs(request: Request, site: SiteId):
    """Queue a brief for each lead named (none named: every lead of the site)."""
    body = decode(await request.body() or b"{}", _decoder)
    bus = request.app.state.bus
    try:
        items = await briefs.requests_for(bus, site, body.leads, producer="gateway")
    except briefs.UnknownLead as exc:
        raise NotFound(str(exc)) from None
    await briefs.queue(bus, items)
    return {"site": site, "queued": [{"session_id": i.session_id, "request_id": i.request_id} for i in items]}


@router.post("/triage", status_code=202)
async def request_triage(request: Request, site: SiteId):
    """Queue a triage of the site's open leads (those whose latest brief completed)."""
    item = briefs.triage_request(site, producer="gateway")
    await briefs.queue(request.app.state.bus, [item])
    return {"site": site, "request_id": item.request_id}


@router.get("/triage")
async def show_triage(request: Request, site: SiteId):
    """The site's latest triage, its items ranked: call_first, nurture, disqualify (`status`
    completed); or, when the latest request gave up, why (`status` failed, `reason`)."""
    triage = await briefs.latest_triage(request.app.state.bus, site)
    if triage is None:
        raise NotFound(f"no triage for {site}")
    if isinstance(triage, ev.BriefFailed):
        return {"site": site, "request_id": triage.request_id, "status": "failed", "reason": triage.reason,
                "ts": triage.ts}
    return {"site": site, "request_id": triage.request_id, "status": "completed", "backend": triage.backend,
            "leads": triage.leads, "model_error": triage.model_error, "ts": triage.ts,
            "items": [msgspec.to_builtins(i) for i in briefs.ranked(triage)]}
