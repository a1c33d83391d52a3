"""Issue 44's "done when", over HTTP against the whole system as processes (tests/e2e.py, no
model: `make run`'s defaults): an account manager imports the sample portfolio, finds
opportunities (ranked, with reasons), has reports written for three pre-selected accounts
(every section, the metadata, a sales script), edits one section by hand and then asks for
a change elsewhere (the hand edit stays), and pastes an account (JSON, then free text) to
get its report."""

from __future__ import annotations

import datetime
import uuid

from shared import events as ev
from tests import e2e
from tests.e2e import operator_url, ops
from tests.helpers import wait_for
from tests.servers import ROOT, configure_site

system, http = e2e.system, e2e.http  # the fixtures (tests/e2e.py)


async def _json(http, url, headers, ok=lambda body: True):
    answer = await http.get(url, headers=headers)
    return answer.json() if answer.status_code == 200 and ok(answer.json()) else None


async def test_an_account_manager_finds_opportunities_gets_reports_edits_them_and_pastes_an_account(system, http):
    site = f"acct{uuid.uuid4().hex[:6]}"
    await configure_site(system.nats_url, site, name="Tidewise")
    auth = ops(system)
    url = lambda path: operator_url(system, site, path)  # noqa: E731
    imported = await http.post(url("accounts/import"), headers={**auth, "Content-Type": "application/json"},
                               content=(ROOT / "sites" / "demo.accounts.json").read_bytes())
    assert imported.status_code == 200, imported.text
    assert imported.json()["added"] == {"accounts": 20, "deals": 40}

    # Find opportunities: every account ranked, each with its reason; the best three pre-selected.
    asked = await http.post(url("accounts/opportunities"), headers=auth, json={"select": 3})
    assert asked.status_code == 202, asked.text
    found = await wait_for(lambda: _json(http, url("accounts/opportunities"), auth,
                                         lambda b: b["request_id"] == asked.json()["request_id"]),
                           timeout=30, what="the opportunities")
    assert found["status"] == "completed" and len(found["items"]) == 20
    assert all(item["reason"] for item in found["items"])
    assert len({item["proposition"] for item in found["items"]}) >= 2  # the sample's dates age: not all four
    chosen = found["selected"]
    assert len(chosen) == 3 and [i["account_id"] for i in found["items"][:3]] == chosen
    assert all(i["proposition"] != "healthy" for i in found["items"][:3])

    # Reports for the three: all nine sections, the metadata and a sales script each.
    queued = await http.post(url("accounts/reports"), headers=auth, json={"accounts": chosen})
    assert queued.status_code == 202, queued.text
    reports = {}
    for account_id in chosen:
        latest = await wait_for(lambda: _json(http, url(f"accounts/{account_id}/reports/latest"), auth),
                                timeout=30, what=f"{account_id}'s report")
        report = latest["report"]
        assert [s["name"] for s in report["sections"]] == list(ev.REPORT_SECTIONS)
        assert all(s["text"].strip() for s in report["sections"])
        assert set(report["metadata"]) == {"proposition", "success_percent", "priority"}
        assert report["metadata"]["proposition"] == next(i["proposition"] for i in found["items"]
                                                         if i["account_id"] == account_id)
        assert "## Talk tracks" in report["sales_script"] and "## Closing" in report["sales_script"]
        reports[account_id] = report
    rows = (await http.get(url("accounts"), headers=auth)).json()["accounts"]
    assert {r["id"] for r in rows if r["last_report"]} == set(chosen)

    # A hand edit, then a change asked for elsewhere: the hand edit stays.
    account_id = chosen[0]
    report = reports[account_id]
    base = url(f"accounts/{account_id}/reports/{report['request_id']}")
    mine = "- The new CFO reviews every renewal over 50,000 USD herself."
    edit = await http.post(f"{base}/edits", headers=auth,
                           json={"section": "Risks", "text": mine, "base_version": report["version"]})
    assert edit.status_code == 202, edit.text
    done = await wait_for(lambda: _json(http, f"{base}/edits/{edit.json()['edit_id']}", auth,
                                        lambda b: b["status"] != "pending"), timeout=30, what="the hand edit")
    assert done["status"] == "done" and done["version"] == 2, done
    change = await http.post(f"{base}/edits", headers=auth,
                             json={"instruction": "make the executive summary shorter and mention the renewal"})
    done = await wait_for(lambda: _json(http, f"{base}/edits/{change.json()['edit_id']}", auth,
                                        lambda b: b["status"] != "pending"), timeout=30, what="the asked change")
    assert done["status"] == "done" and done["changed"] == ["Executive Summary"], done
    current = (await http.get(base, headers=auth)).json()
    sections = {s["name"]: s for s in current["sections"]}
    assert current["version"] == 3 and sections["Risks"]["text"] == mine and sections["Risks"]["hand_edited"]
    assert "The renewal is on" in sections["Executive Summary"]["text"]
    history = (await http.get(f"{base}/versions", headers=auth)).json()["versions"]
    assert [v["how"] for v in history] == ["generated", "hand", "asked"]

    # Paste your data: a JSON account (usage as a mapping), then free text, each to a report.
    pasted = await http.post(url("accounts/paste"), headers=auth, json={
        "name": "Harbor Field Services", "tier": "Growth", "arr": 36000, "renewal_date": "2027-01-20",
        "usage": {"technician_seats": {"current": 40, "limit": 40, "unit": "seats"}}})
    assert pasted.status_code == 202, pasted.text
    pasted_id = pasted.json()["account_id"]
    assert pasted_id.startswith("pasted-")
    latest = await wait_for(lambda: _json(http, url(f"accounts/{pasted_id}/reports/latest"), auth),
                            timeout=30, what="the pasted account's report")
    assert latest["report"]["metadata"]["proposition"] == "upsell"
    assert "Harbor Field Services" in latest["report"]["text"] and "40" in latest["report"]["text"]
    soon = (datetime.date.today() + datetime.timedelta(days=40)).isoformat()
    text = f"Quayside Plumbing\nTier: Starter\nARR: $12,000\nRenewal: {soon}\nTechnician seats: 3 of 20\n"
    prose = await http.post(url("accounts/paste"), headers={**auth, "Content-Type": "text/plain"}, content=text)
    assert prose.status_code == 202, prose.text
    [seats] = prose.json()["account"]["usage"]
    assert (seats["current"], seats["limit"]) == (3, 20) and prose.json()["account"]["arr"] == 12000
    latest = await wait_for(lambda: _json(http, url(f"accounts/{prose.json()['account_id']}/reports/latest"), auth),
                            timeout=30, what="the free text's report")
    assert latest["report"]["metadata"]["proposition"] == "churn"
    refused = await http.post(url("accounts/paste"), headers={**auth, "Content-Type": "text/plain"},
                              content=b"hello there")
    assert refused.status_code == 422 and refused.json()["errors"]
    # The pasted accounts are in no portfolio.
    assert len((await http.get(url("accounts"), headers=auth)).json()["accounts"]) == 20
