"""Account reports (issue 44 step 2): the rules and deal matching, the data-only report, the
model's passes (section re-prompt, metadata fallback, numeric check, evaluator retry, sales
script) against the scripted OpenAI-compatible server, the two nodes on a real JetStream
(one work item per account, no second report on redelivery, every report kept, the
deployment-wide concurrency), and the operator API with tenant isolation."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import msgspec
import pytest
from prometheus_client import REGISTRY

from cli import accounts as accounts_cli
from services.enricher import account_reporter, report_gatherer
from services.enricher.reports import deals, document, plain, rules, writer
from shared import account_reports, accounts
from shared import events as ev
from shared import subjects
from shared.bus import BusConfig, connect
from shared.config import LLMRoleConfig
from shared.llm import LLMClient
from tests.helpers import briefs_queue_empty, decide, start, unique, wait_for
from tests.servers import configure_site
from tests.test_turn_end import running_gateway

TODAY = "2026-11-27"
SITE = "acme"


def account(**fields) -> ev.Account:
    values = dict(id="acme-heating", name="Acme Heating", tier="Growth", arr=48000, renewal_date="2027-06-30",
                  owner="Dana", industry="HVAC", employees=80, notes="Growing fast after an acquisition.",
                  usage=[ev.Metric(metric="technician_seats", current=58, limit=60, unit="seats"),
                         ev.Metric(metric="work_orders_per_month", current=4200, limit=10000, unit="work orders"),
                         ev.Metric(metric="storage", current=12.5, limit=40, unit="GB")])
    return ev.Account(**{**values, **fields})


def deal(i: int, outcome: str, tier: str = "Growth", date: str = "2025-01-01", summary: str = "") -> ev.Deal:
    return ev.Deal(id=f"d{i:02d}", account=f"Customer {i}", tier=tier, outcome=outcome, value=1000 * i, date=date,
                   summary=summary)


HISTORY = [deal(1, "expanded", summary="HVAC contractor added 20 seats."), deal(2, "won"), deal(3, "churned"),
           deal(4, "lost", tier="Starter"), deal(5, "expanded", date="2025-06-01"), deal(6, "expanded"),
           deal(7, "expanded", date="2024-01-01"), deal(8, "expanded", date="2023-01-01"),
           deal(9, "won", tier="Enterprise"), deal(10, "churned", tier="Enterprise")]


def inputs(acct: ev.Account | None = None) -> ev.ReportInputs:
    return report_gatherer.gathered(acct or account(), HISTORY, "Acme", TODAY)


# --- rules and deal matching ----------------------------------------------------------------


@pytest.mark.parametrize("fields, proposition", [
    ({}, "upsell"),  # seats 58 of 60
    ({"renewal_date": "2027-01-10", "usage": [ev.Metric(metric="seats", current=10, limit=60)]}, "churn"),
    ({"renewal_date": "2027-01-10", "usage": [ev.Metric(metric="seats", current=40, limit=60)]}, "negotiation"),
    ({"renewal_date": "2026-10-01", "usage": [ev.Metric(metric="seats", current=40, limit=60)]}, "negotiation"),
    ({"usage": [ev.Metric(metric="seats", current=40, limit=60)]}, "healthy"),
    ({"renewal_date": "", "usage": []}, "healthy"),
])
def test_the_proposition_follows_the_documented_rules(fields, proposition):
    assert rules.proposition(rules.read(account(**fields), TODAY)) == proposition


def test_an_overdue_renewal_or_a_metric_past_its_limit_raises_the_priority():
    over = rules.read(account(usage=[ev.Metric(metric="seats", current=70, limit=60)]), TODAY)
    assert rules.metadata(over, []) == ev.ReportMetadata(proposition="upsell", success_percent=60, priority=8)
    assert rules.metadata(rules.read(account(), TODAY), []).priority == 7


def test_deal_matching_takes_the_top_eight_deterministically_with_an_outcome_mix():
    matched = deals.match(account(), "upsell", HISTORY)
    assert len(matched) == deals.MAX_DEALS
    assert matched[0].deal.id == "d01" and "same industry" in matched[0].why, "tier, industry and outcome: the best"
    assert [m.deal.id for m in matched] == ["d01", "d05", "d06", "d07", "d08", "d02", "d03", "d09"]
    assert [m.score for m in matched] == sorted((m.score for m in matched), reverse=True)
    assert deals.match(account(), "upsell", list(reversed(HISTORY))) == matched, "the order given changes nothing"
    assert {m.deal.id for m in deals.match(account(), "churn", HISTORY)[:2]} == {"d03", "d01"}


def test_one_outcome_does_not_crowd_out_the_others():
    many = [deal(i, "expanded") for i in range(1, 11)] + [deal(11, "won", tier="Enterprise")]
    matched = deals.match(account(), "upsell", many)
    assert len(matched) == deals.MAX_DEALS and "d11" in [m.deal.id for m in matched], "a won deal among eight"
    assert sum(m.deal.outcome == "expanded" for m in matched) == deals.MAX_DEALS - 1


def test_few_deals_are_all_taken_and_none_is_none():
    assert [m.deal.id for m in deals.match(account(), "upsell", HISTORY[:3])] == ["d01", "d02", "d03"]
    assert deals.match(account(), "upsell", []) == []


# --- without a model -------------------------------------------------------------------------


def test_the_data_only_report_has_every_section_is_labelled_and_every_number_is_an_inputs():
    data = inputs()
    text, meta = plain.report(data)
    assert document.missing_sections(text) == []
    assert text.startswith("> Data-only report") and "without a language model" in text
    assert document.ungrounded_numbers(text, data) == [], "no number but the input's"
    assert document.numeric_check(text, data.account) == ([], False), "every metric's figures stated"
    assert "| technician_seats | 58 | 60 | seats |" in text and "48,000 USD" in text
    assert "Customer 1" in document.sections(text)["Evidence"]
    assert meta.proposition == "upsell" and 1 <= meta.priority <= 10 and 0 <= meta.success_percent <= 100
    script = plain.sales_script(data, meta)
    assert all(f"## {name}" in script for name in ("Talk tracks", "Objection handlers", "Closing"))
    assert document.ungrounded_numbers(script, data) == []


def test_the_data_only_report_of_an_account_with_no_figures_still_has_every_section():
    data = report_gatherer.gathered(ev.Account(id="x", name="X"), [], "Acme", TODAY)
    text, meta = plain.report(data)
    assert document.missing_sections(text) == [] and meta.proposition == "healthy"
    assert document.ungrounded_numbers(text, data) == []
    assert "No comparable historical deal" in text


def counted(outcome: str, backend: str) -> float:
    return REGISTRY.get_sample_value("concierge_account_reports_total", {"outcome": outcome, "backend": backend}) or 0.0


def gathered_event(key: str, data: ev.ReportInputs | None = None) -> ev.AccountReportGathered:
    return ev.AccountReportGathered(event_id=key, site=SITE, session_id=account_reports.session_of("acme-heating"),
                                    turn=0, ts=1.0, request_id=f"r-{key}", inputs=data or inputs())


async def test_the_data_backend_completes_a_report_without_any_call():
    before = counted("generated", "data")
    out = await decide(account_reporter.make_node(None), gathered_event("g0"))
    [done] = out.events
    assert isinstance(done, ev.AccountReportCompleted) and done.backend == "data" and done.request_id == "r-g0"
    assert done.account_id == "acme-heating" and done.deals == [m.deal.id for m in inputs().deals]
    assert document.missing_sections(done.report) == [] and "## Closing" in done.sales_script
    assert out.emitted == [] and counted("generated", "data") == before + 1


# --- with a model ----------------------------------------------------------------------------


def client(llm) -> LLMClient:
    return LLMClient({"briefs": LLMRoleConfig(role="briefs", base_url=llm.base_url, api_key="k", model="m",
                                              max_retries=0)})


GOOD_META = '{"proposition": "upsell", "success_percent": 70, "priority": 8}'
SCRIPT = "## Talk tracks\nSeats.\n\n## Objection handlers\nPrice.\n\n## Closing\nA meeting."


def report_text(*leave_out: str, metadata: str = GOOD_META, figures: str = "58 of 60 seats, 4,200 of 10,000 work "
                                                                           "orders, 12.5 of 40 GB") -> str:
    body = "\n\n".join(f"## {name}\nAbout {name.lower()}: {figures}." for name in document.REQUIRED_SECTIONS
                       if name not in leave_out)
    return f"# Acme Heating\n\n{body}\n\nMETADATA: {metadata}"


def replies(*texts: str) -> list[dict]:
    return [{"reply": text} for text in texts]


@pytest.fixture
def reports_llm(llm):
    llm.clear()
    yield llm
    llm.clear()


async def test_missing_sections_are_re_asked_alone_and_bad_metadata_extracted(reports_llm):
    sections = "Here they are:\n\n## Risks\nThe renewal.\n\n## Key Questions\nWill they grow?"
    bad = '{"proposition": "expand", "success_percent": 70, "priority": 8}'
    reports_llm.fail_next(*replies(report_text("Risks", "Key Questions", metadata=bad), sections,
                                   '{"proposition": "upsell", "success_percent": 65, "priority": 7}'))
    calls = []

    async def record(call):
        calls.append(call)

    draft = await writer.draft(client(reports_llm), inputs(), record)
    assert draft.repaired_sections == ["Risks", "Key Questions"] and draft.missing_sections == []
    assert document.missing_sections(draft.text) == []
    assert draft.text.index("## Risks") < draft.text.index("## Next Steps") < draft.text.index("## Key Questions")
    assert "Here they are" not in draft.text
    assert draft.metadata == ev.ReportMetadata(proposition="upsell", success_percent=65, priority=7)
    assert draft.metadata_method == "structured" and "proposition" in draft.metadata_error
    assert draft.missing_numbers == [] and not draft.numbers_warning
    sent = reports_llm.requests()
    assert "Write only these sections: Risks, Key Questions." in sent[1]["messages"][-1]["content"]
    assert "technician_seats: 58 / 60 seats" in sent[0]["messages"][-1]["content"]
    assert sent[2]["response_format"]["type"] == "json_schema"
    assert len(calls) == 3 and all(c.role == "briefs" for c in calls)


async def test_a_report_leaving_out_most_input_figures_is_warned_about_not_blocked(reports_llm):
    reports_llm.fail_next(*replies(report_text(figures="seats are at 58"), '{"verdict": "pass", "issues": []}', SCRIPT))
    out = await decide(account_reporter.make_node(client(reports_llm)), gathered_event("g1"))
    [done] = out.events
    assert isinstance(done, ev.AccountReportCompleted) and done.numbers_warning
    assert done.missing_numbers == ["60", "4,200", "10,000", "12.5", "40"]
    [drafted] = [e for e in out.emitted if isinstance(e, ev.AccountReportDrafted)]
    assert drafted.numbers_warning and drafted.metadata_method == "line"
    review = reports_llm.requests()[1]["messages"][-1]["content"]
    assert "Input figures the report does not state: 60, 4,200" in review


async def test_two_of_six_figures_missing_is_no_warning():
    missing, warning = document.numeric_check("58 seats, 4200 work orders, 12.5 and 40 GB", account())
    assert missing == ["60", "10,000"] and not warning


async def test_a_failed_review_is_written_again_with_its_issues_then_the_sales_script(reports_llm):
    reports_llm.fail_next(*replies(report_text(), '{"verdict": "fail", "issues": ["churn is not justified"]}',
                                   report_text(figures="Rewritten: 58 of 60, 4,200 of 10,000, 12.5 of 40"),
                                   '{"verdict": "pass", "issues": []}', SCRIPT))
    retried = counted("retried", "llm")
    out = await decide(account_reporter.make_node(client(reports_llm)), gathered_event("g2"))
    [done] = out.events
    assert counted("retried", "llm") == retried + 1
    assert done.backend == "llm" and done.attempts == 2 and done.verdict == "pass" and "Rewritten" in done.report
    assert done.sales_script == SCRIPT and done.metadata.proposition == "upsell"
    steps = [(type(e).__name__, e.attempt) for e in out.emitted if not isinstance(e, ev.LLMCallRecorded)]
    assert steps == [("AccountReportDrafted", 1), ("AccountReportEvaluated", 1), ("AccountReportDrafted", 2),
                     ("AccountReportEvaluated", 2)]
    assert sum(isinstance(e, ev.LLMCallRecorded) for e in out.emitted) == 5
    retry = reports_llm.requests()[2]["messages"][-1]["content"]
    assert "Reviewer feedback:" in retry and "- churn is not justified" in retry
    assert "The report:" in reports_llm.requests()[4]["messages"][-1]["content"], "the script is written from the report"


async def test_metadata_that_never_validates_fails_the_report_instead_of_defaulting(reports_llm):
    reports_llm.fail_next(*replies(report_text(metadata="none"), '{"priority": 0}', '{"priority": 0}'))
    failed = counted("failed", "llm")
    out = await decide(account_reporter.make_node(client(reports_llm)), gathered_event("g3"))
    [outcome] = out.events
    assert isinstance(outcome, ev.AccountReportFailed) and "metadata is not valid" in outcome.reason
    assert outcome.request_id == "r-g3" and outcome.account_id == "acme-heating"
    assert counted("failed", "llm") == failed + 1


async def test_a_report_stored_already_is_not_written_again():
    gathered = gathered_event("g4")
    done = ev.follow(gathered, ev.AccountReportCompleted, account_reporter.NAME, request_id=gathered.request_id,
                     account_id="acme-heating", report="x", sales_script="x",
                     metadata=ev.ReportMetadata(proposition="healthy", success_percent=50, priority=1))
    assert (await decide(account_reporter.make_node(None), gathered, done)).events == []
    assert len((await decide(account_reporter.make_node(None), gathered)).events) == 1


# --- on the bus --------------------------------------------------------------------------------


async def test_one_work_item_per_account_each_report_in_the_accounts_log_and_every_report_kept(work_bus):
    site = unique("s")
    portfolio = accounts.Portfolio(accounts=[account(), account(id="bluepeak", name="Bluepeak", tier="Starter")],
                                   deals=HISTORY)
    await accounts.store(work_bus, site, portfolio, "test", "test")
    runners = [await start(work_bus, report_gatherer.make_node()),
               await start(work_bus, account_reporter.make_node(None, concurrency=3))]
    try:
        items = await account_reports.requests_for(work_bus, site, ["acme-heating", "bluepeak", "acme-heating"], "test")
        assert [i.account_id for i in items] == ["acme-heating", "bluepeak"], "one item per account"
        assert len({i.request_id for i in items}) == 1
        await account_reports.queue(work_bus, items)
        await account_reports.queue(work_bus, items)  # queued again (a retried request): deduped
        for account_id in ("acme-heating", "bluepeak"):
            [done] = await wait_for(lambda: account_reports.reports(work_bus, site, account_id), timeout=20,
                                    what=f"{account_id}'s report")
            assert isinstance(done, ev.AccountReportCompleted) and done.backend == "data"
            assert done.session_id == f"_acct-{account_id}" and done.account_id == account_id
            assert document.missing_sections(done.report) == []
        [gathered] = [r.event for r in await work_bus.read(subjects.conv(site, "_acct-acme-heating",
                                                                          "account_report_gathered"))]
        assert gathered.inputs.account.arr == 48000 and len(gathered.inputs.deals) == deals.MAX_DEALS
        await wait_for(lambda: briefs_queue_empty(work_bus), what="work items acked")
        info = await work_bus.js.consumer_info(subjects.CONV_STREAM, account_reporter.NAME)
        assert info.config.max_ack_pending == 3, "the model calls are limited across replicas"

        # the gathered step delivered again (a redelivery after its report): no second report
        await work_bus.publish(msgspec.structs.replace(gathered, event_id=ev.new_id()))
        again = await account_reports.requests_for(work_bus, site, ["acme-heating"], "test")
        await account_reports.queue(work_bus, again)
        found = await wait_for(lambda: _at_least(work_bus, site, "acme-heating", 2), timeout=20, what="a second report")
        assert [r.request_id for r in found] == [items[0].request_id, again[0].request_id], "kept, oldest first"
        assert (await account_reports.latest(work_bus, site, "acme-heating")).request_id == again[0].request_id
    finally:
        for runner in runners:
            await runner.stop()


async def _at_least(bus, site, account_id, n):
    found = await account_reports.reports(bus, site, account_id)
    return found if len(found) >= n else None


async def test_an_account_gone_since_it_was_asked_for_fails_visibly(work_bus):
    site = unique("s")
    runner = await start(work_bus, report_gatherer.make_node())
    try:
        await work_bus.publish_work(account_reports.report_request(site, "nobody", "test", "r9"))
        [failed] = await wait_for(lambda: account_reports.reports(work_bus, site, "nobody"), timeout=15,
                                  what="an AccountReportFailed")
        assert isinstance(failed, ev.AccountReportFailed) and "no account 'nobody'" in failed.reason
        assert failed.request_id == "r9" and failed.account_id == "nobody"
    finally:
        await runner.stop()


def test_an_account_id_too_long_for_its_log_is_named_by_its_hash():
    assert account_reports.session_of("acme") == "_acct-acme"
    long = account_reports.session_of("a" * 64)
    assert subjects.TOKEN_RE.match(long) and long != account_reports.session_of("a" * 63 + "b")


# --- the operator API ----------------------------------------------------------------------------

ADMIN = "reports-api-admin-token-0123456789"


def key_of(site: str) -> str:
    return f"ck_{site}_{hashlib.sha256(site.encode()).hexdigest()[:24]}"


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(nats_url, redis_url, site, monkeypatch):
    other = unique("other")
    for name in (site, other):
        await configure_site(nats_url, name, operator_key_sha256=[hashlib.sha256(key_of(name).encode()).hexdigest()])
    async with running_gateway(nats_url, redis_url, monkeypatch, admin_token=ADMIN) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, other


async def waiting(bus, site: str) -> dict[str, int]:
    info = await bus.js.stream_info(subjects.BRIEFS_STREAM, subjects_filter=f"briefs.{site}.>")
    return info.state.subjects or {}


async def test_the_api_queues_one_item_per_account_once_per_request_and_shows_the_reports(bus, site, api):
    client, _ = api
    base = f"/v1/admin/sites/{site}"
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account(), account(id="bluepeak", name="B")]),
                         "test", "test")
    body = {"accounts": ["acme-heating", "bluepeak"], "request_id": "req-1"}
    first = await client.post(f"{base}/accounts/reports", json=body, headers=bearer(key_of(site)))
    assert first.status_code == 202, first.text
    assert first.json() == {"site": site, "request_id": "req-1", "accounts": ["acme-heating", "bluepeak"]}
    assert (await client.post(f"{base}/accounts/reports", json=body, headers=bearer(ADMIN))).status_code == 202
    assert await waiting(bus, site) == {f"briefs.{site}._acct-acme-heating.account_report_requested": 1,
                                        f"briefs.{site}._acct-bluepeak.account_report_requested": 1}
    unknown = await client.post(f"{base}/accounts/reports", json={"accounts": ["nobody"]}, headers=bearer(ADMIN))
    assert unknown.status_code == 404 and "nobody" in unknown.text
    assert (await client.post(f"{base}/accounts/reports", json={"accounts": []}, headers=bearer(ADMIN))).status_code == 422

    assert (await client.get(f"{base}/accounts/acme-heating/reports/latest", headers=bearer(ADMIN))).status_code == 404
    session = account_reports.session_of("acme-heating")
    meta = ev.ReportMetadata(proposition="upsell", success_percent=70, priority=8)
    for n in (1, 2):
        await bus.publish(ev.AccountReportCompleted(event_id=ev.new_id(), site=site, session_id=session, turn=0,
                                                    ts=ev.now(), request_id=f"r{n}", account_id="acme-heating",
                                                    report=f"report {n}", metadata=meta, sales_script="s"))
    listed = (await client.get(f"{base}/accounts/acme-heating/reports", headers=bearer(key_of(site)))).json()
    assert [r["request_id"] for r in listed["reports"]] == ["r1", "r2"]
    latest = (await client.get(f"{base}/accounts/acme-heating/reports/latest", headers=bearer(key_of(site)))).json()
    assert latest["type"] == "account_report_completed" and latest["event"]["report"] == "report 2"


async def test_another_sites_key_can_neither_queue_nor_read_the_sites_reports(bus, site, api):
    client, other = api
    base = f"/v1/admin/sites/{site}"
    await accounts.store(bus, site, accounts.Portfolio(accounts=[account()]), "test", "test")
    await bus.publish(ev.AccountReportCompleted(
        event_id=ev.new_id(), site=site, session_id=account_reports.session_of("acme-heating"), turn=0, ts=ev.now(),
        request_id="r1", account_id="acme-heating", report="Acme's secret report", sales_script="s",
        metadata=ev.ReportMetadata(proposition="churn", success_percent=20, priority=9)))
    for method, path in (("POST", "/accounts/reports"), ("GET", "/accounts/acme-heating/reports"),
                         ("GET", "/accounts/acme-heating/reports/latest")):
        answer = await client.request(method, base + path, headers=bearer(key_of(other)),
                                      json={"accounts": ["acme-heating"]} if method == "POST" else None)
        assert answer.status_code == 404, (method, path, answer.text)
        assert "secret" not in answer.text
        assert (await client.request(method, base + path)).status_code == 401
    assert await waiting(bus, site) == {}
    # the other site's own path names its own site: the account is not there
    theirs = await client.post(f"/v1/admin/sites/{other}/accounts/reports", json={"accounts": ["acme-heating"]},
                               headers=bearer(key_of(other)))
    assert theirs.status_code == 404
    mine = await client.get(f"/v1/admin/sites/{other}/accounts/acme-heating/reports", headers=bearer(key_of(other)))
    assert mine.json()["reports"] == []


# --- the command line --------------------------------------------------------------------------


def test_the_cli_queues_reports_and_shows_the_latest(nats_url, tmp_path, capsys):
    site = unique("cli")
    path = tmp_path / "accounts.json"
    path.write_text(json.dumps({"accounts": [msgspec.to_builtins(account())]}))
    assert accounts_cli.main(["--nats-url", nats_url, "import", "--site", site, str(path)]) == 0
    capsys.readouterr()
    assert accounts_cli.main(["--nats-url", nats_url, "report", "--site", site, "--account", "nobody"]) == 2
    assert "no account nobody" in capsys.readouterr().err
    assert accounts_cli.main(["--nats-url", nats_url, "report", "show", "--site", site, "--account", "acme-heating"]) == 2
    assert "no report for account acme-heating" in capsys.readouterr().err
    assert accounts_cli.main(["--nats-url", nats_url, "report", "--site", site, "--account", "acme-heating"]) == 0
    assert "queued 1 account reports" in capsys.readouterr().out

    async def store_report():
        bus = await connect(BusConfig(url=nats_url), name="test-cli-reports")
        try:
            data = inputs()
            text, meta = plain.report(data)
            await bus.publish(ev.AccountReportCompleted(
                event_id=ev.new_id(), site=site, session_id=account_reports.session_of("acme-heating"), turn=0,
                ts=ev.now(), request_id="r1", account_id="acme-heating", backend="data", report=text, metadata=meta,
                sales_script=plain.sales_script(data, meta)))
        finally:
            await bus.close()

    asyncio.run(store_report())
    assert accounts_cli.main(["--nats-url", nats_url, "report", "show", "--site", site, "--account", "acme-heating"]) == 0
    out = capsys.readouterr().out
    assert "report 1 of 1 (r1), version 1 of 1, data, upsell" in out and "## Key Questions" in out and "## Closing" in out


async def test_two_replicas_with_a_limit_of_one_write_one_report_at_a_time(work_bus, reports_llm):
    """Two runners of the node (two replicas) share its durable: with REPORTS_CONCURRENCY 1,
    the model calls of three accounts never overlap (each call's span: its record's time
    back to its latency)."""
    site = unique("s")
    ids = ["a1", "a2", "a3"]
    await accounts.store(work_bus, site, accounts.Portfolio(accounts=[account(id=i, name=i) for i in ids]),
                         "test", "test")
    for _ in ids:
        reports_llm.fail_next({"reply": report_text(), "delay_s": 0.3}, *replies('{"verdict": "pass", "issues": []}',
                                                                               SCRIPT))
    node = account_reporter.make_node(client(reports_llm), concurrency=1)
    runners = [await start(work_bus, report_gatherer.make_node()), await start(work_bus, node),
               await start(work_bus, account_reporter.make_node(client(reports_llm), concurrency=1))]
    try:
        await account_reports.queue(work_bus, await account_reports.requests_for(work_bus, site, ids, "test"))
        for i in ids:
            [done] = await wait_for(lambda: account_reports.reports(work_bus, site, i), timeout=30, what=f"{i}'s report")
            assert isinstance(done, ev.AccountReportCompleted) and done.verdict == "pass", done
        spans = []
        for i in ids:
            for record in await work_bus.read(subjects.conv(site, account_reports.session_of(i), "llm_call_recorded")):
                call = record.event.call
                spans.append((record.event.ts - call.latency_ms / 1000, record.event.ts, i))
        spans.sort()
        assert len(spans) == 9
        overlapping = [(a, b) for a, b in zip(spans, spans[1:]) if a[2] != b[2] and b[0] < a[1] - 0.01]
        assert overlapping == [], "two accounts' model calls at once"
        info = await work_bus.js.consumer_info(subjects.CONV_STREAM, account_reporter.NAME)
        assert info.config.max_ack_pending == 1
    finally:
        for runner in runners:
            await runner.stop()
