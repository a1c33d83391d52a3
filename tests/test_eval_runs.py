"""Runs of a site's own test cases (shared/eval_runs.py, the gateway's eval_runner) with the
whole system running as processes (tests/e2e.py, the shared system: scripted models that
answer "You said: <the message>. I have N earlier messages of context."): a case saved from
a visitor's turn and cases written out are asked through the real nodes, each judged (an
intent, a fact, a page, a decline; a conversation before the message asked first), a run
after a change names the case that broke, and the runs write nothing a visitor's figures
count: no conversation listed, no insight, no lead webhook."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import msgspec
import pytest

from cli.harness.sse import Conversation
from shared import eval_runs
from shared import events as ev
from tests import e2e
from tests.e2e import operator_url, ops
from tests.helpers import wait_for
from tests.servers import ROOT

system, webhook, http = e2e.shared_system, e2e.shared_webhook, e2e.http
RUN_DEADLINE_S = 90


@pytest.fixture
async def demo_like(system):
    """A site of its own with the demo's config (its booking flow, its CTA), no knowledge."""
    from shared import subjects
    from shared.bus import connect
    from shared.config import BusConfig
    from shared.site_config import parse

    site = f"t{ev.new_id()[:10]}"
    bus = await connect(BusConfig(url=system.nats_url), name="test-eval-runs")
    try:
        kv = await bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
        await kv.put(site, msgspec.json.encode(parse(ROOT / "sites" / "demo.toml")))
    finally:
        await bus.close()
    return site


async def finished(http, system, site: str, run: str) -> dict:
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:
        shown = await http.get(operator_url(system, site, f"evals/runs/{run}"), headers=ops(system))
        assert shown.status_code == 200, shown.text
        if shown.json()["run"]["state"] != "running":
            return shown.json()["run"]
        await asyncio.sleep(0.3)
    raise AssertionError(f"run {run} not finished within {RUN_DEADLINE_S} s")


async def test_a_sites_cases_are_run_judged_and_a_change_shows_what_broke(system, webhook, http, demo_like):
    site = demo_like
    cases_url, runs_url = operator_url(system, site, "evals/cases"), operator_url(system, site, "evals/runs")
    nothing = await http.post(runs_url, headers=ops(system))
    assert nothing.status_code == 409 and "no test case" in nothing.json()["detail"][0]["message"]

    visitor = Conversation(http, system.gateway_url, site)
    said = await visitor.say("How much is the Growth plan?")
    assert said.status == 200 and said.final["type"] == "complete"

    async def save(body: dict) -> str:
        made = await http.post(cases_url, headers=ops(system), json=body)
        assert made.status_code == 201, made.text
        return made.json()["case"]["id"]

    growth = await save({"from_session": visitor.session_id, "from_turn": 1,
                         "expect": {"intent": "LEARN", "route": "ANSWER", "facts": [["Growth plan"]]}})
    tokyo = await save({"message": "Do you have an office in Tokyo?", "expect": {"facts": [["Osaka"]]}})
    declines = await save({"message": "Who founded the company?", "expect": {"decline": True}})
    cited = await save({"message": "What does the Scale plan cost?",
                        "expect": {"pages": ["https://tidewise.example/pricing"]}})
    # Asked after the conversation before it: the model is told of two earlier messages.
    followed = await save({"message": "And the invoices?", "history": [
        {"role": "user", "content": "We run a plumbing company."},
        {"role": "assistant", "content": "Great, Tidewise schedules field teams."}],
        "expect": {"facts": [["2 earlier messages"]]}})
    # A booking that captures a lead in a visitor's conversation: in a run, no webhook.
    booked = await save({"message": "grace@example.com", "history": [{"role": "user", "content": "I'd like to book a demo"}],
                         "expect": {"route": "BOOKING"}})
    webhook.reset()

    started = await http.post(runs_url, headers=ops(system))
    assert started.status_code == 202, started.text
    run = started.json()["run"]["run"]
    first = await finished(http, system, site, run)
    assert first["state"] == "completed" and first["cases"] == 6, first
    by_case = {r["case_id"]: r for r in first["results"]}
    assert {case for case, r in by_case.items() if r["passed"]} == {growth, declines, followed, booked}, by_case
    assert by_case[tokyo]["failures"] == ["missing fact: Osaka"]
    assert by_case[cited]["failures"] == ["page not cited: https://tidewise.example/pricing"]
    assert by_case[growth]["intent"] == "LEARN" and "Growth plan" in by_case[growth]["answer"]
    assert sorted(first["failed"]) == sorted([tokyo, cited]) and first["pass_rate"] == round(4 / 6, 3)
    assert first["newly_failing"] == [] and first["previous_run"] == ""

    # Nothing a visitor's figures count: one conversation listed (the visitor's), no lead
    # webhook although a run captured a lead (the case that books a demo).
    conversations = (await http.get(operator_url(system, site, "conversations"), headers=ops(system))).json()
    assert [c["session_id"] for c in conversations["conversations"]] == [visitor.session_id]
    try_session = eval_runs.try_session(run, booked)
    events = (await http.get(operator_url(system, site, f"conversations/{try_session}/events"),
                             headers=ops(system))).json()["events"]
    assert any(e["type"] == "lead_captured" for e in events), [e["type"] for e in events]
    await asyncio.sleep(1.0)  # a webhook would have gone out by now (the lead's is sent at once)
    assert sent(webhook, site) == []

    # The case's expectation changes (as a knowledge change would change the answer): the
    # next run names it as newly failing, against the run before, and the site's webhook
    # says so (eval.regressed, signed as the lead webhook is).
    edited = await http.put(f"{cases_url}/{growth}", headers=ops(system), json={
        "message": "How much is the Growth plan?", "expect": {"facts": [["$59"]]}})
    assert edited.status_code == 200, edited.text
    second_run = (await http.post(runs_url, headers=ops(system))).json()["run"]["run"]
    second = await finished(http, system, site, second_run)
    assert second["newly_failing"] == [growth] and second["previous_run"] == run, second
    await wait_for(lambda: sent(webhook, site), timeout=20, what="the eval.regressed webhook")
    (regressed,) = sent(webhook, site)
    body = json.loads(regressed["body"])
    assert body["event"] == "eval.regressed" and body["run"] == second_run and body["reason"] == "operator"
    assert body["pass_rate"] == 0.5 and body["previous_pass_rate"] == round(4 / 6, 3)
    assert [(c["case_id"], c["failures"]) for c in body["newly_failing"]] == [(growth, ["missing fact: $59"])]
    assert regressed["headers"]["webhook-id"].startswith("eval_") and regressed["headers"]["webhook-signature"]

    # A change of the site's config runs the cases again by itself, once it has settled.
    changed = await http.patch(operator_url(system, site, "").rstrip("/"), headers=ops(system),
                               json={"widget": {"title": "Ask Tidewise"}})
    assert changed.status_code == 200, changed.text

    async def automatic():
        runs = (await http.get(runs_url, headers=ops(system))).json()["runs"]
        return next((r for r in runs if r["reason"] == "config" and r["state"] != "running"), None)

    auto = await wait_for(automatic, timeout=RUN_DEADLINE_S, what="the run after the config change")
    assert auto["cases"] == 6 and auto["previous_run"] == second_run and auto["newly_failing"] == []
    listed = (await http.get(runs_url, headers=ops(system))).json()["runs"]
    assert [r["run"] for r in listed] == [auto["run"], second_run, run] and listed[2]["passed"] == 4
    assert len(sent(webhook, site)) == 1  # nothing newly failing: no second webhook

    # No insight figure counts the runs' turns: the visitor's one conversation, its one turn.
    async def projected():
        figures = (await http.get(operator_url(system, site, "insight"), headers=ops(system))).json()
        return figures if figures["conversations"] else None

    await wait_for(projected, timeout=20, what="the visitor's conversation projected")
    figures = await projected()
    assert figures["conversations"] == 1 and figures["turns"] == 1, figures

    # The same from the command line, as an operator's CI would run it: each case as it is
    # judged, the run as JSON last, exit 1 as a case failed.
    metrics = [arg for port in system.ops_ports.values() for arg in ("--metrics", f"http://127.0.0.1:{port}/metrics")]
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "cli", "eval", "site", "--site", site,
                                                    "--nats-url", system.nats_url, "--timeout", str(RUN_DEADLINE_S),
                                                    *metrics],
                                   cwd=ROOT, capture_output=True, text=True, timeout=RUN_DEADLINE_S + 30)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert sum(1 for line in lines if line.startswith(("pass ", "FAIL "))) == 6, lines
    figures = json.loads(lines[-1])
    assert figures["cases"] == 6 and sorted(figures["failed"]) == sorted([growth, tokyo, cited])
    assert figures["newly_failing"] == [] and figures["cases_per_s"] > 0 and figures["cpu_s_per_case"] > 0


def sent(webhook, site: str) -> list[dict]:
    """What the webhook receiver got about `site`."""
    return [r for r in webhook.requests if f'"site":"{site}"'.encode() in r["body"]]


def test_a_turn_is_judged_on_each_expectation():
    expect = ev.Expect(intent="LEARN", route="ANSWER", facts=[["$59", "59 dollars"], ["monthly"]],
                       forbidden=["free forever"], pages=["https://x.example/pricing/"])
    assert eval_runs.judge(expect, intent="LEARN", route="ANSWER", answer="It is **$59** a month, billed monthly.",
                           cited=["https://x.example/pricing"]) == []
    assert eval_runs.judge(expect, intent="SUPPORT", route="REDIRECT", answer="It is free forever.", cited=[]) == [
        "intent SUPPORT, expected LEARN", "route REDIRECT, expected ANSWER", "missing fact: $59",
        "missing fact: monthly", "said what it must not: free forever",
        "page not cited: https://x.example/pricing/"]
    decline = ev.Expect(decline=True)
    assert eval_runs.judge(decline, intent="LEARN", route="ANSWER", answer="I couldn't find that.", cited=[]) == []
    assert eval_runs.judge(decline, intent="LEARN", route="ANSWER", answer="Yes [1].", cited=["https://x.example/a"]) \
        == ["answered from 1 cited source(s), expected to decline"]
