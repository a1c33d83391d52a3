"""Who may call what (docs/security.md), as the routes' dependencies.

- a visitor: a configured site (404; 503 while the registry is not loaded yet), from an
  origin the site allows (403), and for a conversation the visitor names, its session token
  (sessions.py; 403): `configured_site`, `require_token`, and both for a path that names the
  conversation, `own_conversation`;
- an operator: a bearer token (operators.py; 401), or the console's session cookie
  (console_sessions.py), that sees the site the path names (404 otherwise, as if the site
  had nothing): `operator_of_site`, the operator API's one check;

and the visitor's address, which the rate limits count per (`client_ip`).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from services.gateway.console_sessions import COOKIE, HEADER
from services.gateway.cors import origin_allowed
from services.gateway.errors import NotFound, NotReady
from services.gateway.openapi import SessionId, SiteId, TokenHeader, bearer
from services.gateway.operators import Operator, Unauthorized
from services.gateway.schemas import RequestError
from shared.site_config import SiteConfig

log = logging.getLogger(__name__)


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


def require_token(request: Request, site: str, session_id: str, token: str | None) -> None:
    if not request.app.state.tokens.verify(site, session_id, token):
        raise RequestError("session_token", "this conversation needs its session token (X-Session-Token, "
                                            "or session_token in the body): the one its last answer carried",
                           status=403)


async def own_conversation(request: Request, site: SiteId, session_id: SessionId,
                           x_session_token: TokenHeader = None) -> tuple[str, str]:
    """The (site, session id) the path names, for the holder of its session token."""
    await configured_site(request, site)
    require_token(request, site, session_id, x_session_token)
    return site, session_id


async def operator(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Operator:
    """The caller as an operator (401 without a valid token); `bearer` documents the scheme."""
    return await caller(request)


async def caller(request: Request) -> Operator:
    """The operator a bearer token is, or without one, the console's session
    (console_sessions.py: its cookie, with the console's header); 401 otherwise."""
    auth = request.app.state.operators
    cookie = request.cookies.get(COOKIE)
    if request.headers.get("authorization") is not None or cookie is None:
        return await auth.authenticate(request.headers.get("authorization"))
    if request.headers.get(HEADER) != "1":
        raise Unauthorized(f"a console session needs the {HEADER}: 1 header")
    claims = request.app.state.console.read(cookie)
    if claims is None:
        raise Unauthorized("the console session has expired or is not one of this deployment's: sign in again")
    return await auth.from_session(claims)


async def operator_of_site(site: SiteId, who: Annotated[Operator, Depends(operator)]) -> Operator:
    """An operator who sees the path's site: the token first (401), then the site (404)."""
    if not who.sees(site):
        raise NotFound(f"no site {site}")
    return who


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
