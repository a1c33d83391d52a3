"""The operator console's sign-in (console_sessions.py): `POST /v1/admin/session` takes a
key once and sets the session cookie, `GET` says who is signed in (and, for the deployment's
operator, which sites there are), `DELETE` signs out. The sign-in is rate limited per
address (RATE_LIMIT_PER_IP_PER_MIN, counted apart): a key is too long to guess, but a
guesser still gets nowhere fast."""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request, Response

from services.gateway.access import caller, client_ip
from services.gateway.console_sessions import COOKIE, PATH
from services.gateway.errors import RateLimited
from services.gateway.openapi import CONSOLE_RESPONSES, SIGN_IN_OPENAPI
from services.gateway.operators import Operator
from services.gateway.schemas import SignedIn, decode_sign_in, read_body

router = APIRouter(tags=["console"])
MAX_SIGN_IN_BYTES = 2048
MAX_LISTED_SITES = 5000


async def signed_in(request: Request, who: Operator, expires_in_s: int | None = None) -> SignedIn:
    if who.site is None:
        sites = sorted(await request.app.state.sites.every())[:MAX_LISTED_SITES]
        return SignedIn(kind="admin", site=None, name="Administrator", sites=sites, expires_in_s=expires_in_s)
    if who.name:
        return SignedIn(kind="operator", site=who.site, name=who.name, expires_in_s=expires_in_s)
    return SignedIn(kind="site_key", site=who.site, name=f"{who.site} key", expires_in_s=expires_in_s)


def _json(body, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


@router.post("/v1/admin/session", openapi_extra=SIGN_IN_OPENAPI, responses=CONSOLE_RESPONSES)
async def sign_in(request: Request) -> Response:
    """Sign the console in with a key (ADMIN_TOKEN, the site's API key or a named operator's
    key): the answer sets the session cookie (HttpOnly, SameSite=Strict) and says who."""
    settings = request.app.state.settings
    ip = client_ip(request, settings.trusted_proxy_hops)
    wait = await request.app.state.sign_in_limiter.retry_after(None, settings.privacy.ip_hash(ip) if ip else None)
    if wait is not None:
        raise RateLimited(wait)
    key = decode_sign_in(await read_body(request, MAX_SIGN_IN_BYTES)).key.strip()
    auth = request.app.state.operators
    who = await auth.of_key(key)
    sessions = request.app.state.console
    response = _json(await signed_in(request, who, sessions.ttl_s))
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"
    response.set_cookie(COOKIE, sessions.issue(auth.claims(who)), max_age=sessions.ttl_s, path=PATH,
                        httponly=True, samesite="strict", secure=secure)
    return response


@router.get("/v1/admin/session", responses=CONSOLE_RESPONSES)
async def who_signed_in(request: Request, who: Annotated[Operator, Depends(caller)]) -> Response:
    """Who the console (its cookie, with `X-Concierge-Console: 1`) or a bearer token is."""
    return _json(await signed_in(request, who))


@router.delete("/v1/admin/session", status_code=204)
async def sign_out() -> Response:
    """Sign the console out: the cookie cleared."""
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")
    return response
