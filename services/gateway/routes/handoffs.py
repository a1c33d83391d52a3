"""Human handoff, for operators (under the operator prefix: operator.py): the conversations
that wait for a person of the site's team, and what that person does in one (issue 42).

- `GET  handoffs`: the site's conversations whose handoff is waiting or held, oldest request
  first, each with its last messages, the visitor's profile and interest score;
- `POST handoffs/{session_id}/claim` (`{"operator": NAME}`): `OperatorJoined`, 201; the
  first claim wins (handoffs.Claims), a later one by another operator is a 409 naming the
  holder, the holder's own again a 200 storing nothing;
- `POST handoffs/{session_id}/messages` (`{"operator": NAME, "text": ..., "client_message_id":
  ID}`): by the holder, `OperatorMessage`, 201; a message sent again with its
  `client_message_id` (a retry after a lost answer) is stored once (`"new": false`);
- `POST handoffs/{session_id}/release` (`{"operator": NAME}`): back to the AI, `OperatorLeft`
  (when held) and `HandoffEnded(released)`;
- `POST handoffs/{session_id}/close` (`{"operator": NAME}`): `HandoffEnded(closed)`, after
  `OperatorLeft` when held.

A conversation with no handoff waiting or held is a 404; one held by another operator a 409.
NAME is who the visitor sees and the log records; the credential that acted (ADMIN_TOKEN or
the site's key, `Operator.actor`) is logged beside it and kept in the claim.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from shared import events as ev
from shared import metrics, subjects
from shared.state import ConversationState
from services.gateway import handoffs
from services.gateway.access import operator_of_site
from services.gateway.errors import Conflict, NotFound
from services.gateway.openapi import SessionId, SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import RequestError, decode, read_body

log = logging.getLogger(__name__)
router = APIRouter()
Who = Annotated[Operator, Depends(operator_of_site)]

MESSAGES_SHOWN = 10  # the list's last messages of each conversation
MAX_BODY_BYTES = 64 * 1024  # the longest text (4,000 characters), every one escaped
OperatorName = Annotated[str, msgspec.Meta(
    pattern=r"^[\w.-]([\w .-]{0,62}[\w.-])?\Z",
    description="who the visitor sees: 1-64 letters, digits, spaces, '.', '_' or '-', no space at either end")]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
ClientMessageId = Annotated[str, msgspec.Meta(
    pattern=subjects.TOKEN_RE.pattern,
    description="the client's id for this message, the same when it sends the message again after a try that "
                "failed in transit: stored once")]


class OperatorAction(msgspec.Struct, forbid_unknown_fields=True):
    operator: OperatorName


class OperatorText(msgspec.Struct, forbid_unknown_fields=True):
    operator: OperatorName
    text: Text
    client_message_id: ClientMessageId | None = None


_action = msgspec.json.Decoder(OperatorAction)
_text = msgspec.json.Decoder(OperatorText)


@router.get("/handoffs")
async def list_handoffs(request: Request, site: SiteId):
    """The site's conversations waiting for an operator or held by one."""
    bus, store = request.app.state.bus, request.app.state.store
    requested = await bus.read(subjects.conv_of_type("handoff_requested", site))
    sessions = list(dict.fromkeys(r.event.session_id for r in requested))
    states = await asyncio.gather(*(store.state(site, s) for s in sessions))
    open_ = [s for s in states if s.handoff.status in ("waiting", "held")]
    written = await asyncio.gather(*(store.events(site, s.session_id, "operator_message") for s in open_))
    rows = [_row(state, messages) for state, messages in zip(open_, written)]
    return {"site": site, "handoffs": sorted(rows, key=lambda r: r["requested_ts"])}


def _row(state: ConversationState, operator_messages: list) -> dict:
    handoff = state.handoff
    return {"session_id": state.session_id, "status": handoff.status, "reason": handoff.reason,
            "requested_turn": handoff.requested_turn, "requested_ts": handoff.requested_ts,
            "operator": handoff.operator, "turn": state.turn,
            "messages": handoffs.transcript(state, operator_messages)[-MESSAGES_SHOWN:],
            "visitor_profile": msgspec.to_builtins(state.visitor_profile), "interest_score": state.interest.score}


@router.post("/handoffs/{session_id}/claim")
async def claim(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """Hold the conversation: the AI stops answering, the visitor sees the operator join."""
    body = decode(await read_body(request, MAX_BODY_BYTES), _action)
    state = await _open(request, site, session_id)
    if state.handoff.status == "held" and state.handoff.operator == body.operator:
        return _done(state, body.operator, new=False)
    if state.handoff.status == "held":  # the log says so, whatever the bucket still holds
        return _taken(handoffs.Taken(state.handoff.operator))
    try:
        await request.app.state.handoff_claims.claim(
            site, session_id, handoffs.Claim(operator=body.operator, handoff=state.handoff.handoffs, actor=who.actor))
    except handoffs.Taken as taken:
        return _taken(taken)
    joined = _event(ev.OperatorJoined, state, "joined", body.operator, operator=body.operator)
    new = await _store(request, who, joined)
    if new:
        metrics.handoff_actions.labels("claim").inc()
    return _done(state, body.operator, new, status="held")


@router.post("/handoffs/{session_id}/messages", status_code=201)
async def send_message(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """What the holder writes to the visitor, shown on the visitor's live channel."""
    body = decode(await read_body(request, MAX_BODY_BYTES), _text)
    if not body.text.strip():
        raise RequestError("text", "text is empty")
    state = await _open(request, site, session_id)
    _held_by(state, body.operator)
    if body.client_message_id:  # sent again (its answer lost to a dead gateway): the same id, kept once
        message = _event(ev.OperatorMessage, state, f"message:{body.client_message_id}", body.operator,
                         operator=body.operator, text=body.text)
    else:
        message = ev.OperatorMessage(event_id=ev.new_id(), site=site, session_id=session_id, turn=state.turn,
                                     ts=ev.now(), producer="gateway", operator=body.operator, text=body.text)
    new = await _store(request, who, message)
    if new:
        metrics.handoff_actions.labels("message").inc()
        if not state.handoff.replied and state.handoff.requested_ts:
            metrics.handoff_first_reply_seconds.observe(max(0.0, message.ts - state.handoff.requested_ts))
    return {"site": site, "session_id": session_id, "operator": body.operator, "ts": message.ts, "stored": True,
            "new": new}


@router.post("/handoffs/{session_id}/release")
async def release(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """Back to the AI: the holder leaves (or a waiting handoff is declined), the handoff ends."""
    return await _end(request, site, session_id, who, "released")


@router.post("/handoffs/{session_id}/close")
async def close(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """The conversation is over: the holder leaves, the handoff ends closed."""
    return await _end(request, site, session_id, who, "closed")


async def _end(request: Request, site: str, session_id: str, who: Operator, outcome: str):
    body = decode(await read_body(request, MAX_BODY_BYTES), _action)
    state = await _open(request, site, session_id)
    if state.handoff.status == "held":
        _held_by(state, body.operator)
        await _store(request, who, _event(ev.OperatorLeft, state, "left", body.operator, operator=body.operator))
    await _store(request, who, _event(ev.HandoffEnded, state, f"ended:{outcome}", body.operator,
                                      by=body.operator, outcome=outcome))
    await request.app.state.handoff_claims.end(site, session_id)
    metrics.handoff_actions.labels("release" if outcome == "released" else "close").inc()
    return {"site": site, "session_id": session_id, "status": "", "outcome": outcome, "operator": body.operator}


async def _open(request: Request, site: str, session_id: str) -> ConversationState:
    """The conversation's state, when a handoff of it is waiting or held (404 otherwise)."""
    state = await request.app.state.store.state(site, session_id)
    if state.handoff.status not in ("waiting", "held"):
        raise NotFound(f"no handoff waiting or held in {site}/{session_id}")
    return state


def _held_by(state: ConversationState, operator: str) -> None:
    if state.handoff.status != "held":
        raise Conflict("nobody holds this conversation: claim it first")
    if state.handoff.operator != operator:
        raise Conflict(f"{state.handoff.operator} holds this conversation")


def _event(cls, state: ConversationState, step: str, name: str, **fields) -> ev.Envelope:
    """An operator's step in the conversation's current handoff, under an id derived from the
    handoff and the step: a request sent again is the same message, which JetStream keeps once."""
    cause = f"{state.site}/{state.session_id}/handoff/{state.handoff.handoffs}"
    return cls(event_id=ev.derived_id(cause, "gateway", f"{step}:{name}"), site=state.site,
               session_id=state.session_id, turn=state.turn, ts=ev.now(), producer="gateway", **fields)


async def _store(request: Request, who: Operator, event: ev.Envelope) -> bool:
    """Publish `event`: True when this request stored it (False: a repeat, dropped)."""
    ack = await request.app.state.bus.publish(event)
    log.info("handoff step", extra={"site": event.site, "session_id": event.session_id, "type": ev.event_type(event),
                                    "operator": getattr(event, "operator", getattr(event, "by", "")),
                                    "actor": who.actor, "seq": ack.seq})
    return not ack.duplicate


def _taken(taken: handoffs.Taken) -> JSONResponse:
    return JSONResponse({"error": "conflict", "detail": str(taken), "holder": taken.holder}, status_code=409)


def _done(state: ConversationState, operator: str, new: bool, status: str = "held") -> JSONResponse:
    body = {"site": state.site, "session_id": state.session_id, "status": status, "operator": operator, "new": new}
    return JSONResponse(body, status_code=201 if new else 200)
