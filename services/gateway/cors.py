"""CORS for the visitor endpoints, from each site's `allowed_origins`.

Starlette's CORSMiddleware takes one fixed list; here the list is the sites' own, read from
their configs as they change (`KnownOrigins`). A preflight carries no body, so it cannot say
which site it is for: it is allowed when any configured site lists the origin (or it is the
gateway's own origin, the demo page), and the handler then checks the request's origin
against the site it names (`origin_allowed`, 403 otherwise). Which paths get CORS is decided
by prefix alone: the visitor API's (openapi.VISITOR_PREFIXES). Everything else, the operator
API under `/v1/admin/` included, gets no CORS headers at all, so no other page can read it
from a browser.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response

from shared.site_config import SiteConfig, SiteConfigs

log = logging.getLogger(__name__)

ALLOW_METHODS = "GET, POST"
ALLOW_HEADERS = "content-type, x-session-token, last-event-id"
EXPOSE_HEADERS = "X-Session-Id, X-Session-Token, Retry-After"
PREFLIGHT_MAX_AGE_S = "600"


def same_origin(origin: str, host: str | None) -> bool:
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


def origin_allowed(origin: str | None, host: str | None, config: SiteConfig) -> bool:
    """No Origin (not a browser's cross-origin call), the gateway's own, or one the site lists."""
    if not origin or same_origin(origin, host):
        return True
    return "*" in config.allowed_origins or origin in config.allowed_origins


class KnownOrigins:
    """The origins any configured site allows, read again once the registry's TTL has
    passed (every site's config in one read of the bucket: `SiteConfigs.every`):
    preflights must not walk every site each time."""

    def __init__(self, sites: Callable[[], SiteConfigs]):
        """`sites`: the registry, which the app opens with its lifespan."""
        self.sites = sites
        self.read_at, self.origins = float("-inf"), set()

    async def __call__(self) -> set[str]:
        sites = self.sites()
        if time.monotonic() - self.read_at < sites.ttl_s:
            return self.origins
        origins: set[str] = set()
        for config in (await sites.every()).values():
            origins.update(config.allowed_origins)
        self.read_at, self.origins = time.monotonic(), origins
        return origins


class SiteCORS:
    """ASGI middleware: answers preflights and adds CORS headers on the paths under
    `path_prefixes` (the visitor API's), and only there."""

    def __init__(self, app, known_origins: Callable[[], Awaitable[set[str]]], path_prefixes: tuple[str, ...]):
        self.app = app
        self.known_origins = known_origins
        self.path_prefixes = path_prefixes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.path_prefixes):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if not origin:
            return await self.app(scope, receive, send)
        allowed = same_origin(origin, headers.get("host"))
        if not allowed:
            try:
                known = await self.known_origins()
            except Exception:  # noqa: BLE001 - the sites' configs are on the bus: it is down
                log.exception("site origins unavailable")
                response = JSONResponse({"error": "unavailable", "detail": "the event bus is not reachable; retry shortly"},
                                        status_code=503, headers={"Retry-After": "2"})
                return await response(scope, receive, send)
            allowed = "*" in known or origin in known
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            if not allowed:
                response = JSONResponse({"error": "forbidden", "detail": [
                    {"field": None, "message": f"no site on this deployment allows the origin {origin}"}]},
                    status_code=403, headers={"Vary": "Origin"})
            else:
                response = Response(status_code=204, headers={
                    **_cors_headers(origin), "Access-Control-Allow-Methods": ALLOW_METHODS,
                    "Access-Control-Allow-Headers": ALLOW_HEADERS, "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S})
            return await response(scope, receive, send)
        if not allowed:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (k.lower().encode(), v.encode()) for k, v in _cors_headers(origin).items()]
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _cors_headers(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": EXPOSE_HEADERS, "Vary": "Origin"}
