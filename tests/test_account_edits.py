"""Account reports, issue 44 steps 3 and 4: opportunities across a batch of accounts (the
rule, the model's validated ranking and its fallback, the pre-selection) and a report's
edits (by hand, asked for in words with and without a model, hand edits kept by later
edits and later reports, every version kept and diffable), through the nodes on a real
JetStream, the operator API (with another site's key) and the command line."""

from __future__ import annotations

from pathlib import Path

import json

import msgspec
import pytest

from cli import accounts as accounts_cli
from cli import options
from services.enricher import account_reporter, opportunity_finder, report_editor, report_gatherer
from services.enricher.reports import document, edits, opportunities, plain
from shared import account_reports, accounts
from shared import events as ev
from shared.llm import LLMError
from shared.node import Context, gather
from shared.store import MemoryStore
from tests.helpers import StructuredLLM, start, unique, wait_for
from tests.test_account_reports import ADMIN, HISTORY, TODAY, account, api, bearer, inputs, key_of  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = accounts.parse((ROOT / "sites" / "demo.accounts.json").read_bytes())


def sections_of(text: str) -> dict[str, str]:
    return {s.name: s.text for s in document.split(text)[1]}


# --- opportunities ---------------------------------------------------------------------------


def churn_risk(**fields) -> ev.Account:
    return account(**{"id": "quietco", "name": "QuietCo", "arr": 40000, "renewal_date": "2027-01-10",
                      "usage": [ev.Metric(metric="seats", current=5, limit=50, unit="seats")], **fields})


def test_the_rule_ranks_by_revenue_at_stake_weighted_by_urgency_healthy_last_with_the_figures_as_reasons():
    batch = [account(id="calm", name="Calm", arr=900000,
                     usage=[ev.Metric(metric="seats", current=20, limit=60)]),  # healthy: last, whatever its ARR
             account(),  # upsell (7): seats 58 of 60, 48,000 × 7 = 336,000
             account(id="renewing", name="Renewing", renewal_date="2027-01-05", arr=50000,
                     usage=[ev.Metric(metric="seats", current=40, limit=60)]),  # negotiation: 50,000 × 6 = 300,000
             churn_risk()]  # churn (9): 40,000 × 9 = 360,000
    ranked = opportunities.rank_by_rule(batch, TODAY)
    assert [(o.account_id, o.proposition) for o in ranked] == [
        ("quietco", "churn"), ("acme-heating", "upsell"), ("renewing", "negotiation"), ("calm", "healthy")]
    assert "technician_seats 58 of 60 seats (97 %)" in ranked[1].reason and "ARR 48,000 USD" in ranked[1].reason
    assert "renews 2027-01-10 (in 44 days)" in ranked[0].reason and "seats 5 of 50 seats (10 %)" in ranked[0].reason
    assert "ARR 40,000 USD" in ranked[0].reason
    assert opportunities.selected(ranked, 3) == ["quietco", "acme-heating", "renewing"]
    assert opportunities.selected(ranked, 1) == ["quietco"]


def test_within_a_proposition_more_revenue_at_stake_comes_first():
    small, big = account(id="small", name="Small", arr=1000), account(id="big", name="Big", arr=90000)
    assert [o.account_id for o in opportunities.rank_by_rule([small, big], TODAY)] == ["big", "small"]


def test_the_sample_portfolio_has_every_kind_of_opportunity():
    ranked = opportunities.rank_by_rule(SAMPLE.accounts, TODAY)
    kinds = {o.proposition for o in ranked}
    assert kinds == {"upsell", "churn", "negotiation", "healthy"}, kinds
    assert all(o.reason.strip() for o in ranked) and len(ranked) == 20


async def find(node, event, batch):
    inputs = await gather(node.needs, event, MemoryStore(lambda: [], portfolio=accounts.Portfolio(accounts=batch)),
                          None)
    emitted = []
    ctx = Context(out=type("Out", (), {"publish": emitted.append})(), node=node.name, cause=event, attempt=1)
    return list(await node.handle(event, inputs, ctx))


def search(*ids: str, select: int = 3) -> ev.OpportunitiesRequested:
    event = account_reports.opportunities_request("acme", "test", ids, select, request_id="o1")
    return msgspec.structs.replace(event, ts=1795780800.0)  # 2026-11-27


async def test_the_models_ranking_is_used_when_it_covers_every_account_exactly_once():
    batch = [account(), churn_risk()]
    reply = opportunities.OpportunitiesReply(items=[
        ev.Opportunity(account_id="acme-heating", proposition="upsell", reason="58 of 60 seats."),
        ev.Opportunity(account_id="quietco", proposition="churn", reason="5 of 50 seats, renews in January.")])
    llm = StructuredLLM(reply)
    [done] = await find(opportunity_finder.make_node(llm), search(), batch)
    assert done.backend == "llm" and done.model_error == "" and done.items == reply.items
    assert done.selected == ["acme-heating", "quietco"] and done.accounts == 2
    sent = llm.calls[0][-1]["content"]
    assert "quietco: QuietCo, tier Growth, ARR 40,000 USD, renews 2027-01-10 (in 44 days)" in sent


async def test_a_ranking_missing_an_account_is_repaired_once_then_the_rule_ranks():
    batch = [account(), churn_risk()]
    partial = opportunities.OpportunitiesReply(items=[
        ev.Opportunity(account_id="acme-heating", proposition="upsell", reason="Seats."),
        ev.Opportunity(account_id="someone-else", proposition="churn", reason="?")])
    llm = StructuredLLM(partial)
    [done] = await find(opportunity_finder.make_node(llm), search(), batch)
    assert len(llm.calls) == 2, "one repair round"
    assert "account quietco is not ranked" in llm.calls[1][-1]["content"]
    assert done.backend == "data" and "someone-else is not one of the accounts" in done.model_error
    assert [o.account_id for o in done.items] == ["quietco", "acme-heating"] and "(by rule)" in done.items[0].reason
    [failed] = await find(opportunity_finder.make_node(StructuredLLM(LLMError("timeout"))), search(), batch)
    assert failed.backend == "data" and "timeout" in failed.model_error and len(failed.items) == 2


async def test_only_the_accounts_named_are_ranked_and_healthy_ones_are_never_pre_selected():
    calm = account(id="calm", name="Calm", usage=[ev.Metric(metric="seats", current=20, limit=60)])
    [done] = await find(opportunity_finder.make_node(None), search("calm", "quietco", select=5),
                        [account(), churn_risk(), calm])
    assert [o.account_id for o in done.items] == ["quietco", "calm"] and done.selected == ["quietco"]
    assert done.backend == "data"


# --- the rule editor ---------------------------------------------------------------------------

SECTIONS = {"Executive Summary": "Acme pays 48,000 USD a year. It is growing. Seats are nearly all used.",
            "Risks": "- Seats past the limit soon.\n- A comparable account churned: Polar Air.\n- Price.",
            "Key Metrics": "| metric | current | limit |\n|---|---|---|\n| seats | 58 | 60 |\n| storage | 12.5 | 40 |"}


@pytest.mark.parametrize("instruction, changed", [
    ("make the risks section shorter and mention the renewal",
     {"Risks": "- Seats past the limit soon.\n- A comparable account churned: Polar Air.\n"
               "- The renewal is on 2027-06-30."}),
    ("Make the executive summary shorter", {"Executive Summary": "Acme pays 48,000 USD a year. It is growing."}),
    ("remove the sentences about Polar Air from the risks", {"Risks": "- Seats past the limit soon.\n- Price."}),
    ("mention the storage in the key metrics",
     {"Key Metrics": SECTIONS["Key Metrics"] + "\n\nstorage: 12.5 of 40 GB."}),
    ("add the tier to the summary", {"Executive Summary": SECTIONS["Executive Summary"]
                                     + " The account is on the Growth tier."}),
])
def test_the_rule_editor_changes_only_the_sections_named_as_asked(instruction, changed):
    assert edits.by_rule(SECTIONS, instruction, inputs()) == changed


@pytest.mark.parametrize("instruction, why", [
    ("make it more persuasive", "names no section"),
    ("make the risks more persuasive", "understands"),
    ("remove the sentences about unicorns from the risks", "no sentence of the section mentions 'unicorns'"),
    ("mention the weather in the risks", "nothing in the account data matches"),
    ("shorten the evidence", "no Evidence section"),
])
def test_what_the_rule_editor_cannot_do_it_refuses_saying_what_it_can(instruction, why):
    with pytest.raises(edits.EditRefused, match=why):
        edits.by_rule(SECTIONS, instruction, inputs())


def test_an_asked_change_to_a_hand_edit_is_kept_out_unless_the_instruction_names_it():
    changes = {"Risks": "new risks", "Executive Summary": "new summary"}
    assert edits.keep_hand_edits(changes, ["Risks"], "tighten the summary") == (
        {"Executive Summary": "new summary"}, ["Risks"])
    assert edits.keep_hand_edits(changes, ["Risks"], "rewrite the risks and the summary") == (changes, [])


# --- a report's versions, through the nodes on a real JetStream ------------------------------


async def edited(bus, site, account_id, request_id, how, edit_id=None, **fields):
    item = account_reports.edit_request(site, account_id, request_id, how, "dana@example", "test", edit_id, **fields)
    await bus.publish_work(item)
    return await wait_for(lambda: account_reports.edit_outcome(bus, site, account_id, request_id, item.edit_id), timeout=20,
                          what=f"edit {item.edit_id}")


@pytest.fixture
async def report_nodes(work_bus):
    runners = [await start(work_bus, report_gatherer.make_node()),
               await start(work_bus, account_reporter.make_node(None)),
               await start(work_bus, report_editor.make_node(None))]
    yield work_bus
    for runner in runners:
        await runner.stop()


async def first_report(bus, site, account_id="acme-heating"):
    await account_reports.queue(bus, await account_reports.requests_for(bus, site, [account_id], "test"))
    [done] = await wait_for(lambda: account_reports.reports(bus, site, account_id), timeout=20, what="a report")
    assert isinstance(done, ev.AccountReportCompleted), done
    return done


async def test_a_hand_edit_is_kept_by_an_asked_change_elsewhere_and_by_the_next_report(report_nodes):
    bus, site = report_nodes, unique("s")
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account()], deals=HISTORY), "test", "test")
    done = await first_report(bus, site)
    assert [s.name for s in done.sections] == list(ev.REPORT_SECTIONS) and "Data-only report" in done.preamble

    mine = "- Dana: the CFO is new and reviews every contract over 40,000 USD."
    hand = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Risks", text=mine,
                        base_version=1)
    assert isinstance(hand, ev.AccountReportRevised), hand
    assert (hand.version, hand.how, hand.hand_edited, hand.actor) == (2, "hand", ["Risks"], "dana@example")

    asked = await edited(bus, site, "acme-heating", done.request_id, "asked",
                         instruction="make the executive summary shorter and mention the renewal")
    assert isinstance(asked, ev.AccountReportRevised), asked
    assert asked.version == 3 and asked.backend == "data" and [c.name for c in asked.changes] == ["Executive Summary"]
    assert "The renewal is on 2027-06-30" in asked.changes[0].text and asked.hand_edited == ["Risks"]

    _, history = await account_reports.report(bus, site, "acme-heating", done.request_id)
    assert [(v.version, v.how) for v in history] == [(1, "generated"), (2, "hand"), (3, "asked")]
    assert history[-1].sections["Risks"] == mine, "the hand edit survives the asked change"
    assert history[0].sections["Risks"] != mine, "every version kept"
    changed = account_reports.diff(done, history, 1, 3)
    assert [c["section"] for c in changed["sections"]] == ["Executive Summary", "Risks"]
    assert f"+{mine}" in changed["unified"]
    shown = account_reports.view(done, history)
    assert shown["version"] == 3 and shown["hand_edited"] == ["Risks"] and mine in shown["text"]

    # Asking for a change of the hand-edited section without naming it leaves it: nothing to do.
    kept = await edited(bus, site, "acme-heating", done.request_id, "asked", instruction="make the summary shorter")
    assert isinstance(kept, ev.AccountReportRevised) and "Risks" not in [c.name for c in kept.changes]

    # A new report of the account starts from the hand edit.
    again = await account_reports.requests_for(bus, site, ["acme-heating"], "test")
    await account_reports.queue(bus, again)
    found = await wait_for(lambda: _completed(bus, site, 2), timeout=20, what="a second report")
    second = found[-1]
    assert second.hand_edited == ["Risks"] and {s.name: s.text for s in second.sections}["Risks"] == mine
    assert mine in second.report and document.missing_sections(second.report) == []


async def _completed(bus, site, n):
    found = [r for r in await account_reports.reports(bus, site, "acme-heating")
             if isinstance(r, ev.AccountReportCompleted)]
    return found if len(found) >= n else None


async def test_edits_that_cannot_be_made_end_in_a_visible_failure_and_change_nothing(report_nodes):
    bus, site = report_nodes, unique("s")
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account()], deals=HISTORY), "test", "test")
    done = await first_report(bus, site)
    first = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Risks", text="- One.")
    assert isinstance(first, ev.AccountReportRevised)
    # Written on version 1 after the section changed in version 2: it would undo the other edit.
    stale = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Risks", text="- Two.",
                         base_version=1)
    assert isinstance(stale, ev.AccountReportEditFailed) and "changed after version 1 (version 2" in stale.reason
    # Another section written on version 1 is no conflict.
    other = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Next Steps", text="- Call.",
                         base_version=1)
    assert isinstance(other, ev.AccountReportRevised) and other.version == 3
    same = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Risks", text="- One.")
    assert isinstance(same, ev.AccountReportEditFailed) and "nothing to change" in same.reason
    vague = await edited(bus, site, "acme-heating", done.request_id, "asked", instruction="make it pop")
    assert isinstance(vague, ev.AccountReportEditFailed) and "names no section" in vague.reason
    nothing = await edited(bus, site, "acme-heating", "no-such-report", "asked", instruction="shorten the risks")
    assert isinstance(nothing, ev.AccountReportEditFailed) and "no completed report" in nothing.reason
    _, history = await account_reports.report(bus, site, "acme-heating", done.request_id)
    assert len(history) == 3, "a refused edit makes no version"
    # The same edit queued twice (a retried request) is one edit.
    again = await edited(bus, site, "acme-heating", done.request_id, "hand", "e-twice", section="Risks", text="- Three.")
    twice = await edited(bus, site, "acme-heating", done.request_id, "hand", "e-twice", section="Risks", text="- Three.")
    assert again.event_id == twice.event_id
    _, history = await account_reports.report(bus, site, "acme-heating", done.request_id)
    assert [v.version for v in history] == [1, 2, 3, 4]


async def test_with_a_model_an_asked_change_applies_what_it_returns_but_never_an_unnamed_hand_edit():
    data = inputs()
    text, meta = plain.report(data)
    preamble, sections = document.split(text)
    completed = ev.AccountReportCompleted(event_id="c1", site="acme", session_id="_acct-acme-heating", turn=0, ts=1.0,
                                          request_id="r1", account_id="acme-heating", backend="llm", report=text,
                                          metadata=meta, sales_script="s", preamble=preamble, sections=sections)
    gathered = ev.AccountReportGathered(event_id="g1", site="acme", session_id="_acct-acme-heating", turn=0, ts=1.0,
                                        request_id="r1", inputs=data)
    hand = ev.AccountReportRevised(event_id="v2", site="acme", session_id="_acct-acme-heating", turn=0, ts=2.0,
                                   account_id="acme-heating", request_id="r1", edit_id="e1", version=2, how="hand",
                                   actor="dana", changes=[ev.ReportSection(name="Risks", text="- Mine.")],
                                   hand_edited=["Risks"])
    ask = account_reports.edit_request("acme", "acme-heating", "r1", "asked", "dana", "test", "e2",
                                       instruction="make the summary punchier")
    reply = edits.UpdateReport(sections=[edits.SectionText(name="executive summary", text="Acme is outgrowing Growth."),
                                         edits.SectionText(name="Risks", text="- Theirs.")])
    llm = StructuredLLM(reply)
    node = report_editor.make_node(llm)
    from tests.helpers import decide

    [revised] = (await decide(node, ask, gathered, completed, hand)).events
    assert revised.backend == "llm" and revised.version == 3
    assert revised.changes == [ev.ReportSection(name="Executive Summary", text="Acme is outgrowing Growth.")]
    assert revised.ignored == ["Risks"] and revised.hand_edited == ["Risks"]
    # The hand edit given back word for word is no change the model made to it.
    same = edits.UpdateReport(sections=[edits.SectionText(name="Executive Summary", text="Shorter."),
                                        edits.SectionText(name="Risks", text="- Mine.")])
    [unchanged] = (await decide(report_editor.make_node(StructuredLLM(same)), ask, gathered, completed, hand)).events
    assert unchanged.ignored == [] and [c.name for c in unchanged.changes] == ["Executive Summary"]
    sent = llm.calls[0][-1]["content"]
    assert "Sections written by hand: Risks" in sent and "Instruction: make the summary punchier" in sent
    # A model that fails: the rule editor takes the instruction ("punchier" it cannot do: refused, saying both).
    [failed] = (await decide(report_editor.make_node(StructuredLLM(LLMError("down"))), ask, gathered, completed,
                             hand)).events
    assert isinstance(failed, ev.AccountReportEditFailed)
    assert failed.reason.startswith("the model's edit failed (down); without a model the rule editor understands")
    shorter = msgspec.structs.replace(ask, event_id="e3", edit_id="e3", instruction="make the summary shorter")
    [by_rule] = (await decide(report_editor.make_node(StructuredLLM(LLMError("down"))), shorter, gathered, completed,
                              hand)).events
    assert by_rule.backend == "data" and [c.name for c in by_rule.changes] == ["Executive Summary"]


# --- the operator API and the command line -------------------------------------------------------


@pytest.fixture
async def enricher_nodes(bus):
    runners = [await start(bus, node) for node in (report_gatherer.make_node(), account_reporter.make_node(None),
                                                   report_editor.make_node(None), opportunity_finder.make_node(None))]
    yield
    for runner in runners:
        await runner.stop()


async def test_the_api_finds_opportunities_edits_and_shows_versions_and_another_site_sees_none(
        bus, site, api, enricher_nodes):  # noqa: F811 (the fixture)
    client, other = api
    base = f"/v1/admin/sites/{site}"
    mine = bearer(key_of(site))
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account(), churn_risk()], deals=HISTORY), "t", "t")
    asked = await client.post(f"{base}/accounts/opportunities", json={"select": 1}, headers=mine)
    assert asked.status_code == 202, asked.text
    found = await wait_for(lambda: _opportunities(client, base, mine, asked.json()["request_id"]), timeout=20,
                           what="the opportunities")
    assert [(i["account_id"], i["proposition"], i["selected"]) for i in found["items"]] == [
        ("quietco", "churn", True), ("acme-heating", "upsell", False)]
    assert found["items"][0]["name"] == "QuietCo" and found["selected"] == ["quietco"]
    bad = await client.post(f"{base}/accounts/opportunities", json={"accounts": ["nobody"]}, headers=mine)
    assert bad.status_code == 404
    assert (await client.post(f"{base}/accounts/opportunities", json={"select": 99}, headers=mine)).status_code == 422

    queued = await client.post(f"{base}/accounts/reports", json={"accounts": ["acme-heating"]}, headers=mine)
    request_id = queued.json()["request_id"]
    latest = await wait_for(lambda: _latest(client, base, mine), timeout=20, what="the report")
    assert latest["report"]["version"] == 1 and latest["report"]["editable"] is True
    assert [s["name"] for s in latest["report"]["sections"]] == list(ev.REPORT_SECTIONS)
    listed = (await client.get(f"{base}/accounts", headers=mine)).json()["accounts"]
    row = next(r for r in listed if r["id"] == "acme-heating")
    assert row["last_report"]["proposition"] == "upsell" and row["last_report"]["version"] == 1
    assert next(r for r in listed if r["id"] == "quietco")["last_report"] is None

    path = f"{base}/accounts/acme-heating/reports/{request_id}"
    for body, field in (({"section": "Pricing", "text": "x"}, "section"), ({"section": "Risks", "text": " "}, "text"),
                        ({"section": "Risks", "text": "x", "instruction": "y"}, None), ({}, None),
                        ({"instruction": "x" * 1001}, "instruction")):
        refused = await client.post(f"{path}/edits", json=body, headers=mine)
        assert refused.status_code == 422, (body, refused.text)
    assert (await client.post(f"{base}/accounts/acme-heating/reports/nope/edits", json={"instruction": "shorten the risks"},
                              headers=mine)).status_code == 404
    edit = await client.post(f"{path}/edits", json={"section": "risks", "text": "- Mine.", "base_version": 1},
                             headers=mine)
    assert edit.status_code == 202, edit.text
    status = await wait_for(lambda: _done(client, f"{path}/edits/{edit.json()['edit_id']}", mine), timeout=20,
                            what="the edit")
    assert status["status"] == "done" and status["version"] == 2 and status["changed"] == ["Risks"]
    vague = await client.post(f"{path}/edits", json={"instruction": "make it shine"}, headers=mine)
    status = await wait_for(lambda: _done(client, f"{path}/edits/{vague.json()['edit_id']}", mine), timeout=20,
                            what="the refused edit")
    assert status["status"] == "failed" and "names no section" in status["reason"]
    versions = (await client.get(f"{path}/versions", headers=mine)).json()["versions"]
    assert [(v["version"], v["how"], v["sections"]) for v in versions] == [
        (1, "generated", list(ev.REPORT_SECTIONS)), (2, "hand", ["Risks"])]
    assert versions[1]["actor"].startswith("key:")
    diff = (await client.get(f"{path}/diff?from=1&to=2", headers=mine)).json()
    assert [s["section"] for s in diff["sections"]] == ["Risks"] and "+- Mine." in diff["unified"]
    old = (await client.get(f"{path}?version=1", headers=mine)).json()
    assert old["version"] == 1 and "- Mine." not in old["text"]
    assert (await client.get(f"{path}?version=9", headers=mine)).status_code == 404

    theirs = bearer(key_of(other))
    for method, route in (("GET", "/accounts/opportunities"), ("GET", f"/accounts/acme-heating/reports/{request_id}"),
                          ("GET", f"/accounts/acme-heating/reports/{request_id}/versions"),
                          ("GET", f"/accounts/acme-heating/reports/{request_id}/diff"),
                          ("POST", f"/accounts/acme-heating/reports/{request_id}/edits"),
                          ("POST", "/accounts/opportunities")):
        answer = await client.request(method, base + route, headers=theirs,
                                      json={"instruction": "shorten the risks"} if method == "POST" else None)
        assert answer.status_code == 404 and "Mine" not in answer.text, (method, route, answer.text)
    # The other site's own prefix has none of it.
    assert (await client.get(f"/v1/admin/sites/{other}/accounts/opportunities", headers=theirs)).status_code == 404


async def _opportunities(client, base, headers, request_id):
    answer = await client.get(f"{base}/accounts/opportunities", headers=headers)
    return answer.json() if answer.status_code == 200 and answer.json()["request_id"] == request_id else None


async def _latest(client, base, headers):
    answer = await client.get(f"{base}/accounts/acme-heating/reports/latest", headers=headers)
    return answer.json() if answer.status_code == 200 else None


async def _done(client, url, headers):
    answer = (await client.get(url, headers=headers)).json()
    return answer if answer["status"] != "pending" else None


async def cli(bus, *argv: str) -> int:
    """`concierge accounts ARGV` against the bus's server, in this loop (the nodes run beside it)."""
    args = accounts_cli.parser().parse_args(["--nats-url", bus.config.url, *argv])
    return await accounts_cli.run(options.bus_config(args), args)


async def test_the_cli_finds_opportunities_edits_by_hand_and_by_asking_and_shows_the_history(report_nodes, capsys):
    bus, site = report_nodes, unique("cli")
    finder = await start(bus, opportunity_finder.make_node(None))
    try:
        await accounts.store(bus, site, accounts.Portfolio(accounts=[account(), churn_risk()], deals=HISTORY), "t", "t")
        assert await cli(bus, "opportunities", "--site", site, "--select", "2", "--wait", "20") == 0
        out = capsys.readouterr().out
        assert "2 accounts ranked (data)" in out and "1. * QuietCo" in out and "churn" in out
        assert (f"pre-selected (*): concierge accounts report --site {site} --account quietco "
                "--account acme-heating") in out
        assert await cli(bus, "opportunities", "--site", site, "--account", "nobody") == 2
    finally:
        await finder.stop()
    await first_report(bus, site)
    capsys.readouterr()
    edit = ["report", "edit", "--site", site, "--account", "acme-heating", "--wait", "20"]
    assert await cli(bus, *edit, "--section", "Pricing", "--text", "x") == 2
    assert "one of Executive Summary" in capsys.readouterr().err
    assert await cli(bus, *edit, "--section", "risks", "--text", "- The CFO is new.") == 0
    assert "version 2 (hand): changed Risks" in capsys.readouterr().out
    assert await cli(bus, *edit, "--ask", "make the summary shorter") == 0
    assert "version 3 (asked, data): changed Executive Summary" in capsys.readouterr().out
    assert await cli(bus, *edit, "--ask", "make it pop") == 1
    assert "edit refused: the instruction names no section" in capsys.readouterr().err
    assert await cli(bus, "report", "history", "--site", site, "--account", "acme-heating") == 0
    out = capsys.readouterr().out
    assert "3 versions" in out and " hand " in out and '"make the summary shorter"' in out
    assert await cli(bus, "report", "history", "--site", site, "--account", "acme-heating", "--diff", "1", "2") == 0
    assert "+- The CFO is new." in capsys.readouterr().out
    assert await cli(bus, "report", "show", "--site", site, "--account", "acme-heating") == 0
    out = capsys.readouterr().out
    assert "version 3 of 3" in out and "edited by hand: Risks" in out and "- The CFO is new." in out
    assert await cli(bus, "report", "show", "--site", site, "--account", "acme-heating", "--version", "1") == 0
    assert "- The CFO is new." not in capsys.readouterr().out


# --- what a review of the first version found ----------------------------------------------------


@pytest.mark.parametrize("instruction, sections", [
    ("Shorten the summary but leave the risks as I wrote them", ["Executive Summary"]),
    ("given the situation, shorten the summary", ["Executive Summary"]),
    ("don't touch the risks section; mention the renewal in the summary", ["Executive Summary"]),
    ("make the risks section shorter and mention the renewal", ["Risks"]),
    ("shorten the risks; don\u2019t change the summary", ["Risks"]),  # a phone's apostrophe
    ("Risks: shorter", ["Risks"]),
    ("shorten the risks and keep the summary", ["Risks"]),
    ("shorten the risks without losing the summary's renewal date", ["Risks"]),
    ("shorten the risks, and the summary too", ["Risks", "Executive Summary"]),
    ("the summary is too long; cut it", ["Executive Summary"]),
    ("shorten the summary given the situation", ["Executive Summary"]),
])
def test_only_a_clause_asking_for_a_change_names_its_sections(instruction, sections):
    assert edits.named(instruction) == sections
    changes = {"Risks": "theirs", "Executive Summary": "shorter", "Situation": "other"}
    kept, ignored = edits.keep_hand_edits(changes, ["Risks"], instruction)
    assert ("Risks" in kept) == ("Risks" in sections) and ("Risks" in ignored) != ("Risks" in sections)


def test_every_fact_a_mention_lists_is_stated_and_a_metric_is_read_by_its_own_words():
    data = inputs()
    both = edits.by_rule(SECTIONS, "mention the ARR and the renewal in the summary", data)["Executive Summary"]
    assert both.endswith("ARR is 48,000 USD. The renewal is on 2027-06-30.")
    assert edits.fact(data, "storage size") == "storage: 12.5 of 40 GB."  # not the employee count
    assert edits.fact(data, "technician seats on the plan") == "technician_seats: 58 of 60 seats."
    assert edits.fact(data, "the plan") == "The account is on the Growth tier."
    with pytest.raises(edits.EditRefused, match="nothing in the account data matches 'carrier'"):
        edits.fact(data, "carrier")


def test_the_rule_editor_neither_empties_a_section_nor_states_an_arr_nobody_gave():
    with pytest.raises(edits.EditRefused, match="left empty"):
        edits.by_rule({"Risks": "- Seats.\n- Seats again."}, "remove the sentences about seats from the risks",
                      inputs())
    with pytest.raises(edits.EditRefused, match="no ARR on record"):
        edits.by_rule(SECTIONS, "mention the ARR in the summary", inputs(account(arr=0)))


def test_a_new_report_keeps_each_sections_newest_hand_edit_across_the_accounts_reports():
    data = inputs()
    text, meta = plain.report(data)
    preamble, sections = document.split(text)

    def report(request_id, ts):
        return ev.AccountReportCompleted(event_id=request_id, site="acme", session_id="_acct-acme-heating", turn=0,
                                         ts=ts, request_id=request_id, account_id="acme-heating", report=text,
                                         metadata=meta, sales_script="s", preamble=preamble, sections=sections)

    def hand(request_id, version, ts, name, body, edited):
        return ev.AccountReportRevised(event_id=f"{request_id}-{version}", site="acme",
                                       session_id="_acct-acme-heating", turn=0, ts=ts, account_id="acme-heating",
                                       request_id=request_id, edit_id=f"e{version}{request_id}", version=version,
                                       how="hand", actor="dana", changes=[ev.ReportSection(name=name, text=body)],
                                       hand_edited=edited)

    # Risks edited on the old report after the new one was written; Next Steps on the new one.
    old, new = report("r1", 1.0), report("r2", 2.0)
    revisions = [hand("r2", 2, 3.0, "Next Steps", "- Call Dana.", ["Next Steps"]),
                 hand("r1", 2, 4.0, "Risks", "- The CFO is new.", ["Risks"])]
    assert account_reports.hand_edits([old, new], revisions) == [
        ev.ReportSection(name="Risks", text="- The CFO is new."), ev.ReportSection(name="Next Steps", text="- Call Dana.")]
    # A hand edit carried into a newer report does not outlive its correction on the older one,
    # and a section an asked change rewrote (it named it) is no hand edit any more.
    carried = report("r3", 5.0)
    later = [*revisions, hand("r1", 3, 6.0, "Risks", "- The CFO left.", ["Risks"]),
             msgspec.structs.replace(hand("r2", 3, 7.0, "Next Steps", "- Rewritten.", []), how="asked")]
    assert account_reports.hand_edits([old, new, carried], later) == [
        ev.ReportSection(name="Risks", text="- The CFO left.")]


def test_two_sites_choosing_the_same_ids_queue_two_items():
    assert (account_reports.edit_request("a", "acct", "r1", "asked", "x", "t", "weekly-1", instruction="i").event_id
            != account_reports.edit_request("b", "acct", "r1", "asked", "x", "t", "weekly-1", instruction="i").event_id)
    assert (account_reports.opportunities_request("a", "t", request_id="weekly-1").event_id
            != account_reports.opportunities_request("b", "t", request_id="weekly-1").event_id)
    assert (account_reports.report_request("a", "acct", "t", "weekly-1").event_id
            != account_reports.report_request("b", "acct", "t", "weekly-1").event_id)


def test_a_search_stores_at_most_its_first_accounts_each_reason_cut():
    many = [ev.Opportunity(account_id=f"a{i}", proposition="upsell", reason="x" * 1000) for i in range(600)]
    kept = opportunities.stored(many)
    assert len(kept) == opportunities.MAX_STORED and {len(o.reason) for o in kept} == {opportunities.MAX_REASON}


def test_ids_that_are_operator_api_paths_are_refused_on_import_and_never_derived():
    with pytest.raises(accounts.AccountsError, match="names an operator API path"):
        accounts.parse(json.dumps({"accounts": [{"id": "opportunities", "name": "Opportunities Ltd"}]}).encode())
    assert accounts.account_id("Paste") == "a-paste"


@pytest.mark.parametrize("body, kind, field", [
    (b'{"name": "A\\ud800", "arr": 10, "currency": "USD"}', "json", "file"),
    (b"Acme\nEmployees: " + b"9" * 400, "text", "employees"),
    (b"A" + b" " * 19990 + b"B is on the Growth plan, 45 of 50 seats", "text", None),
])
def test_a_paste_that_no_event_could_carry_is_a_named_refusal(body, kind, field):
    from services.gateway import account_paste

    try:
        account_paste.parse(body, kind)
    except accounts.AccountsError as exc:
        assert field is None or any(e["field"] == field for e in exc.errors), exc.errors
    else:
        assert field is None  # the long line: read (or refused) at once, and never a crash


async def test_an_edit_on_a_version_the_report_does_not_have_is_refused(report_nodes):
    bus, site = report_nodes, unique("s")
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account()], deals=HISTORY), "test", "test")
    done = await first_report(bus, site)
    future = await edited(bus, site, "acme-heating", done.request_id, "hand", section="Risks", text="- One.",
                          base_version=7)
    assert isinstance(future, ev.AccountReportEditFailed) and "no version 7 (its latest is 1)" in future.reason


def test_the_cli_refuses_ids_text_and_waits_it_cannot_use(capsys):
    for argv in (["report", "edit", "--site", "s", "--account", "a\udcff", "--ask", "x"],
                 ["report", "edit", "--site", "s", "--account", "a", "--ask", "shorten \udcff"],
                 ["opportunities", "--site", "s", "--wait", "nan"]):
        with pytest.raises(SystemExit) as stopped:
            accounts_cli.parser().parse_args(argv)
        assert stopped.value.code == 2
    assert "not" in capsys.readouterr().err
