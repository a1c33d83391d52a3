"""The operator API of lead briefs (services/gateway/routes/briefs.py), in process against real NATS
and Redis: the enricher is simulated by storing its events directly, and what the API
queues is read back from the BRIEFS work queue (no node consumes it here)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from shared import events as ev
from shared import subjects
from tests import lead_briefs
from tests.helpers import unique
from tests.servers import configure_site
from tests.test_turn_end import running_gateway

ADMIN = "briefs-api-admin-token-0123456789"
ORIGIN = "https://shop.example"  # the sites' widget page
SECRET = "operator-api-test-secret-0123456789"  # the session tokens' (tests that act as a visitor too)


def key_of(site: str) -> str:
    return f"ck_{site}_{hashlib.sha256(site.encode()).hexdigest()[:24]}"


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(nats_url, redis_url, site, monkeypatch):
    """The gateway, the site configured with its key, and another site with its own."""
    other = unique("other")
    for name in (site, other):
        await configure_site(nats_url, name, operator_key_sha256=[hashlib.sha256(key_of(name).encode()).hexdigest()],
                             allowed_origins=[ORIGIN])
    async with running_gateway(nats_url, redis_url, monkeypatch, admin_token=ADMIN,
                               session_token_secret=SECRET) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, other


async def queued(bus, site: str, session: str, event_type: str) -> ev.Envelope:
    """The newest work item on the subject, taken off the queue (the test is its consumer)."""
    msg = await bus.js.get_msg(subjects.BRIEFS_STREAM, subject=subjects.work(site, session, event_type))
    await bus.js.delete_msg(subjects.BRIEFS_STREAM, msg.seq)
    return ev.decode(msg.data)


async def waiting(bus, site: str) -> dict[str, int]:
    """The site's work items still on the queue, by subject."""
    info = await bus.js.stream_info(subjects.BRIEFS_STREAM, subjects_filter=f"briefs.{site}.>")
    return info.state.subjects or {}


async def test_the_list_and_one_lead_show_the_latest_brief(bus, site, api):
    client, _ = api
    await lead_briefs.capture(bus, site, "ada")
    await lead_briefs.capture(bus, site, "bob", email="bob@example.org")
    await lead_briefs.capture(bus, site, "cyd", email="cyd@example.net")
    await bus.publish(lead_briefs.failed(site, "ada", reason="first try failed"))
    good = lead_briefs.completed(site, "ada", priority=9, stage="ready_to_buy")
    await bus.publish(good)
    await bus.publish(lead_briefs.completed(site, "bob"))
    await bus.publish(lead_briefs.failed(site, "bob", reason="a later retry failed"))

    listed = await client.get(f"/v1/admin/sites/{site}/briefs", headers=bearer(key_of(site)))
    assert listed.status_code == 200, listed.text
    rows = {r["session_id"]: r for r in listed.json()["leads"]}
    assert set(rows) == {"ada", "bob", "cyd"}
    assert rows["ada"]["status"] == "completed" and rows["ada"]["priority"] == 9
    assert rows["ada"]["stage"] == "ready_to_buy" and rows["ada"]["verdict"] == "pass"
    assert rows["ada"]["email"] == "ada@example.com" and rows["ada"]["metadata"]["estimated_seats"] == 25
    assert rows["bob"]["status"] == "failed" and rows["bob"]["reason"] == "a later retry failed"
    assert rows["cyd"]["status"] == "none"

    shown = (await client.get(f"/v1/admin/sites/{site}/briefs/ada", headers=bearer(ADMIN))).json()
    assert shown["type"] == "brief_completed" and shown["event"]["request_id"] == good.request_id
    assert shown["event"]["brief"] == lead_briefs.BRIEF and shown["event"]["call_script"] == lead_briefs.SCRIPT
    failed = (await client.get(f"/v1/admin/sites/{site}/briefs/bob", headers=bearer(ADMIN))).json()
    assert failed["type"] == "brief_failed" and failed["event"]["reason"] == "a later retry failed"
    for session in ("cyd", "nobody"):
        assert (await client.get(f"/v1/admin/sites/{site}/briefs/{session}", headers=bearer(ADMIN))).status_code == 404


async def test_operators_only_and_each_key_its_own_site(bus, site, api):
    client, other = api
    await lead_briefs.capture(bus, site, "ada")
    await bus.publish(lead_briefs.completed(site, "ada"))
    for method, path in (("GET", f"/v1/admin/sites/{site}/briefs"), ("GET", f"/v1/admin/sites/{site}/briefs/ada"),
                         ("POST", f"/v1/admin/sites/{site}/briefs"), ("POST", f"/v1/admin/sites/{site}/triage"),
                         ("GET", f"/v1/admin/sites/{site}/triage")):
        assert (await client.request(method, path)).status_code == 401, path
        assert (await client.request(method, path, headers=bearer("ck_nope_wrongwrongwrong"))).status_code == 401
        assert (await client.request(method, path, headers=bearer(key_of(other)))).status_code == 404, path
    assert (await client.get(f"/v1/admin/sites/{site}/briefs/a.b", headers=bearer(ADMIN))).status_code in (404, 422)
    assert await waiting(bus, site) == {}  # the refused POSTs queued nothing


async def test_a_post_queues_one_work_item_per_lead(bus, site, api):
    client, _ = api
    await lead_briefs.capture(bus, site, "ada", turn=3)
    await lead_briefs.capture(bus, site, "bob", turn=1)

    everyone = await client.post(f"/v1/admin/sites/{site}/briefs", headers=bearer(key_of(site)))
    assert everyone.status_code == 202, everyone.text
    ids = {q["session_id"]: q["request_id"] for q in everyone.json()["queued"]}
    assert set(ids) == {"ada", "bob"}
    assert await waiting(bus, site) == {subjects.work(site, s, "brief_requested"): 1 for s in ("ada", "bob")}
    for session, turn in (("ada", 3), ("bob", 1)):
        item = await queued(bus, site, session, "brief_requested")
        assert isinstance(item, ev.BriefRequested)
        assert (item.request_id, item.turn, item.producer, item.reason) == (ids[session], turn, "gateway", "operator")
        assert item.event_id == ev.derived_id(item.request_id, "briefs", session)

    one = await client.post(f"/v1/admin/sites/{site}/briefs", headers=bearer(ADMIN), json={"leads": ["bob"]})
    assert one.status_code == 202 and [q["session_id"] for q in one.json()["queued"]] == ["bob"]
    assert (await queued(bus, site, "bob", "brief_requested")).request_id == one.json()["queued"][0]["request_id"]

    unknown = await client.post(f"/v1/admin/sites/{site}/briefs", headers=bearer(ADMIN), json={"leads": ["bob", "zed"]})
    assert unknown.status_code == 404 and "zed" in unknown.json()["detail"]
    bad = await client.post(f"/v1/admin/sites/{site}/briefs", headers=bearer(ADMIN), json={"leads": ["a.b"]})
    assert bad.status_code == 422
    assert await waiting(bus, site) == {}  # neither queued anything


async def test_a_triage_is_queued_and_the_latest_one_read_ranked(bus, site, api):
    client, _ = api
    assert (await client.get(f"/v1/admin/sites/{site}/triage", headers=bearer(ADMIN))).status_code == 404
    posted = await client.post(f"/v1/admin/sites/{site}/triage", headers=bearer(key_of(site)))
    assert posted.status_code == 202
    item = await queued(bus, site, ev.TRIAGE_SESSION, "triage_requested")
    assert isinstance(item, ev.TriageRequested) and item.request_id == posted.json()["request_id"]
    assert item.event_id == ev.derived_id(item.request_id, "briefs", ev.TRIAGE_SESSION) and item.turn == 0

    await bus.publish(lead_briefs.triage(site, "older", ("ada", "nurture", "old")))
    await bus.publish(lead_briefs.triage(site, item.request_id, ("cyd", "disqualify", "a student"),
                                         ("ada", "nurture", "evaluating, no budget yet"),
                                         ("bob", "call_first", "ready to buy, 40 seats")))
    latest = (await client.get(f"/v1/admin/sites/{site}/triage", headers=bearer(key_of(site)))).json()
    assert latest["request_id"] == item.request_id and latest["backend"] == "data" and latest["model_error"] == ""
    assert [(i["session_id"], i["classification"]) for i in latest["items"]] == \
        [("bob", "call_first"), ("ada", "nurture"), ("cyd", "disqualify")]
    assert latest["status"] == "completed"
    # A later request the triager gave up on: what the operator waiting for it sees.
    await bus.publish(lead_briefs.failed(site, ev.TRIAGE_SESSION, "gave-up", reason="the bus did not answer"))
    failed = (await client.get(f"/v1/admin/sites/{site}/triage", headers=bearer(key_of(site)))).json()
    assert (failed["status"], failed["request_id"], failed["reason"]) == ("failed", "gave-up", "the bus did not answer")

