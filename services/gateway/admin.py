"""The operator UI (`/admin`) and the API it uses, for operators only (ADMIN_TOKEN, or a
site's API key for that site).

The page is static (static/admin.html); everything it shows comes from these endpoints:

- `GET /v1/admin/sites/{site}/conversations`: the site's conversations, newest first, one
  line each (turns, routes, intents, failed / blocked turns, lead captured), filtered by
  `route`, `intent`, `failed`, `blocked`, `lead`; read from the log in one pass (`limit`,
  at most 500 conversations);
- `GET /v1/conversations/{site}/{session}/events` and `.../state?at=SEQ` (app.py): the
  timeline and the state at any event;
- `POST /v1/admin/sites/{site}/conversations/{session}/{rerun|diff|fork}` and
  `POST /v1/admin/sites/{site}/verify`: asked over the bus of `concierge replay serve`
  (request-reply), which runs them in its sandbox; 503 when none is running;
- its Leads view: the lead-brief endpoints (briefs.py): the site's leads, a lead's brief and
  call script, "Write briefs again" and a triage, each waited for by asking again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import nats.errors
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from shared import events as ev
from shared import subjects

STATIC = Path(__file__).parent / "static"
MAX_CONVERSATIONS = 500
REPLAY_TIMEOUT_S = 120.0


class ReplayRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the page may ask of a rerun or a fork (checked here, before the bus)."""

    turn: int | None = None
    node: str | None = None
    llm: Literal["recorded", "live"] | None = None
    at: int | None = None  # fork: the last event kept
    message: str | None = None  # fork: the new visitor message
    instructions: str | None = None  # fork: the site's instructions replaced
    since_s: float | None = None  # verify
    limit: int | None = None  # verify
    # rerun, diff, verify: every turn under the deployment's LLM roles and the site's config
    # now, not those it was recorded with
    current_config: bool | None = None


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


def add_routes(api: FastAPI, operator) -> None:
    """The admin routes on the gateway's app; `operator` is its credential dependency."""

    def sees(who, site: str) -> JSONResponse | None:
        if not subjects.TOKEN_RE.match(site) or not who.sees(site):
            return JSONResponse({"error": "not_found", "detail": f"no site {site}"}, status_code=404)
        return None

    @api.get("/admin", include_in_schema=False)
    async def admin_page():
        return FileResponse(STATIC / "admin.html", media_type="text/html",
                            headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})

    @api.get("/v1/admin/sites/{site}/conversations")
    async def conversations(request: Request, site: str, who=Depends(operator),
                            route: Annotated[Literal["ANSWER", "REDIRECT", "BOOKING"] | None, Query()] = None,
                            intent: Annotated[str | None, Query(max_length=32)] = None,
                            failed: bool | None = None, blocked: bool | None = None, lead: bool | None = None,
                            limit: Annotated[int, Query(ge=1, le=MAX_CONVERSATIONS)] = 100):
        """The site's conversations, newest first, filtered."""
        if (refused := sees(who, site)) is not None:
            return refused
        by_session: dict[str, list[ev.Envelope]] = {}
        for record in await request.app.state.bus.read(subjects.conversation(site, "*")):
            by_session.setdefault(record.event.session_id, []).append(record.event)
        rows = sorted((summary(events) for events in by_session.values()), key=lambda r: r["last"], reverse=True)
        rows = [r for r in rows
                if (route is None or route in r["routes"]) and (intent is None or intent in r["intents"])
                and (failed is None or bool(r["failed_turns"]) == failed)
                and (blocked is None or bool(r["blocked_turns"]) == blocked)
                and (lead is None or r["lead_captured"] == lead)]
        return {"site": site, "conversations": rows[:limit], "total": len(rows)}

    async def ask(request: Request, op: str, payload: dict) -> Response:
        try:
            reply = await request.app.state.bus.nc.request(subjects.replay_request(op), json.dumps(payload).encode(),
                                                           timeout=REPLAY_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            return JSONResponse({"error": "replay_unavailable",
                                 "detail": "no replay worker is running: start `concierge replay serve`"},
                                status_code=503)
        body = json.loads(reply.data)
        if not body.pop("ok", False):
            return JSONResponse({"error": "replay_failed", "detail": body.get("error", "")}, status_code=422)
        return Response(json.dumps(body).encode(), media_type="application/json")

    async def decoded(request: Request) -> ReplayRequest:
        raw = await request.body()
        return msgspec.json.decode(raw or b"{}", type=ReplayRequest)

    @api.post("/v1/admin/sites/{site}/conversations/{session_id}/{op}")
    async def replay(request: Request, site: str, session_id: str, op: Literal["rerun", "diff", "fork"],
                     who=Depends(operator)):
        """Rerun, diff or fork one conversation (by `concierge replay serve`)."""
        if (refused := sees(who, site)) is not None:
            return refused
        if not subjects.TOKEN_RE.match(session_id):
            return JSONResponse({"error": "not_found", "detail": f"no conversation {site}/{session_id}"},
                                status_code=404)
        try:
            body = await decoded(request)
        except msgspec.MsgspecError as exc:
            return JSONResponse({"error": "invalid_request", "detail": str(exc)}, status_code=422)
        if op == "fork" and (body.at is None or not (body.message or "").strip()):
            return JSONResponse({"error": "invalid_request", "detail": "a fork needs `at` and `message`"},
                                status_code=422)
        payload = {k: v for k, v in msgspec.to_builtins(body).items() if v is not None}
        return await ask(request, "rerun" if op == "diff" else op, {"site": site, "session_id": session_id, **payload})

    @api.post("/v1/admin/sites/{site}/verify")
    async def verify(request: Request, site: str, who=Depends(operator)):
        """Rerun the site's conversations with their recorded LLM calls: what diverges."""
        if (refused := sees(who, site)) is not None:
            return refused
        try:
            body = await decoded(request)
        except msgspec.MsgspecError as exc:
            return JSONResponse({"error": "invalid_request", "detail": str(exc)}, status_code=422)
        return await ask(request, "verify", {"site": site, "since_s": body.since_s, "limit": body.limit,
                                             "current_config": body.current_config})
