"""The operator console's sign-in (services/gateway/routes/console.py,
console_sessions.py), in process against real NATS and Redis: a key once, then an HttpOnly,
SameSite=Strict cookie the operator API takes with the console's header; a site key's
session sees its site only; a revoked key or a changed cookie is refused; sign-out."""

from __future__ import annotations

import hashlib

import httpx

from services.gateway.console_sessions import COOKIE, HEADER
from tests import test_briefs_api
from tests.servers import configure_site
from tests.helpers import wait_for
from tests.test_briefs_api import ADMIN, key_of

api = test_briefs_api.api  # the gateway in process, a site and another one, each with its key
CONSOLE = {HEADER: "1"}


def cookie_of(answer: httpx.Response) -> str:
    (line,) = answer.headers.get_list("set-cookie")
    return line


async def sign_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/v1/admin/session", json={"key": key})


async def test_the_administrator_signs_in_once_and_the_cookie_opens_every_site(site, api):
    client, other = api
    answer = await sign_in(client, ADMIN)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["kind"] == "admin" and body["name"] == "Administrator" and {site, other} <= set(body["sites"])
    line = cookie_of(answer).lower()
    assert f"{COOKIE}=" in line and "httponly" in line and "samesite=strict" in line and "path=/v1/admin" in line
    assert "secure" not in line.replace("samesite", "")  # plain HTTP here; HTTPS behind the ingress sets it
    assert ADMIN not in cookie_of(answer)  # the cookie names who, never the key
    for name in (site, other):
        assert (await client.get(f"/v1/admin/sites/{name}", headers=CONSOLE)).status_code == 200
    who = await client.get("/v1/admin/session", headers=CONSOLE)
    assert who.status_code == 200 and who.json()["kind"] == "admin"
    # Without the console's header the cookie opens nothing (a cross-site form cannot send it).
    bare = await client.get(f"/v1/admin/sites/{site}")
    assert bare.status_code == 401 and HEADER in bare.json()["detail"]
    signed_out = await client.delete("/v1/admin/session")
    assert signed_out.status_code == 204 and 'max-age=0' in cookie_of(signed_out).lower()
    assert (await client.get(f"/v1/admin/sites/{site}", headers=CONSOLE)).status_code == 401


async def test_a_site_keys_session_sees_its_site_only_and_ends_when_the_key_is_revoked(nats_url, site, api):
    client, other = api
    answer = await sign_in(client, key_of(site))
    assert answer.status_code == 200 and answer.json() == {
        "kind": "site_key", "site": site, "name": f"{site} key", "sites": None, "expires_in_s": 8 * 3600}
    assert (await client.get(f"/v1/admin/sites/{site}/conversations", headers=CONSOLE)).status_code == 200
    assert (await client.get(f"/v1/admin/sites/{other}/conversations", headers=CONSOLE)).status_code == 404
    # The key revoked (another in its place): the session it opened is refused from then on.
    fresh = f"ck_{site}_{'f' * 24}"
    await configure_site(nats_url, site, operator_key_sha256=[hashlib.sha256(fresh.encode()).hexdigest()],
                         allowed_origins=[test_briefs_api.ORIGIN])

    async def refused():  # once the gateway's config cache (SITE_CONFIG_TTL_S) has the change
        answer = await client.get(f"/v1/admin/sites/{site}/conversations", headers=CONSOLE)
        return answer if answer.status_code == 401 else None

    answer = await wait_for(refused, 10, "the revoked key's session refused")
    assert "sign in again" in answer.json()["detail"]


async def test_wrong_keys_changed_cookies_and_bad_bodies_are_refused(site, api):
    client, other = api
    for key in ("guess", f"ck_{site}_{'0' * 24}", key_of(site) + "x"):
        assert (await sign_in(client, key)).status_code == 401
    assert not client.cookies
    assert (await client.post("/v1/admin/session", json={})).status_code == 422
    assert (await client.post("/v1/admin/session", json={"key": ""})).status_code == 422
    assert (await client.post("/v1/admin/session", content=b"{not json")).status_code in (400, 422)
    assert (await client.post("/v1/admin/session", json={"key": "k" * 5000})).status_code == 413
    signed = await sign_in(client, key_of(other))
    assert signed.status_code == 200
    value = client.cookies[COOKIE]
    # A session for `other`'s key edited to name `site`: its signature no longer holds.
    payload, _, rest = value.partition(".")
    forged = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + rest
    client.cookies.set(COOKIE, forged, path="/v1/admin")
    forged_answer = await client.get(f"/v1/admin/sites/{other}", headers=CONSOLE)
    assert forged_answer.status_code == 401 and "sign in again" in forged_answer.json()["detail"]
    # A bearer token still works beside (or instead of) a cookie.
    assert (await client.get(f"/v1/admin/sites/{site}", headers={"Authorization": f"Bearer {ADMIN}"})).status_code == 200
