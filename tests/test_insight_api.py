"""Insight through the operator API (in process, real NATS and Redis, as
tests/test_briefs_api.py runs the gateway): the figures and gaps `concierge insight` prints,
the conversations behind a figure, the CSV exports, curated answers, 422s for bad filters,
and another site's key sees nothing."""

from __future__ import annotations

import csv
import io
import time

from shared import insight, subjects
from tests import test_briefs_api
from tests.test_briefs_api import ADMIN, bearer, key_of
from tests.test_insight import Log, published

api = test_briefs_api.api


async def test_figures_gaps_conversations_and_exports(bus, site, api):
    client, other = api
    hour_ago = time.time() - 3600  # within the default range, the last 7 days
    answered, missing, booked = (Log(name, start=hour_ago) for name in ("answered", "missing", "booked"))
    answered.ask(1, "What does the Pro plan cost?")
    answered.reply(1, "ANSWER", cited=["pricing"], ttft_s=0.12)
    answered.vote(1, "up")
    missing.ask(1, "Do you support SAML single sign-on?")
    missing.reply(1, "ANSWER", given=["security"], ttft_s=0.3)
    missing.vote(1, "down", "no answer")
    booked.ask(1, "Book a demo")
    booked.reply(1, "BOOKING", ttft_s=None)
    booked.lead(1)
    for log in (answered, missing, booked):
        await published(bus, log, site)
    await insight.rebuild(bus, site)

    shown = await client.get(f"/v1/admin/sites/{site}/insight", headers=bearer(key_of(site)))
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert {k: body[k] for k in ("conversations", "turns", "answered", "not_found", "bookings", "leads",
                                 "feedback_up", "feedback_down")} == {
        "conversations": 3, "turns": 3, "answered": 1, "not_found": 1, "bookings": 1, "leads": 1,
        "feedback_up": 1, "feedback_down": 1}
    assert body["outcomes"] == {"resolved": 1, "unresolved": 1, "converted": 1, "abandoned": 0}
    assert [g["examples"] for g in body["gaps"]] == [["Do you support SAML single sign-on?"]]
    assert body["ttft_ms_p50"] == 210.0 and len(body["days"]) >= 1

    behind = await client.get(f"/v1/admin/sites/{site}/insight/conversations", params={"turn_outcome": "not_found"},
                              headers=bearer(ADMIN))
    assert [c["session_id"] for c in behind.json()["conversations"]] == ["missing"]
    converted = await client.get(f"/v1/admin/sites/{site}/insight/conversations", params={"outcome": "converted"},
                                 headers=bearer(ADMIN))
    assert [c["session_id"] for c in converted.json()["conversations"]] == ["booked"]

    exported = await client.get(f"/v1/admin/sites/{site}/insight/conversations.csv", headers=bearer(ADMIN))
    assert exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert sorted((r["session_id"], r["outcome"]) for r in rows) == [
        ("answered", "resolved"), ("booked", "converted"), ("missing", "unresolved")]
    leads = list(csv.DictReader(io.StringIO((await client.get(f"/v1/admin/sites/{site}/insight/leads.csv",
                                                               headers=bearer(ADMIN))).text)))
    assert [(r["session_id"], r["email"], r["outcome"]) for r in leads] == [("booked", "ada@example.com", "converted")]

    # Filters: a language, a route; a bad duration or route is a 422 naming it.
    assert (await client.get(f"/v1/admin/sites/{site}/insight", params={"language": "fr"},
                             headers=bearer(ADMIN))).json()["conversations"] == 0
    assert (await client.get(f"/v1/admin/sites/{site}/insight", params={"route": "BOOKING"},
                             headers=bearer(ADMIN))).json()["turns"] == 1
    bad = await client.get(f"/v1/admin/sites/{site}/insight", params={"since": "week"}, headers=bearer(ADMIN))
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "since"
    assert (await client.get(f"/v1/admin/sites/{site}/insight", params={"route": "NOPE"},
                             headers=bearer(ADMIN))).status_code == 422
    # Another site's key: as if the site had nothing; its own site has nothing of these.
    assert (await client.get(f"/v1/admin/sites/{site}/insight", headers=bearer(key_of(other)))).status_code == 404
    assert (await client.get(f"/v1/admin/sites/{other}/insight",
                             headers=bearer(key_of(other)))).json()["conversations"] == 0
    assert (await client.get(f"/v1/admin/sites/{site}/insight")).status_code == 401


async def test_a_curated_answer_is_a_source_of_its_own_synced_now(bus, site, api):
    client, _ = api
    given = {"question": "Do you support SAML single sign-on?", "answer": "Yes: SAML 2.0 with Okta and Azure AD."}
    added = await client.post(f"/v1/admin/sites/{site}/insight/answers", headers=bearer(key_of(site)), json=given)
    assert added.status_code == 202, added.text
    source = added.json()["source"]
    assert source.startswith("answer-") and added.json()["cited_as"] == "Do you support SAML single sign-on?"
    listed = (await client.get(f"/v1/admin/sites/{site}/sources", headers=bearer(ADMIN))).json()["sources"]
    assert [s["id"] for s in listed] == [source]
    assert (await client.get(f"/v1/admin/sites/{site}/sources/{source}", headers=bearer(ADMIN))).status_code == 200
    requested = await bus.read(subjects.conv(site, "*", "sync_requested"))
    assert [r.event.reason for r in requested] == ["curated answer"]
    bad = await client.post(f"/v1/admin/sites/{site}/insight/answers", headers=bearer(ADMIN),
                            json={"question": "?", "answer": ""})
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} == {"question", "answer"}
    unknown = await client.post(f"/v1/admin/sites/{site}/insight/answers", headers=bearer(ADMIN),
                                json={**given, "extra": 1})
    assert unknown.status_code == 422
