"""Lead briefs: gathering, the no-model brief, the model's passes (section repair, metadata
fallback, numeric audit, evaluator retry, call script) and the triage; the model is the
scripted OpenAI-compatible server, its replies queued per request (`fail_next(reply=...)`)."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import REGISTRY

from services.enricher import brief_gatherer, brief_requester, lead_briefer, lead_triager
from services.enricher.briefs import plain, triage, writer
from services.enricher.briefs.document import REQUIRED_SECTIONS, missing_sections, ungrounded_numbers
from shared import events as ev
from shared import subjects
from shared.config import LLMRoleConfig
from shared.llm import LLMClient
from shared.node import Inputs
from shared.privacy import REDACTED
from tests.helpers import briefs_queue_empty, decide, start, state_of, turn, wait_for

SITE, SESSION = "acme", "lead1"


def doc(n: int, title: str, content: str, kind: str = "chunk") -> ev.RetrievedDocument:
    return ev.RetrievedDocument(n=n, document_type=kind, title=title, source=f"https://acme.example/{title.lower()}",
                                snippet=content[:40], content=content)


def conversation() -> list[ev.Envelope]:
    first = turn(SITE, SESSION, 1, "Do you integrate with QuickBooks? We have 40 technicians.")
    second = turn(SITE, SESSION, 2, "How much is it per technician? We want a demo.")

    def then(cause, cls, **fields):
        return ev.follow(cause, cls, "test", **fields)

    return [
        first,
        then(first, ev.RetrievalCompleted, documents=[doc(1, "Integrations", "QuickBooks Online and Xero sync every 10 minutes."),
                                                      doc(2, "Tidewise", "An entity", kind="entity")]),
        then(first, ev.InterestSignalsDetected, signals={"team_size": True, "competitor_mentioned": True}, score=0.2),
        second,
        then(second, ev.RetrievalCompleted, documents=[doc(1, "Pricing", "Pro is $39 per technician per month."),
                                                       doc(2, "Integrations", "QuickBooks Online and Xero sync every 10 minutes.")]),
        then(second, ev.InterestSignalsDetected, signals={"team_size": True, "pricing_interest": True,
                                                          "demo_interest": True, "competitor_mentioned": False},
             score=0.75),
        then(second, ev.FormFieldsExtracted, values={"company": "Northwind Plumbing", "team_size": "11-50"}),
        then(second, ev.LeadCaptured, email="dana@northwind.example"),
        turn(SITE, SESSION, 3, "dana@northwind.example"),  # the booking form's answer
    ]


def lead(events) -> ev.LeadCaptured:
    return next(e for e in events if isinstance(e, ev.LeadCaptured))


def completed(session: str, priority: int, stage: str, ts: float = 1.0, seats: int = 0) -> ev.BriefCompleted:
    return ev.BriefCompleted(event_id=ev.new_id(), site=SITE, session_id=session, turn=1, ts=ts, brief="## Executive summary\nx",
                             metadata=ev.BriefMetadata(priority=priority, stage=stage, estimated_seats=seats, confidence=50),
                             call_script="## Talk track", summary=f"{session}@x.example: priority {priority}, {stage}")


def inputs() -> ev.BriefInputs:
    events = conversation()
    return brief_gatherer.gathered(state_of(*events), lead(events), "Acme", *logged(events),
                                   [completed("other", 8, "evaluating")])


def logged(events) -> tuple[list[ev.RetrievalCompleted], list[ev.InterestSignalsDetected]]:
    """What the gatherer reads of the lead's log besides its state."""
    return ([e for e in events if isinstance(e, ev.RetrievalCompleted)],
            [e for e in events if isinstance(e, ev.InterestSignalsDetected)])


# --- gathering ---------------------------------------------------------------------------


def test_gathering_collects_the_conversation_signals_fields_and_each_source_once():
    data = inputs()
    assert data.email == "dana@northwind.example" and data.site_name == "Acme"
    assert [m.content for m in data.transcript if m.role == "user"][0].startswith("Do you integrate with QuickBooks")
    assert [(s.number, s.title) for s in data.sources] == [(1, "Integrations"), (2, "Pricing")], "chunks only, once"
    assert data.interest_signals["demo_interest"] and data.interest_score == 0.75
    assert data.interest_signals["competitor_mentioned"], "a signal any turn showed, not only the last turn's"
    assert data.form_fields == {"company": "Northwind Plumbing", "team_size": "11-50"}
    assert [s.session_id for s in data.similar_leads] == ["other"]


def test_similar_leads_leave_out_the_lead_itself():
    events = conversation()
    earlier = [completed(SESSION, 3, "exploring"), completed("b", 9, "ready_to_buy", ts=2.0)]
    data = brief_gatherer.gathered(state_of(*events), lead(events), "Acme", *logged(events), earlier)
    assert [(s.session_id, s.priority) for s in data.similar_leads] == [("b", 9)]


# --- without a model ---------------------------------------------------------------------


def test_the_data_brief_has_every_section_is_labelled_and_invents_no_number():
    data = inputs()
    text, meta = plain.brief(data)
    assert missing_sections(text) == []
    assert "without a language model" in text
    assert ungrounded_numbers(text, data) == []
    assert "QuickBooks" in text and "[1] Integrations" in text and "(Northwind Plumbing)" in text
    assert 'Asked: "dana@northwind.example"' not in text, "a form answer is not a question"
    assert meta == ev.BriefMetadata(priority=8, stage="ready_to_buy", estimated_seats=11, confidence=30)
    script = plain.call_script(data)
    assert all(f"## {name}" in script for name in ("Talk track", "Objection handlers", "Close"))


def test_the_data_brief_of_a_lead_who_said_nothing_still_has_every_section():
    data = ev.BriefInputs(email="x@y.example")
    text, meta = plain.brief(data)
    assert missing_sections(text) == [] and meta.stage == "exploring" and meta.priority == 1
    assert "No message from the visitor" in text


def counted(outcome: str, backend: str) -> float:
    return REGISTRY.get_sample_value("concierge_briefs_total", {"outcome": outcome, "backend": backend}) or 0.0


async def test_the_data_backend_completes_a_brief_without_any_call():
    before = counted("generated", "data")
    data = inputs()
    gathered = ev.BriefGathered(event_id="g1", site=SITE, session_id=SESSION, turn=2, ts=1.0, request_id="r1",
                                inputs=data)
    out = await decide(lead_briefer.make_node(None), gathered)
    [done] = out.events
    assert isinstance(done, ev.BriefCompleted) and done.backend == "data" and done.request_id == "r1"
    assert missing_sections(done.brief) == [] and "## Close" in done.call_script
    assert done.summary.startswith("Northwind Plumbing: priority 8, ready_to_buy") and "@" not in done.summary
    assert out.emitted == []
    assert counted("generated", "data") == before + 1


# --- with a model -----------------------------------------------------------------------


def client(llm) -> LLMClient:
    return LLMClient({"briefs": LLMRoleConfig(role="briefs", base_url=llm.base_url, api_key="k", model="m",
                                              max_retries=0)})


def brief_text(*leave_out: str, metadata: str = '{"priority": 8, "stage": "ready_to_buy", "estimated_seats": 40, '
                                              '"confidence": 70}', extra: str = "") -> str:
    body = "\n\n".join(f"## {name}\nAbout {name.lower()}: 40 technicians asked about QuickBooks [1]. {extra}"
                       for name in REQUIRED_SECTIONS if name not in leave_out)
    return f"{body}\n\nMETADATA: {metadata}"


def replies(*texts: str) -> list[dict]:
    return [{"reply": text} for text in texts]


@pytest.fixture
def briefs_llm(llm):
    llm.clear()
    yield llm
    llm.clear()


async def test_missing_sections_are_re_asked_alone_and_bad_metadata_extracted(briefs_llm):
    sections = "## Risks\nA competitor.\n\n## Key question\nWhen do they switch?"
    briefs_llm.fail_next(*replies(brief_text("Risks", "Key question", metadata='{"priority": 12, "stage": "ready_to_buy",'
                                                                                ' "estimated_seats": 40, "confidence": 70}',
                                             extra="A 15% discount was promised."),
                                  sections,
                                  '{"priority": 7, "stage": "evaluating", "estimated_seats": 40, "confidence": 60}'))
    calls = []

    async def record(call):
        calls.append(call)

    draft = await writer.draft(client(briefs_llm), inputs(), record)
    assert draft.repaired_sections == ["Risks", "Key question"] and draft.missing_sections == []
    assert missing_sections(draft.text) == [] and draft.text.index("## Risks") < draft.text.index("## Key question")
    assert draft.metadata == ev.BriefMetadata(priority=7, stage="evaluating", estimated_seats=40, confidence=60)
    assert draft.metadata_method == "structured" and "priority" in draft.metadata_error
    assert draft.ungrounded_numbers == ["15%"], "40 is in the conversation, 15% in no input"
    sent = briefs_llm.requests()
    assert "Write only these sections: Risks, Key question." in sent[1]["messages"][-1]["content"]
    assert sent[2]["response_format"]["type"] == "json_schema"
    assert len(calls) == 3 and all(c.role == "briefs" for c in calls)


async def test_a_failed_review_is_written_again_with_its_issues_then_the_call_script(briefs_llm):
    gathered = ev.BriefGathered(event_id="g2", site=SITE, session_id=SESSION, turn=2, ts=1.0, request_id="r2",
                                inputs=inputs())
    briefs_llm.fail_next(*replies(brief_text(), '{"verdict": "fail", "issues": ["priority not justified"]}',
                                  brief_text(extra="Rewritten."), '{"verdict": "pass", "issues": []}',
                                  "## Talk track\nHi.\n\n## Objection handlers\nNone.\n\n## Close\nA demo."))
    retried = counted("retried", "llm")
    out = await decide(lead_briefer.make_node(client(briefs_llm)), gathered)
    [done] = out.events
    assert counted("retried", "llm") == retried + 1
    assert isinstance(done, ev.BriefCompleted) and done.backend == "llm"
    assert done.attempts == 2 and done.verdict == "pass" and "Rewritten." in done.brief
    assert done.call_script.startswith("## Talk track")
    steps = [(type(e).__name__, getattr(e, "attempt", None)) for e in out.emitted if not isinstance(e, ev.LLMCallRecorded)]
    assert steps == [("BriefDrafted", 1), ("BriefEvaluated", 1), ("BriefDrafted", 2), ("BriefEvaluated", 2)]
    assert sum(isinstance(e, ev.LLMCallRecorded) for e in out.emitted) == 5
    retry = briefs_llm.requests()[2]["messages"][-1]["content"]
    assert "Reviewer feedback:" in retry and "- priority not justified" in retry


async def test_metadata_that_never_validates_fails_the_brief_instead_of_defaulting(briefs_llm):
    gathered = ev.BriefGathered(event_id="g3", site=SITE, session_id=SESSION, turn=2, ts=1.0, request_id="r3",
                                inputs=inputs())
    briefs_llm.fail_next(*replies(brief_text(metadata="none"), '{"priority": 0}', '{"priority": 0}'))
    failed_before = counted("failed", "llm")
    out = await decide(lead_briefer.make_node(client(briefs_llm)), gathered)
    assert counted("failed", "llm") == failed_before + 1
    [failed] = out.events
    assert isinstance(failed, ev.BriefFailed) and "metadata is not valid" in failed.reason
    assert failed.request_id == "r3"
    [drafted] = [e for e in out.emitted if isinstance(e, ev.BriefDrafted)]
    assert drafted.metadata is None and drafted.metadata_method == "none"


# --- triage -------------------------------------------------------------------------------


def test_triage_by_rule_follows_the_metadata():
    items = [triage.by_rule(b) for b in (completed("a", 8, "evaluating", seats=40), completed("b", 3, "exploring"),
                                         completed("c", 9, "support_only"))]
    assert [(i.session_id, i.classification) for i in items] == [("a", "call_first"), ("b", "nurture"),
                                                                ("c", "disqualify")]
    assert "about 40 seats" in items[0].reason


def test_triage_problems_name_missing_unknown_and_repeated_leads():
    reply = triage.TriageReply(items=[ev.TriageItem(session_id="a", classification="nurture", reason="x"),
                                      ev.TriageItem(session_id="a", classification="nurture", reason="x"),
                                      ev.TriageItem(session_id="z", classification="nurture", reason=" ")])
    assert triage.problems(reply, ["a", "b"]) == ["lead b is not classified", "z is not one of the leads",
                                                   "lead a is classified more than once", "lead z has no reason"]


def triage_request() -> ev.TriageRequested:
    return ev.TriageRequested(event_id=ev.new_id(), site=SITE, session_id=ev.TRIAGE_SESSION, turn=0, ts=1.0,
                              request_id="t1")


def captured(session: str, email: str | None = None) -> ev.LeadCaptured:
    return ev.LeadCaptured(event_id=ev.new_id(), site=SITE, session_id=session, turn=1, ts=0.5,
                           email=email or f"{session}@x.example")


async def triage_with(llm_client, *briefs, erased=()):
    leads = {b.session_id: captured(b.session_id, REDACTED if b.session_id in erased else None) for b in briefs}
    decision = await decide(lead_triager.make_node(llm_client), triage_request(), *leads.values(), *briefs)
    return decision.events, decision.emitted


async def test_an_incomplete_triage_is_repaired_once_then_accepted(briefs_llm):
    briefs_llm.fail_next(*replies(
        '{"items": [{"session_id": "a", "classification": "call_first", "reason": "ready"}]}',
        '{"items": [{"session_id": "a", "classification": "call_first", "reason": "ready"},'
        ' {"session_id": "b", "classification": "disqualify", "reason": "support"}]}'))
    [done], emitted = await triage_with(client(briefs_llm), completed("a", 8, "ready_to_buy"),
                                        completed("b", 2, "support_only"))
    assert isinstance(done, ev.TriageCompleted) and done.leads == 2 and done.backend == "llm"
    assert [(i.session_id, i.classification) for i in done.items] == [("a", "call_first"), ("b", "disqualify")]
    assert "lead b is not classified" in briefs_llm.requests()[1]["messages"][-1]["content"]
    assert len(emitted) == 2, "both calls recorded"


async def test_a_triage_wrong_twice_is_ranked_by_rule_and_says_why(briefs_llm):
    wrong = '{"items": [{"session_id": "a", "classification": "nurture", "reason": "ready"}]}'
    briefs_llm.fail_next(*replies(wrong, wrong))
    [done], emitted = await triage_with(client(briefs_llm), completed("a", 8, "ready_to_buy"),
                                        completed("b", 2, "support_only"))
    assert done.backend == "data" and "lead b is not classified" in done.model_error
    assert [(i.session_id, i.classification) for i in done.items] == [("a", "call_first"), ("b", "disqualify")]
    assert len(emitted) == 2, "both model calls recorded"


async def test_triage_without_a_model_ranks_each_leads_latest_brief_by_rule_and_forgets_erased_leads():
    [done], _ = await triage_with(None, completed("a", 2, "exploring"), completed("a", 8, "ready_to_buy", ts=0.5),
                                  completed("gone", 9, "ready_to_buy"), erased=("gone",))
    assert done.backend == "data" and done.leads == 1 and done.items[0].classification == "call_first"


async def test_a_model_that_does_not_answer_leaves_the_triage_to_the_rule(briefs_llm):
    briefs_llm.fail_next({"status": 400})
    [done], _ = await triage_with(client(briefs_llm), completed("a", 8, "ready_to_buy"))
    assert done.backend == "data" and "400" in done.model_error and done.items[0].classification == "call_first"


# --- on the bus ----------------------------------------------------------------------------


async def test_a_captured_lead_becomes_a_brief_and_the_site_a_triage_on_a_real_jetstream(work_bus):
    """The four nodes on a real JetStream, without a model: LeadCaptured → a work item →
    BriefGathered → BriefCompleted in the lead's log; a TriageRequested → TriageCompleted."""
    nodes = [brief_requester.make_node(), brief_gatherer.make_node(), lead_briefer.make_node(None),
             lead_triager.make_node(None)]
    runners = [await start(work_bus, node) for node in nodes]
    try:
        events = conversation()
        for event in events:
            await work_bus.publish(event)
        [record] = await wait_for(lambda: work_bus.read(subjects.conv(SITE, SESSION, "brief_completed")),
                                  timeout=20, what="a completed brief")
        done = record.event
        assert done.backend == "data" and missing_sections(done.brief) == []
        assert done.metadata.stage == "ready_to_buy" and done.request_id == lead(events).event_id
        [gathered] = [r.event for r in await work_bus.read(subjects.conv(SITE, SESSION, "brief_gathered"))]
        assert gathered.inputs.email == "dana@northwind.example" and len(gathered.inputs.sources) == 2
        await work_bus.publish_work(triage_request())
        [ranked] = await wait_for(lambda: work_bus.read(subjects.conv(SITE, ev.TRIAGE_SESSION, "triage_completed")),
                                  timeout=20, what="a triage")
        assert [(i.session_id, i.classification) for i in ranked.event.items] == [(SESSION, "call_first")]
        info = await work_bus.js.consumer_info(subjects.BRIEFS_STREAM, "lead_triager")
        assert info.config.max_ack_pending == 1
        # a work item is acked after its handler's outputs are stored: wait for the acks
        await wait_for(lambda: briefs_queue_empty(work_bus), what="work items acked")
    finally:
        for runner in runners:
            await runner.stop()


async def test_a_brief_asked_for_a_conversation_without_a_lead_fails_visibly(work_bus):
    runner = await start(work_bus, brief_gatherer.make_node())
    try:
        request = ev.BriefRequested(event_id=ev.new_id(), site=SITE, session_id="nolead", turn=1, ts=ev.now(),
                                    reason="operator", request_id="r9")
        await work_bus.publish(turn(SITE, "nolead", 1, "hello"))
        await work_bus.publish_work(request)
        [record] = await wait_for(lambda: work_bus.read(subjects.conv(SITE, "nolead", "brief_failed")),
                                  timeout=15, what="a BriefFailed")
        assert "no lead was captured" in record.event.reason and record.event.request_id == "r9"
    finally:
        await runner.stop()


def test_a_brief_is_asked_for_on_capture_and_again_when_a_booking_goes_on_after_it():
    events = conversation()
    capture = lead(events)
    later = turn(SITE, SESSION, 3, "Northwind Plumbing")
    done = ev.follow(later, ev.BookingProgressed, "booking_handler", collected={"company": "Northwind"}, done=True)
    same_turn = ev.follow(capture, ev.BookingProgressed, "booking_handler", collected={}, done=True)
    asking = ev.follow(later, ev.BookingProgressed, "booking_handler", pending_field="team_size")

    def why(event, *given):
        return brief_requester.wanted(event, Inputs(state=state_of(*given, event)))

    assert why(capture, *events) == "lead_captured"
    assert why(done, *events, later) == "booking_completed"
    assert why(same_turn, *events) is None, "the capture's own brief has it"
    assert why(msgspec.structs.replace(done, turn=1), *events[:3]) is None, "no lead: nobody to brief"
    assert not brief_requester.make_node().concerns(asking), "the booking goes on"
    assert why(msgspec.structs.replace(capture, email=REDACTED), *events) is None, "an erased lead"


async def test_a_rate_limited_call_is_retried_with_backoff_and_the_brief_completes(briefs_llm):
    patient = LLMClient({"briefs": LLMRoleConfig(role="briefs", base_url=briefs_llm.base_url, api_key="k", model="m",
                                                 max_retries=2, backoff_base_s=0.05)})
    briefs_llm.fail_next({"status": 429}, {"status": 503},
                         *replies(brief_text(), '{"verdict": "pass", "issues": []}', "## Talk track\nHi.\n\n"
                                  "## Objection handlers\nNone.\n\n## Close\nA demo."))
    gathered = ev.BriefGathered(event_id="g4", site=SITE, session_id=SESSION, turn=2, ts=1.0, request_id="r4",
                                inputs=inputs())
    out = await decide(lead_briefer.make_node(patient), gathered)
    [done] = out.events
    assert isinstance(done, ev.BriefCompleted) and done.verdict == "pass" and done.attempts == 1
    first = next(e for e in out.emitted if isinstance(e, ev.LLMCallRecorded))
    assert first.call.attempts == 3, "two refusals, then the brief"


async def test_a_log_stored_again_by_an_erase_writes_no_second_brief():
    """An erase stores a lead's log again (and other leads' logs that mention it): the nodes
    see its LeadCaptured and BriefGathered once more, and do nothing."""
    events = conversation()
    capture = lead(events)
    gathered = ev.follow(capture, ev.BriefGathered, brief_gatherer.NAME, request_id=capture.event_id, inputs=inputs())
    done = ev.follow(gathered, ev.BriefCompleted, lead_briefer.NAME, request_id=capture.event_id, brief="x",
                     metadata=ev.BriefMetadata(priority=1, stage="exploring", estimated_seats=0, confidence=1),
                     call_script="x", summary="x")
    again = await decide(brief_requester.make_node(), capture, *[e for e in events if e is not capture], gathered, done)
    assert again.events == [] and again.emitted == []
    assert (await decide(lead_briefer.make_node(None), gathered, *events, done)).events == []
    erased = msgspec.structs.replace(gathered, inputs=msgspec.structs.replace(gathered.inputs, email=REDACTED))
    assert (await decide(lead_briefer.make_node(None), erased)).events == []
    assert len((await decide(lead_briefer.make_node(None), gathered, *events)).events) == 1, "not yet written: written"
