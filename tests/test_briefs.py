"""shared/briefs.py without a server: a site's leads, each lead's latest brief outcome, the
work items an operator queues, a triage in the order to act on it."""

from __future__ import annotations

from shared import briefs
from shared import events as ev
from tests import lead_briefs
from tests.helpers import records_of


def lead(session: str, email: str = "ada@example.com") -> ev.LeadCaptured:
    return ev.LeadCaptured(event_id=ev.new_id(), site="demo", session_id=session, turn=1, ts=ev.now(),
                           producer="test", email=email)


def test_a_lead_is_its_first_capture():
    first, again, other = lead("a"), lead("a", "ada@work.example"), lead("b")
    assert briefs.first_captures(records_of(first, again, other)) == {"a": first, "b": other}


def test_the_latest_outcome_is_the_newest_stored_whatever_the_read_order():
    done = lead_briefs.completed("demo", "a")
    retry_failed = lead_briefs.failed("demo", "a")
    only_failed = lead_briefs.failed("demo", "b")
    records = records_of(done, only_failed, retry_failed)
    assert briefs.latest_outcomes(reversed(records)) == {"a": retry_failed, "b": only_failed}
    assert briefs.latest_outcomes(records_of(retry_failed, done)) == {"a": done}


def test_work_items_are_the_operators_with_ids_derived_from_the_request():
    item = briefs.brief_request("demo", "a", 4, "cli")
    assert (item.site, item.session_id, item.turn, item.producer, item.reason) == ("demo", "a", 4, "cli", "operator")
    assert item.event_id == ev.derived_id(item.request_id, "briefs", "a")
    assert briefs.brief_request("demo", "a", 4, "cli").request_id != item.request_id
    triage = briefs.triage_request("demo", "gateway")
    assert (triage.session_id, triage.turn) == (ev.TRIAGE_SESSION, 0)
    assert triage.event_id == ev.derived_id(triage.request_id, "briefs", ev.TRIAGE_SESSION)


def test_a_triage_reads_call_first_then_nurture_then_disqualify():
    triage = lead_briefs.triage("demo", "r", ("c", "disqualify", "x"), ("a", "nurture", "y"),
                                ("b", "call_first", "z"), ("d", "nurture", "w"))
    assert [i.session_id for i in briefs.ranked(triage)] == ["b", "a", "d", "c"]


def test_a_row_says_where_the_latest_brief_stands():
    assert briefs.row(lead("a"), None)["status"] == "none"
    done = briefs.row(lead("a"), lead_briefs.completed("demo", "a", priority=8))
    assert (done["status"], done["priority"], done["verdict"], done["backend"]) == ("completed", 8, "pass", "llm")
    failed = briefs.row(lead("a"), lead_briefs.failed("demo", "a", reason="no metadata"))
    assert (failed["status"], failed["reason"]) == ("failed", "no metadata")
