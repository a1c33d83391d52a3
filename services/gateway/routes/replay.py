"""Replay, for operators (under the operator prefix: operator.py): asked over the bus of
`concierge replay serve` (request-reply on `replay.request.<op>`), which runs it in its
sandbox, so the gateway imports no other service's code; 503 `replay_unavailable` when no
worker answers.

- `POST conversations/{session_id}/{rerun|diff|fork}`: one conversation run again with the
  current code (a fork: from an event, with a new message, and maybe other instructions);
- `POST verify`: the site's conversations rerun with their recorded LLM calls.
"""

from __future__ import annotations

import json
from typing import Literal

import msgspec
import nats.errors
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from shared import subjects
from services.gateway.openapi import SessionId, SiteId
from services.gateway.schemas import RequestError, decode

router = APIRouter()
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


_decoder = msgspec.json.Decoder(ReplayRequest)


@router.post("/conversations/{session_id}/{op}")
async def replay(request: Request, site: SiteId, session_id: SessionId, op: Literal["rerun", "diff", "fork"]):
    """Rerun, diff or fork one conversation (by `concierge replay serve`)."""
    body = decode(await request.body() or b"{}", _decoder)
    if op == "fork" and (body.at is None or not (body.message or "").strip()):
        raise RequestError("at" if body.at is None else "message", "a fork needs `at` and `message`")
    payload = {k: v for k, v in msgspec.to_builtins(body).items() if v is not None}
    return await ask(request, "rerun" if op == "diff" else op, {"site": site, "session_id": session_id, **payload})


@router.post("/verify")
async def verify(request: Request, site: SiteId):
    """Rerun the site's conversations with their recorded LLM calls: what diverges."""
    body = decode(await request.body() or b"{}", _decoder)
    return await ask(request, "verify", {"site": site, "since_s": body.since_s, "limit": body.limit,
                                         "current_config": body.current_config})


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
