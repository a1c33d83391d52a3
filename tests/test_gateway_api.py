"""The gateway's API as a whole (services/gateway/routes/): in /openapi.json one operator
prefix and one visitor API, every operation tagged; every operator path behind the one
credential check of its prefix and without CORS, the visitor paths with it (in process,
against real NATS and Redis, as tests/test_briefs_api.py runs it)."""

from __future__ import annotations

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests import test_briefs_api
from tests.test_briefs_api import ORIGIN, bearer, key_of

OPERATOR_PREFIX = "/v1/admin/sites/{site}/"
api = test_briefs_api.api  # the fixture: the gateway in process, a site and another one, each with its key


def operations(tag: str | None = None) -> list[tuple[str, str, dict]]:
    """(method, path, operation) of every operation in /openapi.json (of those tagged `tag`)."""
    spec = create_app(GatewaySettings(ops_port=0)).openapi()
    return [(method.upper(), path, operation) for path, item in spec["paths"].items()
            for method, operation in item.items() if tag is None or operation.get("tags") == [tag]]


def test_one_operator_prefix_one_visitor_api_and_every_operation_tagged():
    seen = set()
    for method, path, operation in operations():
        (tag,) = operation.get("tags") or [None]
        seen.add(tag)
        needs_a_token = {"HTTPBearer": []} in operation.get("security", [])
        assert needs_a_token == (tag == "operator"), f"{method} {path}: tagged {tag}, token: {needs_a_token}"
        if tag == "operator":  # the site itself (the prefix's own path), or under it
            assert path == OPERATOR_PREFIX.rstrip("/") or path.startswith(OPERATOR_PREFIX), \
                f"{method} {path}: operator, outside {OPERATOR_PREFIX}"
        elif tag == "console":
            assert path == "/v1/admin/session", f"{method} {path}: the console's sign-in"
        elif tag == "visitor":
            assert path == "/v1/chat" or path.startswith("/v1/sites/{site}/"), f"{method} {path}: visitor"
        else:
            assert tag == "health" and path in ("/healthz", "/readyz"), f"{method} {path}: tagged {tag}"
    assert seen == {"visitor", "operator", "console", "health"}
    assert {path.split("{site}")[0] for _, path, _ in operations("operator")} == {"/v1/admin/sites/"}


async def test_every_operator_path_needs_its_sites_token_and_gets_no_cors(site, api):
    """Each operator operation: 401 without a token, 404 with another site's key (refused
    before anything is read or queued), and no CORS headers for an origin the site allows
    its widget, on the request or its preflight."""
    client, other = api
    refused = 0
    for method, path, _ in operations("operator"):
        url = path.format(site=site, session_id="ada", op="rerun", source_id="web-000000000000", account_id="acme", request_id="r1", edit_id="e1",
                          case_id="case-000000000000", run="run-000000000000")
        assert (await client.request(method, url)).status_code == 401, url
        wrong_site = await client.request(method, url, headers={**bearer(key_of(other)), "Origin": ORIGIN})
        assert wrong_site.status_code == 404 and "access-control-allow-origin" not in wrong_site.headers, url
        preflight = await client.options(url, headers={"Origin": ORIGIN, "Access-Control-Request-Method": method,
                                                       "Access-Control-Request-Headers": "authorization"})
        assert "access-control-allow-origin" not in preflight.headers, url
        refused += 1
    assert refused >= 10
    visitor = await client.get(f"/v1/sites/{site}/conversations/nobody", headers={"Origin": ORIGIN})
    assert visitor.headers["access-control-allow-origin"] == ORIGIN  # the widget's paths keep theirs
