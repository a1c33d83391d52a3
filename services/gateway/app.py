"""The gateway's HTTP API, wired: what the routes use (on `app.state`, opened and closed with
the app), the answers to errors (errors.py), CORS (cors.py), and the routes (routes/).

Two kinds of caller (docs/security.md, access.py): visitors, under `/v1/chat` and
`/v1/sites/{site}/…`, who own a conversation by its session token (sessions.py) and see
only what the widget shows (visitor_view.py), from the origins their site allows; and
operators, under `/v1/admin/sites/{site}/…`, with a bearer token (operators.py).
"""

from __future__ import annotations

import asyncio
import gc
from contextlib import asynccontextmanager

from fastapi import FastAPI

from shared import metrics, redis_client
from shared.accounts import MAX_IMPORT_BYTES, USER_AGENT
from shared.bus import connect
from shared.config import ConsumerConfig
from shared.consumer import ConsumerRunner
from shared.service import start_ops
from shared.session_guard import SessionGuard
from shared.site_config import SiteConfigs
from shared.store import CachedStore
from shared.web import WebClient
from services.gateway import errors, eval_runner, eval_trigger
from services.gateway.console_sessions import ConsoleSessions
from services.gateway.cors import KnownOrigins, SiteCORS
from services.gateway.handoffs import Claims
from services.gateway.install_check import CHECKS_PER_MIN as INSTALL_CHECKS_PER_MIN
from services.gateway.openapi import TAGS, VISITOR_PREFIXES
from services.gateway.operators import OperatorAuth, check_admin_token
from services.gateway.rate_limit import RateLimiter
from services.gateway.routes import ROUTERS
from services.gateway.routes.health import watch_ready
from services.gateway.sessions import SessionTokens
from services.gateway.settings import GatewaySettings


def create_app(settings: GatewaySettings) -> FastAPI:
    """The API over `settings` (read once at start: `GatewaySettings.from_env` in main.py)."""
    tokens = SessionTokens.configured(settings.session_token_secret, settings.session_token_key_id,
                                      settings.session_token_previous)
    check_admin_token(settings.admin_token)  # here, not at the first request: a bad token stops the start
    app = FastAPI(title="Concierge gateway", version="0.2.0", lifespan=lifespan, openapi_tags=TAGS,
                  exception_handlers=errors.HANDLERS,
                  description="Visitor endpoints under /v1/chat and /v1/sites/{site}/ (chat over SSE, the "
                              "visitor's own conversation) and operator endpoints under /v1/admin/sites/{site}/ "
                              "(bearer token). See docs/security.md.")
    app.state.settings = settings
    app.state.tokens = tokens
    app.state.console = ConsoleSessions(settings.session_token_secret, list(settings.session_token_previous.values()),
                                        settings.console_session_s)
    app.add_middleware(SiteCORS, known_origins=KnownOrigins(lambda: app.state.sites), path_prefixes=VISITOR_PREFIXES)
    for router in ROUTERS:
        app.include_router(router)
    return app


@asynccontextmanager
async def lifespan(app: FastAPI):
    """What the routes find on `app.state` while the app serves (besides `settings` and
    `tokens`): the bus, the conversation store following the log (shared/store: turn-start
    loads read what its feed has not folded), Redis and the rate limiters on it (chat turns,
    and apart, votes: per address only), the handoffs' claims, the session guard, the site
    registry, the operators' credentials, the account pull connectors' web client (`web`,
    shared/web.py's address guard), and `ready` (the ops port's /readyz)."""
    settings: GatewaySettings = app.state.settings
    app.state.bus = await connect(settings.bus, name="gateway")
    app.state.store = CachedStore(app.state.bus)
    await app.state.store.follow()
    app.state.redis = redis_client.connect(settings.redis_url)
    app.state.limiter = RateLimiter(app.state.redis, settings.rate_per_ip_per_min, settings.rate_per_site_per_min)
    app.state.vote_limiter = RateLimiter(app.state.redis, settings.rate_per_ip_per_min, 0, name="rl-feedback")
    app.state.sign_in_limiter = RateLimiter(app.state.redis, settings.rate_per_ip_per_min, 0, name="rl-sign-in")
    # Installation checks fetch a page an operator names: a few a minute per site, so a
    # site's key cannot make the deployment a fetcher of other people's pages.
    app.state.install_check_limiter = RateLimiter(app.state.redis, 0, INSTALL_CHECKS_PER_MIN, name="rl-install")
    app.state.handoff_claims = Claims(app.state.bus)
    app.state.guard = SessionGuard(app.state.bus, ttl_s=settings.turn_deadline_s + 10)
    app.state.sites = SiteConfigs(app.state.bus, settings.site_config_ttl_s)
    app.state.operators = OperatorAuth(app.state.sites, settings.admin_token)
    app.state.web = WebClient(USER_AGENT, settings.outbound, max_bytes=MAX_IMPORT_BYTES)
    app.state.ready = False  # kept by `watch_ready`
    ops = await start_ops(lambda: app.state.ready, settings.ops_port, settings.ops_host)
    watcher = asyncio.create_task(watch_ready(app, settings.ops_check_s), name="ops-watch")
    runners = []
    if settings.eval_run_concurrency > 0:  # runs of the sites' test cases (eval_runner.py, eval_trigger.py)
        for node in (eval_runner.make_node(app.state.bus, settings.turn_deadline_s, settings.eval_run_concurrency),
                     eval_trigger.make_node(app.state.bus, settings.eval_run_debounce_s)):
            runners.append(ConsumerRunner(app.state.bus, node, ConsumerConfig.from_env(node.name),
                                          configs=app.state.sites, store=app.state.store))
            await runners[-1].start()
    gc.freeze()  # as in shared/service.py: start-up objects out of the GC's way
    metrics.observe_gc()
    try:
        yield
    finally:
        watcher.cancel()
        for runner in runners:
            await runner.stop()
        if ops is not None:
            await ops.stop()
        await app.state.store.close()
        await app.state.web.close()
        await app.state.bus.close()
        await app.state.redis.aclose()
