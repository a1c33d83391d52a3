"""POST /v1/sites/{site}/conversations/{session_id}/turns/{turn}/feedback: the visitor's vote
on a turn's answer (the widget's thumbs up and down), stored as a `FeedbackGiven` in the
conversation's log. A turn's latest vote counts; a vote changed is a new event, not an edit.

`give_feedback` runs these steps in order:

1. the body decoded (schemas.py: 422 naming the field, the reason trimmed), the address's
   rate (429: votes count apart from chat turns), the site, the origin and the
   conversation's token (access.py: 404, 403);
2. `answered`: a turn the conversation has (404) whose answer is complete (409: not yet
   answered, blocked or failed);
3. `store_vote`: the same vote as the turn's latest stores nothing (200); another is stored
   (201) under an id derived from the vote and the one it replaces, so a request sent again
   while its first try was in flight is the same message, which JetStream keeps once.
"""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from shared import events as ev
from services.gateway.access import client_ip, own_conversation
from services.gateway.errors import Conflict, NotFound, RateLimited
from services.gateway.openapi import FEEDBACK_OPENAPI, FEEDBACK_RESPONSES, SessionId, SiteId, TokenHeader, Turn
from services.gateway.schemas import (MAX_FEEDBACK_BODY_BYTES, FeedbackRequest, FeedbackStored, decode_feedback,
                                      read_body)

router = APIRouter(tags=["visitor"])
FEEDBACK = "feedback_given"
# Why a turn that is not complete has nothing to vote on, by its status (shared/state.py).
UNANSWERED = {
    "requested": "turn {turn} has not been answered yet; vote once its answer is complete",
    "blocked": "turn {turn} was blocked: it has no answer to vote on",
    "failed": "turn {turn} failed: it has no answer to vote on",
}


@router.post("/v1/sites/{site}/conversations/{session_id}/turns/{turn}/feedback", status_code=201,
             openapi_extra=FEEDBACK_OPENAPI, responses=FEEDBACK_RESPONSES)
async def give_feedback(request: Request, site: SiteId, session_id: SessionId, turn: Turn,
                        x_session_token: TokenHeader = None) -> Response:
    """The visitor's vote on turn `turn`'s answer (X-Session-Token required): `up` or `down`,
    with what they wrote, if anything. The turn's latest vote counts."""
    vote = decode_feedback(await read_body(request, MAX_FEEDBACK_BODY_BYTES))
    await within_rate(request)
    await own_conversation(request, site, session_id, x_session_token)
    await answered(request, site, session_id, turn)
    new = await store_vote(request, site, session_id, turn, vote)
    body = FeedbackStored(turn=turn, rating=vote.rating, reason=vote.reason, stored=True, new=new)
    return Response(msgspec.json.encode(body), status_code=201 if new else 200, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


async def within_rate(request: Request) -> None:
    """The address's votes this minute (RATE_LIMIT_PER_IP_PER_MIN, counted apart from its chat
    turns), before the site is looked up, as chat.py's `admit` does."""
    settings = request.app.state.settings
    ip = client_ip(request, settings.trusted_proxy_hops)
    wait = await request.app.state.vote_limiter.retry_after(None, settings.privacy.ip_hash(ip) if ip else None)
    if wait is not None:
        raise RateLimited(wait)


async def answered(request: Request, site: str, session_id: str, turn: int) -> None:
    """Turn `turn` is one of the conversation's and its answer is complete (TurnCompleted)."""
    state = await request.app.state.store.state(site, session_id)
    record = state.turns.get(turn)
    if record is None or turn > state.turn:
        raise NotFound(f"no turn {turn} in conversation {site}/{session_id}")
    if record.status != "completed":
        raise Conflict(UNANSWERED.get(record.status, "turn {turn} has no answer to vote on").format(turn=turn))


async def store_vote(request: Request, site: str, session_id: str, turn: int, vote: FeedbackRequest) -> bool:
    """Store the vote unless it is the turn's latest already; True when this request stored it."""
    votes = [e for e in await request.app.state.store.events(site, session_id, FEEDBACK) if e.turn == turn]
    latest = votes[-1] if votes else None
    if latest is not None and (latest.rating, latest.reason) == (vote.rating, vote.reason):
        return False
    event = ev.FeedbackGiven(event_id=vote_id(site, session_id, turn, vote, latest), site=site, session_id=session_id,
                             turn=turn, ts=ev.now(), producer="gateway", rating=vote.rating, reason=vote.reason)
    ack = await request.app.state.bus.publish(event)
    return not ack.duplicate


def vote_id(site: str, session_id: str, turn: int, vote: FeedbackRequest, replaced: ev.FeedbackGiven | None) -> str:
    """The same vote on top of the same latest one: the same id (a request sent again is one
    message). A vote that changes the latest, back to an earlier one too: another id."""
    cause = replaced.event_id if replaced is not None else f"{site}/{session_id}/{turn}"
    return ev.derived_id(cause, "gateway", f"feedback:{vote.rating}:{vote.reason}")
