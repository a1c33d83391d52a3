"""Lead briefs for operators (ADMIN_TOKEN, or the site's API key for its site): read the
briefs and the triage the enricher wrote, and queue new ones (shared/briefs.py).

- `GET  /v1/sites/{site}/briefs`: every lead of the site and its latest brief, one line each;
- `GET  /v1/sites/{site}/briefs/{session_id}`: that lead's latest BriefCompleted in full, or
  its BriefFailed (404: not a lead, or no brief yet);
- `POST /v1/sites/{site}/briefs` (body optional, `{"leads": [session, ...]}`; none: every
  lead): one work item per lead, 202 with their request ids (404: a session is no lead);
- `POST /v1/sites/{site}/triage`: a triage of the open leads, 202 with its request id;
- `GET  /v1/sites/{site}/triage`: the latest triage, its items ranked (404: none yet).

Another site's key gets 404, as if the site had no leads. These paths are under the visitor
prefix `/v1/sites/` but are operators': the CORS middleware leaves them alone (`PATHS`), so
no page can read them from a browser, as for every operator endpoint.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from shared import briefs
from shared import events as ev
from shared import subjects
from services.gateway.openapi import OPERATOR_RESPONSES, SessionId, SiteId

PATHS = re.compile(r"^/v1/sites/[^/]+/(briefs|triage)(/|$)")
SessionToken = Annotated[str, msgspec.Meta(pattern=subjects.TOKEN_RE.pattern)]


class BriefsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    leads: list[SessionToken] | None = None


def _not_found(detail: str) -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": detail}, status_code=404)


def add_routes(api: FastAPI, operator) -> None:
    """The brief routes on the gateway's app; `operator` is its credential dependency."""

    @api.get("/v1/sites/{site}/briefs", responses=OPERATOR_RESPONSES)
    async def list_briefs(request: Request, site: SiteId, who=Depends(operator)):
        """Every lead of the site, newest capture first, with its latest brief's standing."""
        if not who.sees(site):
            return _not_found(f"no site {site}")
        bus = request.app.state.bus
        captures = await briefs.leads(bus, site)
        latest = await briefs.outcomes(bus, site)
        rows = [briefs.row(capture, latest.get(session)) for session, capture in captures.items()]
        return {"site": site, "leads": sorted(rows, key=lambda r: r["captured"], reverse=True)}

    @api.get("/v1/sites/{site}/briefs/{session_id}", responses=OPERATOR_RESPONSES)
    async def show_brief(request: Request, site: SiteId, session_id: SessionId, who=Depends(operator)):
        """The lead's latest brief outcome: a BriefCompleted in full, or its BriefFailed."""
        if not who.sees(site):
            return _not_found(f"no brief for {site}/{session_id}")
        latest = (await briefs.outcomes(request.app.state.bus, site, session_id)).get(session_id)
        if latest is None:
            return _not_found(f"no brief for {site}/{session_id}")
        return {"site": site, "session_id": session_id, "type": ev.event_type(latest), "event": ev.to_builtins(latest)}

    @api.post("/v1/sites/{site}/briefs", status_code=202, responses=OPERATOR_RESPONSES)
    async def request_briefs(request: Request, site: SiteId, who=Depends(operator)):
        """Queue a brief for each lead named (none named: every lead of the site)."""
        if not who.sees(site):
            return _not_found(f"no site {site}")
        try:
            body = msgspec.json.decode((await request.body()) or b"{}", type=BriefsRequest)
        except msgspec.MsgspecError as exc:
            return JSONResponse({"error": "invalid_request", "detail": str(exc)}, status_code=422)
        bus = request.app.state.bus
        try:
            items = await briefs.requests_for(bus, site, body.leads, producer="gateway")
        except briefs.UnknownLead as exc:
            return _not_found(str(exc))
        await briefs.queue(bus, items)
        return {"site": site, "queued": [{"session_id": i.session_id, "request_id": i.request_id} for i in items]}

    @api.post("/v1/sites/{site}/triage", status_code=202, responses=OPERATOR_RESPONSES)
    async def request_triage(request: Request, site: SiteId, who=Depends(operator)):
        """Queue a triage of the site's open leads (those whose latest brief completed)."""
        if not who.sees(site):
            return _not_found(f"no site {site}")
        item = briefs.triage_request(site, producer="gateway")
        await briefs.queue(request.app.state.bus, [item])
        return {"site": site, "request_id": item.request_id}

    @api.get("/v1/sites/{site}/triage", responses=OPERATOR_RESPONSES)
    async def show_triage(request: Request, site: SiteId, who=Depends(operator)):
        """The site's latest triage, its items ranked: call_first, nurture, disqualify (`status`
        completed); or, when the latest request gave up, why (`status` failed, `reason`)."""
        if not who.sees(site):
            return _not_found(f"no triage for {site}")
        triage = await briefs.latest_triage(request.app.state.bus, site)
        if triage is None:
            return _not_found(f"no triage for {site}")
        if isinstance(triage, ev.BriefFailed):
            return {"site": site, "request_id": triage.request_id, "status": "failed", "reason": triage.reason,
                    "ts": triage.ts}
        return {"site": site, "request_id": triage.request_id, "status": "completed", "backend": triage.backend,
                "leads": triage.leads, "model_error": triage.model_error, "ts": triage.ts,
                "items": [msgspec.to_builtins(i) for i in briefs.ranked(triage)]}
