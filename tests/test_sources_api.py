"""Knowledge sources through the operator API (in process, real NATS and Redis, as
tests/test_briefs_api.py runs the gateway): defining a source starts its first run, field
errors are 422s naming each field, an upload is stored and bounded, a per-site key sees
only its site's sources; no sync node runs here (tests/test_sync.py runs them)."""

from __future__ import annotations

from shared import events as ev
from shared import sources, subjects
from tests import test_briefs_api
from tests.test_briefs_api import ADMIN, bearer, key_of

api = test_briefs_api.api


async def test_a_website_source_is_defined_and_its_first_run_requested(bus, site, api):
    client, other = api
    added = await client.post(f"/v1/admin/sites/{site}/sources", headers=bearer(key_of(site)),
                              json={"url": "https://www.example.com/sitemap.xml", "every": "24h",
                                    "exclude": ["/blog/*"], "max_pages": 50})
    assert added.status_code == 202, added.text
    source = added.json()["source"]
    assert added.json()["run"] == 1
    requested = await bus.last(subjects.conv(site, sources.session_of(source), "sync_requested"))
    assert isinstance(requested, ev.SyncRequested) and requested.reason == "added" and requested.actor == f"key:{site}"
    listed = (await client.get(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN))).json()["sources"]
    assert [(s["id"], s["state"], s["every_s"], s["exclude"]) for s in listed] == [(source, "queued", 86400.0, ["/blog/*"])]
    # A run still queued is the answer to another request: no second run beside it.
    again = await client.post(f"/v1/admin/sites/{site}/sources/{source}/sync", headers=bearer(ADMIN))
    assert again.status_code == 202 and again.json() == {"site": site, "source": source, "run": 1, "new": False}
    # Another site's key sees nothing of it; the conversations list does not show it.
    assert (await client.get(f"/v1/admin/sites/{other}/sources", headers=bearer(key_of(other)))).json()["sources"] == []
    assert (await client.get(f"/v1/admin/sites/{site}/sources/{source}", headers=bearer(key_of(other)))).status_code == 404
    conversations = (await client.get(f"/v1/admin/sites/{site}/conversations", headers=bearer(ADMIN))).json()
    assert conversations["total"] == 0
    shown = (await client.get(f"/v1/admin/sites/{site}/sources/{source}", headers=bearer(ADMIN))).json()["source"]
    assert shown["url"] == "https://www.example.com/sitemap.xml" and shown["pages"] == []
    removed = await client.delete(f"/v1/admin/sites/{site}/sources/{source}", headers=bearer(ADMIN))
    assert removed.status_code == 200
    assert (await client.get(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN))).json()["sources"] == []


async def test_a_wrong_definition_names_every_field_and_stores_nothing(bus, site, api):
    client, _ = api
    bad = await client.post(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN),
                            json={"url": "ftp://example.com/", "every": "5m", "exclude": ["blog"], "max_pages": 0})
    assert bad.status_code == 422
    fields = {d["field"] for d in bad.json()["detail"]}
    assert fields == {"url", "every", "exclude[0]", "max_pages"}, bad.json()
    unknown = await client.post(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN), json={"url": "https://a.example", "depth": 3})
    assert unknown.status_code == 422
    assert (await client.post(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN), content=b"{")).status_code == 422
    assert await bus.read(subjects.conv(site, "*", "source_added")) == []


async def test_an_upload_is_stored_as_a_file_source_and_bounded(bus, site, api):
    client, _ = api
    data = b"# Warranty\n\nThree years on every sensor.\n"
    up = await client.post(f"/v1/admin/sites/{site}/uploads", params={"name": "warranty.md"},
                           headers=bearer(key_of(site)), content=data)
    assert up.status_code == 202, up.text
    source = up.json()["source"]
    added = await bus.last(subjects.conv(site, sources.session_of(source), "source_added"))
    assert added.source.kind == "file" and added.source.name == "warranty.md"
    assert await sources.Staging(bus).uploaded(added.source.upload) == data
    wrong = await client.post(f"/v1/admin/sites/{site}/uploads", params={"name": "tool.exe"},
                              headers=bearer(ADMIN), content=b"MZ")
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["field"] == "name"
    big = await client.post(f"/v1/admin/sites/{site}/uploads", params={"name": "big.txt"}, headers=bearer(ADMIN),
                            content=b"x" * (sources.MAX_UPLOAD_BYTES + 1))
    assert big.status_code == 413
    assert (await client.post(f"/v1/admin/sites/{site}/uploads", params={"name": "warranty.md"})).status_code == 401
