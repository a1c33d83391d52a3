"""`concierge briefs` against real NATS, as a sales user runs it: the enricher is simulated
by a task that takes the work items off the BRIEFS queue (by subject, no consumer) and
stores the outcome a brief node would."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from cli import briefs as cli
from shared import events as ev
from shared import subjects
from tests import lead_briefs
from tests.helpers import wait_for


async def arun(capsys, nats_url: str, *argv: str) -> tuple[int, str, str]:
    """The command on this test's loop, beside the simulated enricher."""
    capsys.readouterr()
    code = await asyncio.wait_for(cli.amain([*argv, "--nats-url", nats_url]), 60)
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.asynccontextmanager
async def enricher(bus, site: str, answers: dict[str, object]):
    """Answers each work item queued for `answers`' sessions with `answers[session](item)`."""
    taken: list[ev.Envelope] = []
    stopping = asyncio.Event()

    async def loop():
        # Ends on `stopping`, not on the cancellation alone: Python 3.11's asyncio.wait_for (in
        # nats-py's request) can swallow a cancellation that arrives as its reply does, and the
        # loop then went on for ever (a fresh clone's suite hung here until its timeout).
        while not stopping.is_set():
            for session, answer in answers.items():
                subject = subjects.work(site, session, "triage_requested" if session == ev.TRIAGE_SESSION
                                        else "brief_requested")
                try:
                    msg = await bus.js.get_msg(subjects.BRIEFS_STREAM, subject=subject)
                except Exception:
                    continue  # nothing queued for it yet
                await bus.js.delete_msg(subjects.BRIEFS_STREAM, msg.seq)
                item = ev.decode(msg.data)
                taken.append(item)
                if (outcome := answer(item)) is not None:
                    await bus.publish(outcome)
            await asyncio.sleep(0.05)

    task = asyncio.create_task(loop())
    try:
        yield taken
    finally:
        stopping.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_show_prints_every_part_of_the_brief_then_the_call_script(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada")
    brief = lead_briefs.completed(site, "ada", priority=8, verdict="marginal", issues=["the seats are a guess"],
                                  ungrounded_numbers=["40"], backend="llm")
    await bus.publish(brief)
    code, out, _ = await arun(capsys, nats_url, "show", "--site", site, "--lead", "ada")
    assert code == 0
    for part in ("ada@example.com", "priority 8/10", "stage evaluating", "~25 seats", "confidence 60%",
                 "evaluator: marginal", "the seats are a guess", "found in no input (check them): 40",
                 "llm backend", brief.request_id, "## Summary", "## Next step", "# Call script", "how many seats?"):
        assert part in out, part
    assert out.index("## Next step") < out.index("# Call script") < out.index("how many seats?")


async def test_show_says_so_when_there_is_no_brief_or_it_failed(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada")
    code, _, err = await arun(capsys, nats_url, "show", "--site", site, "--lead", "ada")
    assert code == 1 and "no brief yet" in err and "briefs generate" in err
    await bus.publish(lead_briefs.completed(site, "ada"))
    await bus.publish(lead_briefs.failed(site, "ada", reason="the model never gave valid metadata"))
    code, out, err = await arun(capsys, nats_url, "show", "--site", site, "--lead", "ada")
    assert code == 1 and "failed" in err and "never gave valid metadata" in err and "## Summary" not in out


async def test_show_without_a_lead_lists_the_leads_by_priority(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada")
    await lead_briefs.capture(bus, site, "bob", email="bob@example.org")
    await lead_briefs.capture(bus, site, "cyd", email="cyd@example.net")
    await bus.publish(lead_briefs.completed(site, "ada", priority=4))
    await bus.publish(lead_briefs.completed(site, "bob", priority=9, stage="ready_to_buy"))
    code, out, _ = await arun(capsys, nats_url, "show", "--site", site)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:5] == ["LEAD", "EMAIL", "PRIORITY", "STAGE", "VERDICT"]
    assert [line.split()[0] for line in lines[1:]] == ["bob", "ada", "cyd"]
    assert lines[1].split()[1:6] == ["bob@example.org", "9", "ready_to_buy", "pass", "completed"]
    assert lines[3].split()[1:6] == ["cyd@example.net", "-", "-", "-", "none"]


async def test_generate_queues_each_lead_and_waits_for_the_outcomes(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada", turn=3)
    await lead_briefs.capture(bus, site, "bob")
    answers = {"ada": lambda item: lead_briefs.completed(site, "ada", request_id=item.request_id, priority=8),
               "bob": lambda item: lead_briefs.failed(site, "bob", request_id=item.request_id, reason="no model")}
    async with enricher(bus, site, answers) as taken:
        code, out, _ = await arun(capsys, nats_url, "generate", "--site", site, "--wait", "--timeout", "20")
    assert code == 1, out  # one of the two failed
    assert f"{site}/ada: brief ready: priority 8, evaluating, verdict pass" in out
    assert f"{site}/bob: failed (brief_writer): no model" in out
    by_session = {item.session_id: item for item in taken}
    assert set(by_session) == {"ada", "bob"} and by_session["ada"].turn == 3
    assert all(i.producer == "cli" and i.reason == "operator" for i in taken)
    assert all(f"queued {site}/{s} (request {by_session[s].request_id})" in out for s in ("ada", "bob"))

    async with enricher(bus, site, {"ada": lambda item: None}) as taken:  # queued, never answered
        code, out, err = await arun(capsys, nats_url, "generate", "--site", site, "--lead", "ada")
        assert code == 0 and "queued" in out
        await wait_for(lambda: taken, what="the one item taken")
    assert [i.session_id for i in taken] == ["ada"]
    async with enricher(bus, site, {"ada": lambda item: None}):
        code, _, err = await arun(capsys, nats_url, "generate", "--site", site, "--lead", "ada", "--wait",
                                  "--timeout", "0.5")
    assert code == 1 and "no outcome within 0.5 s for: ada" in err


async def test_bad_input_exits_2_and_queues_nothing(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada")
    for argv in (["generate", "--site", site, "--lead", "zed"], ["generate", "--site", site, "--lead", "a.b"],
                 ["generate", "--site", "no site"], ["show", "--site", site, "--lead", "zed"],
                 ["triage", "--site", "a>b"]):
        code, _, err = await arun(capsys, nats_url, *argv)
        assert code == 2 and err, argv
    info = await bus.js.stream_info(subjects.BRIEFS_STREAM, subjects_filter=f"briefs.{site}.>")
    assert not info.state.subjects


async def test_triage_ranks_the_open_leads_with_their_reasons(bus, nats_url, site, capsys):
    await lead_briefs.capture(bus, site, "ada")
    await lead_briefs.capture(bus, site, "bob", email="bob@example.org")
    code, _, err = await arun(capsys, nats_url, "triage", "--site", site)
    assert code == 1 and "no open leads" in err
    await bus.publish(lead_briefs.completed(site, "ada", priority=3))
    await bus.publish(lead_briefs.completed(site, "bob", priority=9))

    def rank(item):
        return lead_briefs.triage(site, item.request_id, ("ada", "disqualify", "a student project"),
                                  ("bob", "call_first", "ready to buy, 25 seats"))

    async with enricher(bus, site, {ev.TRIAGE_SESSION: rank}) as taken:
        code, out, _ = await arun(capsys, nats_url, "triage", "--site", site, "--timeout", "20")
    assert code == 0 and len(taken) == 1 and taken[0].request_id in out
    body = out[out.index("# Triage"):]
    assert body.index("CALL FIRST") < body.index("1. bob (bob@example.org, priority 9): ready to buy, 25 seats") \
        < body.index("DISQUALIFY") < body.index("2. ada (ada@example.com, priority 3): a student project")


def test_a_triage_the_rule_ranked_says_why_the_models_was_not_used():
    done = msgspec.structs.replace(lead_briefs.triage("demo", "r1", ("ada", "nurture", "priority 3")),
                                   model_error="the model's triage is not valid: lead ada is not classified")
    text = cli.triage_text(done, {}, {})
    assert "(ranked by each brief's metadata: the model's triage is not valid: lead ada is not classified)" in text
    assert "1. ada: priority 3" in text
