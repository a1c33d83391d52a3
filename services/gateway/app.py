"""The HTTP API: chat over SSE, health, the visitor's own conversation, and operator reads.

Two kinds of caller (docs/security.md): visitors, who own a conversation by its session
token (sessions.py) and see only what the widget shows (visitor_view.py), from the origins
their site allows (cors.py); and operators, with a bearer token (operators.py), who also
read and queue lead briefs (briefs.py).
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import anyio
import msgspec
import nats.errors
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from sse_starlette import EventSourceResponse

from shared import events as ev
from shared import history, logs, metrics, privacy, redis_client, subjects, telemetry
from shared.bus import Bus, ConcurrencyConflict, connect, topology_ready
from shared.service import start_ops
from shared.session_guard import SessionGuard
from shared.state import fold
from shared.site_config import SiteConfig, SiteConfigs
from shared.store import CachedStore
from services.gateway import abuse_gate, admin, briefs, frames, visitor_view
from services.gateway.cors import SiteCORS, origin_allowed
from services.gateway.openapi import (CHAT_OPENAPI, CHAT_RESPONSES, OPERATOR_RESPONSES, RESUME_RESPONSES,
                                      VISITOR_READ_RESPONSES, LastEventId, SessionId, SiteId, TokenHeader, Turn,
                                      bearer)
from services.gateway.operators import Operator, OperatorAuth, Unauthorized, check_admin_token
from services.gateway.rate_limit import RateLimiter
from services.gateway.relay import TurnRelay, from_log, restart
from services.gateway.schemas import RequestError, decode_chat, read_body
from services.gateway.sessions import SessionTokens
from services.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"  # the demo page and the embeddable widget
VISITOR_PATHS = ("/v1/chat", "/v1/sites/")  # CORS for these only, from the sites' allowed_origins
OPERATOR_UNDER_VISITOR_PATHS = briefs.PATHS  # ... except these, operators' (no CORS)
OVERDUE_MARGIN_S = 5.0  # after a turn's deadline, before another request may end it


RETRY_AFTER_S = 2  # what a 503 asks a client to wait: the bus back, or the sites loaded


class NotReady(Exception):
    """This gateway cannot answer yet (its sites are not loaded): 503 with Retry-After."""


async def ready(app: FastAPI) -> bool:
    """What /readyz says: the bus and its streams there, and the site registry loaded, so a
    site the gateway cannot find is one that is not configured."""
    try:
        return await topology_ready(app.state.bus) and await app.state.sites.loaded()
    except (nats.errors.Error, asyncio.TimeoutError):
        return False


async def watch_ready(app: FastAPI, every_s: float) -> None:
    """Keep `app.state.ready` (the ops port's /readyz) current: every second until the
    gateway is first ready, then every `every_s`."""
    while True:
        app.state.ready = await ready(app)
        await asyncio.sleep(every_s if app.state.ready else min(every_s, 1.0))


def sse_headers(session_id: str, session_token: str) -> dict[str, str]:
    return {"X-Session-Id": session_id, "X-Session-Token": session_token}


def _for_visitor(payload: dict, session_token: str) -> dict:
    """`complete` carries the conversation's token and only the metadata the widget shows."""
    if payload.get("type") != "complete":
        return payload
    return {**payload, "metadata": visitor_view.public_metadata(payload.get("metadata")),
            "session_token": session_token}


def create_app(settings: GatewaySettings) -> FastAPI:
    """The API over `settings` (read once at start: `GatewaySettings.from_env` in main.py)."""
    tokens = SessionTokens.configured(settings.session_token_secret, settings.session_token_key_id,
                                      settings.session_token_previous)
    check_admin_token(settings.admin_token)  # here, not at the first request: a bad token stops the start

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.bus = await connect(settings.bus, name="gateway")
        app.state.store = CachedStore(app.state.bus)
        await app.state.store.follow()  # shared/store/feed.py: turn-start loads read what it has not folded
        app.state.redis = redis_client.connect(settings.redis_url)
        app.state.limiter = RateLimiter(app.state.redis, settings.rate_per_ip_per_min, settings.rate_per_site_per_min)
        app.state.guard = SessionGuard(app.state.bus, ttl_s=settings.turn_deadline_s + 10)
        app.state.sites = SiteConfigs(app.state.bus, settings.site_config_ttl_s)
        app.state.operators = OperatorAuth(app.state.sites, settings.admin_token)
        app.state.ready = False  # what the ops port's /readyz answers, kept by `watch_ready`
        ops = await start_ops(lambda: app.state.ready, settings.ops_port, settings.ops_host)
        watcher = asyncio.create_task(watch_ready(app, settings.ops_check_s), name="ops-watch")
        gc.freeze()  # as in shared/service.py: start-up objects out of the GC's way
        try:
            yield
        finally:
            watcher.cancel()
            if ops is not None:
                await ops.stop()
            await app.state.store.close()
            await app.state.bus.close()
            await app.state.redis.aclose()

    app = FastAPI(title="Concierge gateway", version="0.2.0", lifespan=lifespan,
                  description="Visitor endpoints (chat over SSE, the visitor's own conversation) and "
                              "operator endpoints (bearer token). See docs/security.md.")
    tracer = telemetry.tracer("concierge.gateway")

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        detail = [{"field": ".".join(str(p) for p in e.get("loc", ())[1:]) or None, "message": e.get("msg", "")}
                  for e in exc.errors()]
        return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=422)

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, exc: Unauthorized):
        return JSONResponse({"error": "unauthorized", "detail": exc.detail}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(NotReady)
    async def not_ready(_: Request, exc: NotReady):
        return JSONResponse({"error": "unavailable", "detail": str(exc)}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(nats.errors.Error)
    @app.exception_handler(asyncio.TimeoutError)
    async def bus_unavailable(_: Request, exc: Exception):
        # The bus is down or slow: the client may retry; this is not its mistake, nor a bug.
        log.error("bus unavailable", extra={"error": repr(exc)})
        return JSONResponse({"error": "unavailable", "detail": "the event bus is not reachable; retry shortly"},
                            status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    origins_cache: list = [0.0, set()]  # (when, origins): preflights must not walk every site each time

    async def known_origins() -> set[str]:
        sites: SiteConfigs = app.state.sites
        if time.monotonic() - origins_cache[0] < sites.ttl_s:
            return origins_cache[1]
        origins: set[str] = set()
        for site in await sites.configured():
            config = await sites.find(site)
            origins.update(config.allowed_origins if config else ())
        origins_cache[:] = [time.monotonic(), origins]
        return origins

    app.add_middleware(SiteCORS, known_origins=known_origins, path_prefixes=VISITOR_PATHS,
                       operator_paths=OPERATOR_UNDER_VISITOR_PATHS)

    async def configured_site(request: Request, site: str) -> SiteConfig:
        config = await request.app.state.sites.find(site)
        if config is None:
            if not await request.app.state.sites.loaded():
                raise NotReady("the deployment is starting: its sites are not loaded yet; retry shortly")
            raise RequestError("site", f"site {site!r} is not configured on this deployment", status=404)
        if not origin_allowed(request.headers.get("origin"), request.headers.get("host"), config):
            raise RequestError(None, f"the origin {request.headers.get('origin')} may not use site {site!r}; "
                                     "add it to the site's allowed_origins", status=403)
        return config

    def require_token(site: str, session_id: str, token: str | None) -> None:
        if not tokens.verify(site, session_id, token):
            raise RequestError("session_token", "this conversation needs its session token (X-Session-Token, "
                                                "or session_token in the body): the one its last answer carried",
                               status=403)

    async def operator(request: Request, credentials=Depends(bearer)) -> Operator:
        return await request.app.state.operators.authenticate(request.headers.get("authorization"))

    admin.add_routes(app, operator)
    briefs.add_routes(app, operator)

    @app.get("/", include_in_schema=False)
    async def demo_page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/widget.js", include_in_schema=False)
    async def widget():
        return FileResponse(STATIC / "widget.js", media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=300"})

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "the bus, its streams or the site registry are not there"}})
    async def readyz(request: Request):
        if await ready(request.app):
            return {"status": "ready"}
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.post("/v1/chat", openapi_extra=CHAT_OPENAPI, responses=CHAT_RESPONSES, response_class=StreamingResponse)
    async def chat(request: Request, x_session_token: TokenHeader = None):
        """One visitor turn, answered as server-sent events: `sources`, `token`..., then one
        `complete` (with the conversation's `session_token`) or one `error`."""
        started = time.perf_counter()
        body = decode_chat(await read_body(request, settings.max_body_bytes))
        bus: Bus = request.app.state.bus
        store: CachedStore = request.app.state.store
        guard: SessionGuard = request.app.state.guard
        site = body.site
        ip = client_ip(request, settings.trusted_proxy_hops)
        digest = settings.privacy.ip_hash(ip) if ip else None
        if (wait := await request.app.state.limiter.retry_after(None, digest)) is not None:
            metrics.turns.labels("none", "rate_limited").inc()
            return _rate_limited(wait)
        await configured_site(request, site)
        if body.session_id is None:
            session_id = ev.new_id()  # always the server's: a visitor cannot pick someone else's
        else:
            session_id = body.session_id
            require_token(site, session_id, x_session_token or body.session_token)
        session_token = tokens.issue(site, session_id)
        if (wait := await request.app.state.limiter.retry_after(site, None)) is not None:
            metrics.turns.labels("none", "rate_limited").inc()
            return _rate_limited(wait)
        # The log is read while the guard is taken (two round trips at once, not one after
        # the other). A read that starts before the guard is ours misses nothing the turn
        # needs: the previous turn's end is stored before its stream's `complete` reaches the
        # client, and a turn that started meanwhile fails the publish's sequence check.
        # (The cache's own state: the turn start only reads it.)
        if body.session_id is None:
            # A conversation we made up just now has no events: nothing to read.
            loading = asyncio.get_running_loop().create_future()
            loading.set_result(store.begin(site, session_id))
        else:
            loading = asyncio.ensure_future(store.state(site, session_id, write_snapshot=True))
        try:
            hold = await guard.acquire(site, session_id)
        except BaseException:
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
            raise
        if hold is None:
            state = await loading
            if (sent := sent_before(state, body.client_message_id)) is not None:
                # Held for the turn this very message started (the client's first try was cut).
                return await turn_stream(request, site, session_id, sent)
            if turn_ended(state):
                # Held, yet the log says the last turn ended: its gateway died before releasing.
                hold = await guard.take_over_ended(site, session_id, settings.guard_takeover_s)
        if hold is None:
            metrics.turns.labels("none", "busy").inc()
            return JSONResponse(
                {"error": "turn_in_progress", "detail": "this session already has a turn in progress"},
                status_code=429,
            )
        relay = None
        # The raw IP goes to Redis while the turn starts (enrichment reads it only after
        # TurnRequested, which is published once this is done): one round trip fewer in series.
        remembering = asyncio.ensure_future(_remember_ip(request, site, session_id, ip, settings.privacy.raw_ip_ttl_s))
        try:
            with tracer.start_as_current_span("chat turn") as span:
                # The one load of a turn that writes the conversation's snapshot (CachedStore.state).
                state = await loading
                if (sent := sent_before(state, body.client_message_id)) is not None:
                    # The message was sent before and that try started its turn: the client
                    # reads that turn's stream, from its start; no second turn.
                    await _cleanup(None, guard, site, session_id, hold)
                    return await turn_stream(request, site, session_id, sent)
                if not turn_ended(state):
                    # The guard is free but the log has not ended the last turn (its visitor
                    # closed the stream): a next turn never overlaps it. Past the deadline
                    # nobody will end it, so the gateway does, in the log, and goes on.
                    if not await end_overdue_turn(bus, site, session_id, state.turn, settings.turn_deadline_s):
                        await _cleanup(None, guard, site, session_id, hold)
                        metrics.turns.labels("none", "busy").inc()
                        return JSONResponse(
                            {"error": "turn_in_progress", "detail": "the previous turn of this session has not ended yet"},
                            status_code=429, headers={"Retry-After": "2"})
                    state = await store.state(site, session_id)
                turn = state.turn + 1
                span.set_attributes({"concierge.site": site, "concierge.session": session_id, "concierge.turn": turn})
                visitor = msgspec.to_builtins(body.visitor) if body.visitor is not None else None
                blocked = abuse_gate.check(state, body.message)
                if blocked is not None:
                    lang = abuse_gate.language(visitor, request.headers.get("accept-language"))
                    event = ev.TurnBlocked(
                        event_id=ev.new_id(), site=site, session_id=session_id, turn=turn, ts=ev.now(),
                        producer="gateway", reason=blocked, reply=abuse_gate.reply(blocked, lang),
                        message_chars=len(body.message), language=lang, client_message_id=body.client_message_id,
                    )
                    await bus.publish(event)
                    await _cleanup(None, guard, site, session_id, hold)
                    metrics.turns.labels("none", "blocked").inc()
                    return _blocked_response(event, session_token, settings.keepalive_s)
                relay = TurnRelay(bus, site, session_id, turn, settings.turn_deadline_s, settings.turn_stall_s)
                await relay.open()
                await remembering
                requested = ev.TurnRequested(
                    event_id=ev.new_id(), site=site, session_id=session_id, turn=turn, ts=ev.now(),
                    producer="gateway", message=body.message, visitor=visitor, ip_hash=digest,
                    client_message_id=body.client_message_id, previous=history.previous_message(state, turn),
                )
                await bus.publish(requested, expected_subject_seq=state.turn_requested_seq)
        except ConcurrencyConflict:
            await _cleanup(relay, guard, site, session_id, hold)
            metrics.turns.labels("none", "conflict").inc()
            return JSONResponse(
                {"error": "conflict", "detail": "the conversation moved on while this turn started; retry"},
                status_code=409,
            )
        except BaseException:
            await _cleanup(relay, guard, site, session_id, hold)
            raise
        finally:
            await asyncio.gather(remembering, return_exceptions=True)  # a turn that ended early: not left running

        async def stream():
            route, first_token = "none", True
            numbering = frames.Numbering(turn)
            with logs.conversation(site, session_id, turn):
                try:
                    yield numbering.encode([frames.start(session_id, turn, session_token)])
                    async for batch in relay.batches():
                        for payload in batch:
                            if first_token and payload["type"] == "token":
                                first_token = False
                                metrics.ttft_seconds.observe(time.perf_counter() - started)
                            elif payload["type"] == "complete":
                                route = str((payload.get("metadata") or {}).get("route") or "none")
                        yield numbering.encode(_for_visitor(payload, session_token) for payload in batch)
                finally:
                    # No outcome: the visitor went away before the end.
                    metrics.turns.labels(route, relay.outcome or "abandoned").inc()
                    with anyio.CancelScope(shield=True):  # a dropped client cancels the stream
                        if reason := relay.gave_up():  # the visitor was told; the log says so too
                            await end_turn(bus, requested, reason)
                        await _cleanup(relay, guard, site, session_id, hold)

        return frames.response(stream(), sse_headers(session_id, session_token), settings.keepalive_s)

    @app.get("/v1/sites/{site}/conversations/{session_id}/turns/{turn}/stream", responses=RESUME_RESPONSES,
             response_class=StreamingResponse)
    async def resume_turn(request: Request, site: SiteId, session_id: SessionId, turn: Turn,
                          x_session_token: TokenHeader = None, last_event_id: LastEventId = None):
        """A turn's stream again (X-Session-Token required): the frames after the one named by
        `Last-Event-ID` (`<turn>:<n>`; without it, from `start`), then live until `complete` or
        `error`. A finished turn replays from the log."""
        await configured_site(request, site)
        require_token(site, session_id, x_session_token)
        return await turn_stream(request, site, session_id, turn, frames.last_event_id(last_event_id, turn))

    async def turn_stream(request: Request, site: str, session_id: str, turn: int, after: int = -1) -> Response:
        """Turn `turn`'s frames after frame `after` (-1: from `start`), live until it ends; a
        finished turn replays from the log. The caller checked the site and the token."""
        bus: Bus = request.app.state.bus
        state = await request.app.state.store.state(site, session_id)
        record = state.turns.get(turn)
        if record is None:
            return _not_found(site, session_id, f" (turn {turn})")
        session_token = tokens.issue(site, session_id)
        headers = sse_headers(session_id, session_token)
        if record.status == "blocked":
            blocked = [r.event for r in await bus.read(subjects.conv(site, session_id, "turn_blocked"))
                       if r.event.turn == turn]
            return _blocked_response(blocked[0], session_token, settings.keepalive_s, after)
        relay = TurnRelay(bus, site, session_id, turn, settings.turn_deadline_s, settings.turn_stall_s)
        await relay.open()
        try:
            whole = await relay.catch_up()
            if not whole:
                state = await request.app.state.store.state(site, session_id)
                record = state.turns[turn]
        except BaseException:
            await relay.close()
            raise
        numbering = frames.Numbering(turn, after)
        if not whole and record.status == "completed":
            # Its tokens are gone: the whole answer from the log, replacing what the client has.
            await relay.close()
            answer = next((m.content for m in state.messages if m.role == "assistant" and m.turn == turn), "")
            payloads = from_log(session_id, turn, answer, record.metadata)
            if after > 0:
                numbering, payloads = frames.Numbering(turn, after, first=after + 1), [restart(), *payloads]
            else:
                payloads.insert(0, frames.start(session_id, turn, session_token))
            body = numbering.encode(_for_visitor(p, session_token) for p in payloads)

            async def replay():
                yield body

            return frames.response(replay(), headers, settings.keepalive_s)

        async def stream():
            with logs.conversation(site, session_id, turn):
                try:
                    if first := numbering.encode([frames.start(session_id, turn, session_token)]):
                        yield first
                    async for batch in relay.batches():
                        if chunk := numbering.encode(_for_visitor(payload, session_token) for payload in batch):
                            yield chunk
                finally:
                    with anyio.CancelScope(shield=True):
                        # A resumed turn may have lost its first relay with its gateway: this
                        # one ends it in the log as that one would have.
                        if (reason := relay.gave_up()) and relay.requested is not None:
                            await end_turn(bus, relay.requested, reason)
                        await relay.close()

        return frames.response(stream(), headers, settings.keepalive_s)

    @app.get("/v1/sites/{site}/conversations/{session_id}", responses=VISITOR_READ_RESPONSES)
    async def visitor_conversation(request: Request, site: SiteId, session_id: SessionId,
                                   x_session_token: TokenHeader = None):
        """The visitor's own conversation, as the widget shows it (X-Session-Token required)."""
        await configured_site(request, site)
        require_token(site, session_id, x_session_token)
        state = await request.app.state.store.state(site, session_id)
        if state.event_count == 0:
            return _not_found(site, session_id)
        # Private to the token's holder: no shared cache may keep it under the URL alone.
        return Response(msgspec.json.encode(visitor_view.conversation(state)), media_type="application/json",
                        headers={"Cache-Control": "no-store, private", "Vary": "X-Session-Token, Origin"})

    @app.get("/v1/conversations/{site}/{session_id}/events", responses=OPERATOR_RESPONSES)
    async def conversation_events(request: Request, site: SiteId, session_id: SessionId,
                                  who: Operator = Depends(operator)):
        """A conversation's whole event log (operators: ADMIN_TOKEN or the site's API key)."""
        if not who.sees(site):
            return _not_found(site, session_id)
        records = await request.app.state.bus.read(subjects.conversation(site, session_id))
        if not records:
            return _not_found(site, session_id)
        payload = [
            {"seq": r.seq, "subject": r.subject, "type": ev.event_type(r.event), "event": ev.to_builtins(r.event)}
            for r in records
        ]
        return Response(msgspec.json.encode({"site": site, "session_id": session_id, "events": payload}),
                        media_type="application/json")

    @app.get("/v1/conversations/{site}/{session_id}/state", responses=OPERATOR_RESPONSES)
    async def conversation_state(request: Request, site: SiteId, session_id: SessionId,
                                 who: Operator = Depends(operator),
                                 at: Annotated[int | None, Query(ge=1, description="the state after this event")] = None):
        """A conversation's folded state (operators: ADMIN_TOKEN or the site's API key); with
        `at`, the state folded from its events up to that stream sequence."""
        if not who.sees(site):
            return _not_found(site, session_id)
        if at is not None:
            records = await request.app.state.bus.read(subjects.conversation(site, session_id))
            state = fold(r for r in records if r.seq <= at)
        else:
            state = await request.app.state.store.state(site, session_id)
        if state.event_count == 0:
            return _not_found(site, session_id)
        return Response(msgspec.json.encode(state), media_type="application/json")

    return app


def client_ip(request: Request, hops: int) -> str | None:
    """The visitor's address. Behind `hops` proxies (TRUSTED_PROXY_HOPS; an ingress: 1), the
    address the outermost of them saw: counted from the right of X-Forwarded-For, since the
    client writes whatever it likes on the left. Not a valid IP: the connection's peer."""
    if hops > 0:
        forwarded = [p.strip() for p in request.headers.get("x-forwarded-for", "").split(",") if p.strip()]
        if len(forwarded) >= hops:
            try:
                return str(ipaddress.ip_address(forwarded[-hops]))
            except ValueError:
                log.warning("X-Forwarded-For hop is not an IP address; using the peer")
    return request.client.host if request.client else None


async def _remember_ip(request: Request, site: str, session_id: str, ip: str | None, ttl_s: float) -> None:
    """Keep the raw IP in Redis (`ttl_s`, short) for enrichment; events carry only its hash.
    Redis trouble degrades enrichment and never blocks the turn. No IP: nothing to keep."""
    if not ip:
        return
    try:
        await request.app.state.redis.set(privacy.raw_ip_key(site, session_id), ip, ex=int(ttl_s))
    except Exception as exc:
        log.warning("raw ip not stored; enrichment will skip IP sources", extra={"error": repr(exc)})


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


def _rate_limited(wait: int) -> JSONResponse:
    return JSONResponse({"error": "rate_limited", "detail": f"too many requests; retry in {wait} s"},
                        status_code=429, headers={"Retry-After": str(wait)})


def _blocked_response(event: ev.TurnBlocked, session_token: str, keepalive_s: float,
                      after: int = -1) -> EventSourceResponse:
    """A blocked turn streams like any other: `start`, the reply, then `complete` saying why."""
    payloads = [
        frames.start(event.session_id, event.turn, session_token),
        {"type": "token", "content": event.reply},
        {"type": "complete", "session_id": event.session_id, "turn": event.turn,
         "metadata": {"blocked": event.reason, "route": None}, "session_token": session_token},
    ]
    body = frames.Numbering(event.turn, after).encode(payloads)

    async def stream():
        yield body

    return frames.response(stream(), sse_headers(event.session_id, session_token), keepalive_s)


def _not_found(site: str, session_id: str, what: str = "") -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": f"no conversation {site}/{session_id}{what}"},
                        status_code=404)


async def _cleanup(relay: TurnRelay | None, guard: SessionGuard, site: str, session_id: str, hold: int) -> None:
    if relay is not None:
        await relay.close()
    try:
        await guard.release(site, session_id, hold)
    except Exception:
        # The TTL frees it anyway; say so rather than fail the response.
        log.exception("session guard release failed; it will expire by TTL")
