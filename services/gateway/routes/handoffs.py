"""Human handoff, for operators (under the operator prefix: operator.py): the conversations
that wait for a person of the site's team, and what that person does in one (issue 42).

- `GET  handoffs`: the site's conversations whose handoff is waiting or held, oldest request
  first, each with its last messages, the visitor's profile and interest score, and the
  knowledge-base pages retrieval found for the latest question;
- `POST handoffs/{session_id}/claim` (`{"operator": NAME}`): `OperatorJoined`, 201; the
  first claim wins (handoffs.Claims), a later one by another operator is a 409 naming the
  holder, the holder's own again a 200 storing nothing. A conversation nobody asked a person
  for is joined the same way (the operator chose to: `HandoffRequested`, reason `operator`,
  first), on a site that takes handoffs;
- `POST handoffs/{session_id}/messages` (`{"operator": NAME, "text": ..., "client_message_id":
  ID}`): by the holder, `OperatorMessage`, 201; a message sent again with its
  `client_message_id` (a retry after a lost answer) is stored once (`"new": false`);
- `POST handoffs/{session_id}/release` (`{"operator": NAME}`): back to the AI, `OperatorLeft`
  (when held) and `HandoffEnded(released)`;
- `POST handoffs/{session_id}/close` (`{"operator": NAME}`): `HandoffEnded(closed)`, after
  `OperatorLeft` when held;
- `GET  handoffs/live`: the site's handoff activity as server-sent events (handoffs.site_feed),
  what the inbox in /admin listens to.

A conversation with no handoff waiting or held is a 404 (but to a claim); one held by another
operator a 409. NAME is who the visitor sees and the log records: a named operator's key
(operators.py) is its holder's name, and a request naming someone else with it is a 403; with
the site's shared key or ADMIN_TOKEN the request names who acts. The credential that acted
(`Operator.actor`) is logged beside it and kept in the claim.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from shared import events as ev
from shared import metrics, subjects
from shared.site_config import OPERATOR_NAME_RE
from shared.state import ConversationState
from services.gateway import frames, handoffs
from services.gateway.access import operator_of_site
from services.gateway.errors import Conflict, NotFound
from services.gateway.openapi import FEED_RESPONSES, LastEventId, SessionId, SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import RequestError, decode, read_body

log = logging.getLogger(__name__)
router = APIRouter()
Who = Annotated[Operator, Depends(operator_of_site)]

MESSAGES_SHOWN = 10  # the list's last messages of each conversation
SOURCES_SHOWN = 5  # the knowledge-base pages retrieval found for the latest question
MAX_BODY_BYTES = 64 * 1024  # the longest text (4,000 characters), every one escaped
OperatorName = Annotated[str, msgspec.Meta(
    pattern=OPERATOR_NAME_RE.pattern,
    description="who the visitor sees: 1-64 letters, digits, spaces, '.', '_' or '-', no space at either end; "
                "with a named operator's key, theirs (or left out)")]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
ClientMessageId = Annotated[str, msgspec.Meta(
    pattern=subjects.TOKEN_RE.pattern,
    description="the client's id for this message, the same when it sends the message again after a try that "
                "failed in transit: stored once")]


class OperatorAction(msgspec.Struct, forbid_unknown_fields=True):
    operator: OperatorName | None = None


class OperatorText(msgspec.Struct, forbid_unknown_fields=True):
    text: Text
    operator: OperatorName | None = None
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
    written = await asyncio.gather(*(handoffs.written_between(store, site, s.session_id) for s in open_))
    rows = [_row(state, messages) for state, messages in zip(open_, written)]
    return {"site": site, "handoffs": sorted(rows, key=lambda r: r["requested_ts"])}


def _row(state: ConversationState, between: list) -> dict:
    handoff = state.handoff
    return {"session_id": state.session_id, "status": handoff.status, "reason": handoff.reason,
            "requested_turn": handoff.requested_turn, "requested_ts": handoff.requested_ts,
            "operator": handoff.operator, "turn": state.turn,
            "messages": handoffs.transcript(state, between)[-MESSAGES_SHOWN:],
            "visitor_profile": msgspec.to_builtins(state.visitor_profile), "interest_score": state.interest.score,
            "sources": _sources(state)}


def _sources(state: ConversationState) -> list[dict]:
    """What retrieval found for the latest question it was asked (title, link, snippet): the
    pages an operator may point the visitor to."""
    for number in sorted(state.turns, reverse=True):
        record = state.turns[number]
        found = ev.public_sources(record.sources) if record.sources else record.metadata.get("sources") or []
        if found:
            return [{key: s.get(key, "") for key in ("title", "url", "snippet")} for s in found[:SOURCES_SHOWN]]
    return []


@router.post("/handoffs/{session_id}/claim")
async def claim(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """Hold the conversation: the AI stops answering, the visitor sees the operator join."""
    name = _name(who, await _action_of(request))
    state = await request.app.state.store.state(site, session_id)
    joining = state.handoff.status not in ("waiting", "held")  # nobody asked: the operator chooses to join
    if joining:
        await _joinable(request, state)
    elif state.handoff.status == "held" and state.handoff.operator == name:
        return _done(state, name, new=False)
    elif state.handoff.status == "held":  # the log says so, whatever the bucket still holds
        return _taken(handoffs.Taken(state.handoff.operator))
    number = state.handoff.handoffs + 1 if joining else state.handoff.handoffs
    try:
        await request.app.state.handoff_claims.claim(
            site, session_id, handoffs.Claim(operator=name, handoff=number, actor=who.actor))
    except handoffs.Taken as taken:
        return _taken(taken)
    try:
        if joining:
            await _store(request, who, _event(ev.HandoffRequested, state, "requested", "operator", number,
                                              reason="operator", detail=f"{name} joined"))
            metrics.handoffs.labels("operator").inc()
        new = await _store(request, who, _event(ev.OperatorJoined, state, "joined", name, number, operator=name))
    except Exception:  # not in the log: nobody holds it, so the next claim (this one sent again) may win
        await request.app.state.handoff_claims.end(site, session_id)
        raise
    if new:
        metrics.handoff_actions.labels("claim").inc()
    return _done(state, name, new, status="held")


@router.post("/handoffs/{session_id}/messages", status_code=201)
async def send_message(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """What the holder writes to the visitor, shown on the visitor's live channel."""
    body = decode(await read_body(request, MAX_BODY_BYTES), _text)
    name = _name(who, body)
    if not body.text.strip():
        raise RequestError("text", "text is empty")
    state = await _open(request, site, session_id)
    _held_by(state, name)
    if body.client_message_id:  # sent again (its answer lost to a dead gateway): the same id, kept once
        message = _event(ev.OperatorMessage, state, f"message:{body.client_message_id}", name,
                         operator=name, text=body.text)
    else:
        message = ev.OperatorMessage(event_id=ev.new_id(), site=site, session_id=session_id, turn=state.turn,
                                     ts=ev.now(), producer="gateway", operator=name, text=body.text)
    new = await _store(request, who, message)
    if new:
        metrics.handoff_actions.labels("message").inc()
        if not state.handoff.replied and state.handoff.requested_ts:
            metrics.handoff_first_reply_seconds.observe(max(0.0, message.ts - state.handoff.requested_ts))
    return {"site": site, "session_id": session_id, "operator": name, "ts": message.ts, "stored": True, "new": new}


@router.post("/handoffs/{session_id}/release")
async def release(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """Back to the AI: the holder leaves (or a waiting handoff is declined), the handoff ends."""
    return await _end(request, site, session_id, who, "released")


@router.post("/handoffs/{session_id}/close")
async def close(request: Request, site: SiteId, session_id: SessionId, who: Who):
    """The conversation is over: the holder leaves, the handoff ends closed."""
    return await _end(request, site, session_id, who, "closed")


async def _end(request: Request, site: str, session_id: str, who: Operator, outcome: str):
    name = _name(who, await _action_of(request))
    state = await _open(request, site, session_id)
    if state.handoff.status == "held":
        _held_by(state, name)
        await _store(request, who, _event(ev.OperatorLeft, state, "left", name, operator=name))
    await _store(request, who, _event(ev.HandoffEnded, state, f"ended:{outcome}", name, by=name, outcome=outcome))
    await request.app.state.handoff_claims.end(site, session_id)
    metrics.handoff_actions.labels("release" if outcome == "released" else "close").inc()
    return {"site": site, "session_id": session_id, "status": "", "outcome": outcome, "operator": name}


async def _open(request: Request, site: str, session_id: str) -> ConversationState:
    """The conversation's state, when a handoff of it is waiting or held (404 otherwise)."""
    state = await request.app.state.store.state(site, session_id)
    if state.handoff.status not in ("waiting", "held"):
        raise NotFound(f"no handoff waiting or held in {site}/{session_id}")
    return state


async def _action_of(request: Request) -> OperatorAction:
    """A claim's, release's or close's body: none at all is `{}` (a named operator's key says who)."""
    raw = await read_body(request, MAX_BODY_BYTES)
    return decode(raw, _action) if raw.strip() else OperatorAction()


def _name(who: Operator, body: OperatorAction | OperatorText) -> str:
    """Who acts: a named operator's key names them (a request naming another is refused);
    the site's shared key and ADMIN_TOKEN act for the operator the request names."""
    if who.name:
        if body.operator and body.operator != who.name:
            raise RequestError("operator", f"this key is {who.name}'s: it acts as {who.name} only", status=403)
        return who.name
    if not body.operator:
        raise RequestError("operator", 'who acts: {"operator": NAME} (a named operator\'s own key names them)')
    return body.operator


async def _joinable(request: Request, state: ConversationState) -> None:
    """An operator may join a conversation that exists, on a site that takes handoffs."""
    if state.event_count == 0 or state.session_id.startswith("_"):  # "_site", "_triage": the site's own logs
        raise NotFound(f"no conversation {state.site}/{state.session_id}")
    config = await request.app.state.sites.find(state.site)
    if config is None or not config.handoff.enabled:
        raise Conflict("this site does not take handoffs ([handoff] enabled = false): nobody can join")


def _held_by(state: ConversationState, operator: str) -> None:
    if state.handoff.status != "held":
        raise Conflict("nobody holds this conversation: claim it first")
    if state.handoff.operator != operator:
        raise Conflict(f"{state.handoff.operator} holds this conversation")


def _event(cls, state: ConversationState, step: str, name: str, number: int | None = None, **fields) -> ev.Envelope:
    """An operator's step in the conversation's handoff `number` (default: the current one),
    under an id derived from the handoff and the step: a request sent again is the same
    message, which JetStream keeps once."""
    cause = f"{state.site}/{state.session_id}/handoff/{state.handoff.handoffs if number is None else number}"
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


@router.get("/handoffs/live", responses=FEED_RESPONSES, response_class=StreamingResponse)
async def live_feed(request: Request, site: SiteId, last_event_id: LastEventId = None):
    """The site's handoff activity: a `ready` frame, then each handoff step (`handoff_requested`,
    `operator_joined`, `operator_message`, `operator_left`, `handoff_ended`) and each visitor's
    message (`turn_requested`), `{"type", "session_id", "turn", "ts", ...}`, with its log
    sequence as its id; those stored after `Last-Event-ID` (without it, from now), then live
    until the client goes. Keep-alive comments while nothing happens."""
    bus = request.app.state.bus
    after = handoffs.last_seq(last_event_id) or await handoffs.log_end(bus)
    return frames.response(handoffs.site_feed(bus, site, after), {}, request.app.state.settings.keepalive_s)
