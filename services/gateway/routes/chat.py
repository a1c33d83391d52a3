"""POST /v1/chat: one visitor turn, from the request to its stored `TurnRequested`, then
its frames as server-sent events (streams.py).

`chat` runs these steps in order, each a function below:

1. `admit`: the body decoded (schemas.py), the rate limits (the address's, then the site's),
   a configured site and an allowed origin, the conversation's token (a new conversation:
   an id of the server's);
2. `read_state` while `take_guard` takes the session's guard; a guard held by a turn the
   log says ended is taken over (`take_over`); a message sent again whose first try started
   its turn gets that turn's stream (`turns.sent_before`), not a second turn;
3. `after_last_turn`: no turn starts before the log ends the last one (429), and the gateway
   ends an overdue one itself;
4. the abuse gate (abuse_gate.py): a blocked turn is stored and answered, no LLM (`block`);
5. `request_turn`: the relay subscribes, then `TurnRequested` is appended, expecting the
   log's last one to be the state's (409 when another turn started meanwhile);
6. `live`: the relayed frames; at their end the guard is released and the turn counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from shared import events as ev
from shared import history, metrics, privacy, telemetry
from shared.bus import ConcurrencyConflict
from shared.state import ConversationState
from services.gateway import abuse_gate, frames, streams
from services.gateway.access import client_ip, configured_site, require_token
from services.gateway.errors import RETRY_AFTER_S, Conflict, RateLimited, TurnInProgress
from services.gateway.openapi import CHAT_OPENAPI, CHAT_RESPONSES, TokenHeader
from services.gateway.relay import TurnRelay
from services.gateway.schemas import ChatRequest, decode_chat, read_body
from services.gateway.settings import GatewaySettings
from services.gateway.turns import end_overdue_turn, sent_before, turn_ended

log = logging.getLogger(__name__)
router = APIRouter(tags=["visitor"])
tracer = telemetry.tracer("concierge.gateway")


@dataclasses.dataclass(frozen=True)
class Visit:
    """A chat request let in: what it asks, for which conversation, from which address."""

    request: Request
    body: ChatRequest
    session_id: str
    session_token: str
    ip: str | None
    ip_hash: str | None

    @property
    def site(self) -> str:
        return self.body.site

    @property
    def settings(self) -> GatewaySettings:
        return self.request.app.state.settings

    @property
    def visitor(self) -> dict | None:
        return msgspec.to_builtins(self.body.visitor) if self.body.visitor is not None else None


@router.post("/v1/chat", openapi_extra=CHAT_OPENAPI, responses=CHAT_RESPONSES, response_class=StreamingResponse)
async def chat(request: Request, x_session_token: TokenHeader = None):
    """One visitor turn, answered as server-sent events: `sources`, `token`..., then one
    `complete` (with the conversation's `session_token`) or one `error`."""
    started = time.perf_counter()
    visit = await admit(request, x_session_token)
    loading = read_state(visit)
    hold = await take_guard(visit, loading)
    if hold is None:
        state = await loading
        if (sent := sent_before(state, visit.body.client_message_id)) is not None:
            # Held for the turn this very message started (the client's first try was cut).
            return await streams.resumed(request, visit.site, visit.session_id, sent)
        hold = await take_over(visit, state)
    # The raw IP goes to Redis while the turn starts (enrichment reads it only after
    # TurnRequested, which is published once this is done): one round trip fewer in series.
    remembering = asyncio.ensure_future(remember_ip(visit))
    try:
        with tracer.start_as_current_span("chat turn") as span:
            # The one load of a turn that writes the conversation's snapshot (CachedStore.state).
            state = await loading
            if (sent := sent_before(state, visit.body.client_message_id)) is not None:
                # The message was sent before and that try started its turn: the client
                # reads that turn's stream, from its start; no second turn.
                await release(visit, hold)
                return await streams.resumed(request, visit.site, visit.session_id, sent)
            state = await after_last_turn(visit, state)
            turn = state.turn + 1
            span.set_attributes({"concierge.site": visit.site, "concierge.session": visit.session_id,
                                 "concierge.turn": turn})
            if (reason := abuse_gate.check(state, visit.body.message)) is not None:
                return await block(visit, turn, reason, hold)
            relay, requested = await request_turn(visit, state, turn, remembering)
    except ConcurrencyConflict:
        await release(visit, hold)
        metrics.turns.labels("none", "conflict").inc()
        raise Conflict("the conversation moved on while this turn started; retry") from None
    except BaseException:
        await release(visit, hold)
        raise
    finally:
        await asyncio.gather(remembering, return_exceptions=True)  # a turn that ended early: not left running
    return live(visit, relay, requested, hold, started)


async def admit(request: Request, x_session_token: str | None) -> Visit:
    """The request decoded and let in, or refused (422, 429, 404, 403): a visitor names only a
    conversation whose token it holds; a new one gets an id of the server's, so a visitor
    cannot pick someone else's."""
    settings: GatewaySettings = request.app.state.settings
    body = decode_chat(await read_body(request, settings.max_body_bytes))
    ip = client_ip(request, settings.trusted_proxy_hops)
    ip_hash = settings.privacy.ip_hash(ip) if ip else None
    await within_rate(request, None, ip_hash)
    await configured_site(request, body.site)
    if body.session_id is None:
        session_id = ev.new_id()
    else:
        session_id = body.session_id
        require_token(request, body.site, session_id, x_session_token or body.session_token)
    session_token = request.app.state.tokens.issue(body.site, session_id)
    await within_rate(request, body.site, None)
    return Visit(request, body, session_id, session_token, ip, ip_hash)


async def within_rate(request: Request, site: str | None, ip_hash: str | None) -> None:
    if (wait := await request.app.state.limiter.retry_after(site, ip_hash)) is not None:
        metrics.turns.labels("none", "rate_limited").inc()
        raise RateLimited(wait)


def read_state(visit: Visit) -> asyncio.Future:
    """The conversation's state, read while the guard is taken (two round trips at once, not
    one after the other). A read that starts before the guard is ours misses nothing the turn
    needs: the previous turn's end is stored before its stream's `complete` reaches the
    client, and a turn that started meanwhile fails the publish's sequence check. (The
    cache's own state: the turn start only reads it.)"""
    if visit.body.session_id is None:
        # A conversation we made up just now has no events: nothing to read.
        loading = asyncio.get_running_loop().create_future()
        loading.set_result(visit.request.app.state.store.begin(visit.site, visit.session_id))
        return loading
    return asyncio.ensure_future(visit.request.app.state.store.state(visit.site, visit.session_id,
                                                                     write_snapshot=True))


async def take_guard(visit: Visit, loading: asyncio.Future) -> int | None:
    """The session's guard, or None while it is held (the read goes on for the caller)."""
    try:
        return await visit.request.app.state.guard.acquire(visit.site, visit.session_id)
    except BaseException:
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        raise


async def take_over(visit: Visit, state: ConversationState) -> int:
    """The guard of a session whose last turn the log says ended (its gateway died before
    releasing it); 429 while a turn is in flight."""
    hold = None
    if turn_ended(state):
        hold = await visit.request.app.state.guard.take_over_ended(visit.site, visit.session_id,
                                                                   visit.settings.guard_takeover_s)
    if hold is None:
        metrics.turns.labels("none", "busy").inc()
        raise TurnInProgress("this session already has a turn in progress")
    return hold


async def after_last_turn(visit: Visit, state: ConversationState) -> ConversationState:
    """The state to start the next turn from. The guard is ours, but the log may not have
    ended the last turn (its visitor closed the stream): a next turn never overlaps it (429).
    Past the deadline nobody will end it, so the gateway does, in the log, and goes on."""
    if turn_ended(state):
        return state
    bus = visit.request.app.state.bus
    if not await end_overdue_turn(bus, visit.site, visit.session_id, state.turn, visit.settings.turn_deadline_s):
        metrics.turns.labels("none", "busy").inc()
        raise TurnInProgress("the previous turn of this session has not ended yet", retry_after_s=RETRY_AFTER_S)
    return await visit.request.app.state.store.state(visit.site, visit.session_id)


async def block(visit: Visit, turn: int, reason: str, hold: int) -> Response:
    """Store the turn as blocked and answer it with the localized reply: no LLM sees it."""
    lang = abuse_gate.language(visit.visitor, visit.request.headers.get("accept-language"))
    event = ev.TurnBlocked(
        event_id=ev.new_id(), site=visit.site, session_id=visit.session_id, turn=turn, ts=ev.now(),
        producer="gateway", reason=reason, reply=abuse_gate.reply(reason, lang),
        message_chars=len(visit.body.message), language=lang, client_message_id=visit.body.client_message_id,
    )
    await visit.request.app.state.bus.publish(event)
    await release(visit, hold)
    metrics.turns.labels("none", "blocked").inc()
    return streams.blocked(event, visit.session_token, visit.settings.keepalive_s)


async def request_turn(visit: Visit, state: ConversationState, turn: int,
                       remembering: asyncio.Future) -> tuple[TurnRelay, ev.TurnRequested]:
    """Subscribe to what the turn will produce, then append its `TurnRequested` (nothing
    produced can be missed), expecting the log's last one to be the state's."""
    bus, settings = visit.request.app.state.bus, visit.settings
    relay = TurnRelay(bus, visit.site, visit.session_id, turn, settings.turn_deadline_s, settings.turn_stall_s)
    await relay.open()
    try:
        await remembering
        requested = ev.TurnRequested(
            event_id=ev.new_id(), site=visit.site, session_id=visit.session_id, turn=turn, ts=ev.now(),
            producer="gateway", message=visit.body.message, visitor=visit.visitor, ip_hash=visit.ip_hash,
            client_message_id=visit.body.client_message_id, previous=history.previous_message(state, turn),
        )
        await bus.publish(requested, expected_subject_seq=state.turn_requested_seq)
    except BaseException:
        await relay.close()
        raise
    return relay, requested


def live(visit: Visit, relay: TurnRelay, requested: ev.TurnRequested, hold: int, started: float) -> Response:
    """The turn's frames as the relay hands them out, timed (time to the first token) and
    counted by route and outcome (no outcome: the visitor went away before the end); at the
    end the guard is released."""
    route, first_token = "none", True

    def seen(batch: list[dict]) -> None:
        nonlocal route, first_token
        for payload in batch:
            if first_token and payload["type"] == "token":
                first_token = False
                metrics.ttft_seconds.observe(time.perf_counter() - started)
            elif payload["type"] == "complete":
                route = str((payload.get("metadata") or {}).get("route") or "none")

    async def done() -> None:
        metrics.turns.labels(route, relay.outcome or "abandoned").inc()
        await release(visit, hold)

    body = streams.relayed(relay, frames.Numbering(relay.turn), visit.session_token, requested, seen, done)
    return frames.response(body, streams.sse_headers(visit.session_id, visit.session_token),
                           visit.settings.keepalive_s)


async def release(visit: Visit, hold: int) -> None:
    try:
        await visit.request.app.state.guard.release(visit.site, visit.session_id, hold)
    except Exception:
        # The TTL frees it anyway; say so rather than fail the response.
        log.exception("session guard release failed; it will expire by TTL")


async def remember_ip(visit: Visit) -> None:
    """Keep the raw IP in Redis (briefly) for enrichment; events carry only its hash.
    Redis trouble degrades enrichment and never blocks the turn. No IP: nothing to keep."""
    if not visit.ip:
        return
    try:
        await visit.request.app.state.redis.set(privacy.raw_ip_key(visit.site, visit.session_id), visit.ip,
                                                ex=int(visit.settings.privacy.raw_ip_ttl_s))
    except Exception as exc:
        log.warning("raw ip not stored; enrichment will skip IP sources", extra={"error": repr(exc)})
