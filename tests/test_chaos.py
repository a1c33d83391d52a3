"""`concierge chaos`: the corrupted-log check on hand-built logs (no server), and the bounded
run (a responder SIGKILLed mid-answer, the nats-server restarted, a frozen responder
redelivered and stored events published again, under load on two replicas of everything):
nothing lost, nothing hung, no log corrupted, no lead sent twice, every turn ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cli.harness.supervisor import ROOT
from cli.harness.visitor import Turn
from cli.measure.rehearsal.chaos import Scenario, conversations, corruption, turn_owner
from shared import events as ev
from shared import subjects
from shared.state import Record

SITE, SESSION = "chaos", "s1"


def log_of(*events: ev.Envelope) -> list[Record]:
    """The records of `events` as stored, in this order."""
    return [Record(seq=i, subject=subjects.conv(e.site, e.session_id, ev.event_type(e)), event=e)
            for i, e in enumerate(events, start=1)]


def envelope(turn: int, session: str = SESSION) -> dict:
    return {"event_id": ev.new_id(), "site": SITE, "session_id": session, "turn": turn, "ts": ev.now()}


def requested(turn, **over):
    return ev.TurnRequested(**{**envelope(turn), "message": f"question {turn}", **over})


def answered(turn):
    return ev.ResponseCompleted(**envelope(turn), node="answer_writer", text=f"answer {turn}", token_count=2)


def completed(turn):
    return ev.TurnCompleted(**envelope(turn))


def failed(turn):
    return ev.TurnFailed(**envelope(turn), node="gateway", reason="deadline", attempts=1)


def blocked(turn):
    return ev.TurnBlocked(**envelope(turn), reason="spam", reply="…", message_chars=3)


def a_turn(turn):
    return [requested(turn), answered(turn), completed(turn)]


def test_a_clean_log_passes():
    # Answered, blocked, failed at the deadline with its answer stored late, answered again.
    log = [*a_turn(1), blocked(2), requested(3), failed(3), answered(3), *a_turn(4)]
    assert corruption(log_of(*log)) == []


def test_an_event_stored_twice_is_found():
    first, answer, done = a_turn(1)
    assert corruption(log_of(first, answer, answer, done)) == [f"event {answer.event_id} stored 2 times"]


def test_a_turn_completed_twice_is_found():
    assert "turn 1: 2 TurnCompleted" in corruption(log_of(*a_turn(1), completed(1)))


def test_a_turn_requested_twice_is_found():
    problems = corruption(log_of(requested(1), requested(1), answered(1), completed(1)))
    assert "turn 1 requested again (seq 2)" in problems


def test_a_turn_started_before_the_last_ended_is_found():
    problems = corruption(log_of(requested(1), answered(1), requested(2), completed(1), answered(2), completed(2)))
    assert problems == ["turn 2 started (seq 3) before turn 1 ended"]
    assert corruption(log_of(requested(1), blocked(2), completed(1))) == ["turn 2 started (seq 2) before turn 1 ended"]


def test_a_history_out_of_turn_order_is_found():
    problems = corruption(log_of(requested(2), requested(1), answered(1), completed(1)))
    assert "history: user message of turn 1 after user message of turn 2" in problems


def test_conversations_keep_each_log_in_stream_order():
    one, other = requested(1), requested(1, session_id="s2")
    records = log_of(one, other, answered(1), completed(1))
    assert [[r.seq for r in rs] for rs in conversations(records).values()] == [[1, 3, 4], [2]]


def test_a_turn_counts_for_the_last_fault_before_it_ended_for_its_visitor():
    scenarios = [Scenario("kill-gateway", fault_at=10.0), Scenario("nats-restart", fault_at=20.0)]

    def sent(at, seconds, outcome="complete"):
        return Turn(0, "hi", outcome=outcome, started=at, seconds=seconds)

    assert turn_owner(scenarios, sent(1.0, 2.0)) == "kill-gateway"  # before any fault: the first
    assert turn_owner(scenarios, sent(9.0, 2.0)) == "kill-gateway"  # under way through it
    assert turn_owner(scenarios, sent(12.0, 2.0)) == "kill-gateway"  # sent after it, ended before the next
    assert turn_owner(scenarios, sent(19.0, 3.0, "error")) == "nats-restart"  # through the second
    # Cut at the gateway's death, then 30 s of resumes that never got through.
    assert turn_owner(scenarios, sent(9.5, 35.0, "cut")) == "kill-gateway"
    # Resumed after the gateway's death: it ended when the resumed stream did.
    assert turn_owner(scenarios, sent(19.5, 3.0)) == "nats-restart"


@pytest.mark.timeout(240)
def test_bounded_chaos_loses_nothing_corrupts_nothing_and_hangs_nothing():
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cli", "chaos", "--bounded"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=230)
    assert out.stdout.strip(), out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    report = f"{out.stdout[-3000:]}\n{out.stderr[-1500:]}"
    scenarios = figures["scenarios"]
    assert list(scenarios) == ["kill-responder", "nats-restart", "duplicates"], report
    assert scenarios["kill-responder"]["recovery_s"] is not None and scenarios["nats-restart"]["readyz_s"] is not None
    assert figures["lost_events"] == 0, report
    assert figures["hung"] == 0, report
    assert figures["corrupted_logs"] == 0, report
    assert figures["duplicate_side_effects"] == 0, report
    assert scenarios["duplicates"]["republished"] > 0 and scenarios["duplicates"]["stored_again"] == 0, report
    # Every turn ended, for the visitor and in the log; and the system did answer under the faults.
    assert figures["turns"] == figures["completed"] + figures["errors_shown"], report
    assert figures["turns_in_log"] == figures["ended_in_log"], report
    assert figures["completed"] > 0, report
    assert figures["leads"] >= 1 and figures["webhooks_recorded"] == figures["leads"], report
    assert time.monotonic() - started < 200, report
