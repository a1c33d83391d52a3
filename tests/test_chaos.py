"""`concierge chaos`: the corrupted-log and handoff checks on hand-built logs (no server), and
the bounded run (a responder SIGKILLed mid-answer, the nats-server restarted, a frozen
responder redelivered, stored events published again, a gateway SIGKILLed as an operator
writes to it, under load on two replicas of everything, handoffs going on all along):
nothing lost, nothing hung, no log corrupted, no lead sent twice, every turn ended, every
operator and visitor message stored once and shown once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cli.harness.supervisor import ROOT
from cli.harness.visitor import Turn, Visitor
from cli.measure.rehearsal.chaos import Scenario, conversations, corruption, turn_owner
from cli.measure.rehearsal.handoffs import (
    Sent,
    Talk,
    ai_answers_in_handoffs,
    handoff_states,
    live_frames,
    operator_messages,
    visitor_messages,
)
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


# --- the handoff checks (cli/measure/rehearsal/handoffs.py) ---------------------------------

def routed(turn, branch):
    route = "HANDOFF" if branch in ("VISITOR_ASKED", "HELD") else "ANSWER"
    return ev.RouteDecided(**envelope(turn), route=route, branch=branch, reason="…")


def reply(turn, text, node="handoff_handler"):
    return ev.ResponseCompleted(**envelope(turn), node=node, text=text, token_count=len(text.split()))


def written(turn, text):
    return ev.OperatorMessage(**envelope(turn), operator="Ada", text=text)


def a_handoff(outcome="released"):
    """Turn 1 asks for a person, the operator joins and writes, turn 2 is held, the handoff
    ends, turn 3 is answered by the AI again."""
    return [requested(1), routed(1, "VISITOR_ASKED"), ev.HandoffRequested(**envelope(1), reason="visitor_asked"),
            reply(1, "Connecting you with the team."), completed(1),
            ev.OperatorJoined(**envelope(1), operator="Ada"), written(1, "Hi, Ada here."),
            requested(2), routed(2, "HELD"), reply(2, ""), completed(2), written(2, "Let me check."),
            ev.OperatorLeft(**envelope(2), operator="Ada"), ev.HandoffEnded(**envelope(2), by="Ada", outcome=outcome),
            requested(3), routed(3, "DEFAULT"), reply(3, "From 29 EUR.", "answer_writer"), completed(3)]


def shown(turn, route, outcome="complete"):
    return Turn(0, "…", outcome=outcome, turn=turn, route=route, message_id=f"m{turn}")


def test_a_clean_handoff_passes_every_check():
    log = log_of(*a_handoff())
    sent = [Sent("a", "Hi, Ada here.", status=201), Sent("b", "Let me check.", status=201)]
    assert operator_messages(log, sent) == ([], [])
    assert ai_answers_in_handoffs(log) == []
    frames = [(r.seq, {"type": ev.event_type(r.event)}) for r in log if ev.event_type(r.event) in ev.HANDOFF_EVENTS]
    assert live_frames(log, frames) == ([], [])
    talk = Talk(Visitor(0, SESSION), ends=["released"], held=[shown(2, "HANDOFF")], afters=[shown(3, "ANSWER")])
    assert handoff_states(log, talk) == []
    assert corruption(log) == []


def test_an_operator_message_lost_or_stored_twice_is_found():
    first, twice = written(1, "one"), written(1, "two")
    log = log_of(requested(1), completed(1), first, twice, ev.OperatorMessage(**{
        **envelope(1), "operator": "Ada", "text": "two"}))
    sent = [Sent("a", "one", status=201), Sent("b", "two", status=201), Sent("c", "three", status=201),
            Sent("d", "never answered", status=None), Sent("e", "refused", status=409)]
    # "three" was acknowledged and is not there; the ones never acknowledged may be missing.
    assert operator_messages(log, sent) == (["three"], ["'two' stored 2 times"])


def test_a_visitor_message_lost_or_stored_as_two_turns_is_found():
    log = log_of(requested(1, client_message_id="m1"), completed(1), requested(2, client_message_id="m1"),
                 completed(2), blocked(3))
    turns = [shown(1, "ANSWER"), shown(4, "ANSWER"),  # turn 4's message was named by the gateway, never stored
             Turn(0, "…", outcome="refused", message_id="m9")]  # never accepted: nothing to find
    assert visitor_messages(log, turns) == (["turn 4 (m4)"], ["m1 stored as 2 turns"])


def test_an_ai_answer_in_a_handoff_turn_is_found():
    # A HELD turn given text (even by the handoff handler), and an AI answer beside the waiting message.
    log = [reply(2, "Here is what the AI thinks.") if isinstance(e, ev.ResponseCompleted) and e.turn == 2 else e
           for e in a_handoff()]
    log.insert(4, reply(1, "Our plans start at 29 EUR.", "answer_writer"))
    problems = ai_answers_in_handoffs(log_of(*log))
    assert [p.split(" (seq")[0] for p in problems] == [
        "turn 1 routed HANDOFF/VISITOR_ASKED: answer_writer answered",
        "turn 2 routed HANDOFF/HELD: handoff_handler answered"]


def test_a_live_frame_missed_or_shown_twice_is_found():
    log = log_of(*a_handoff())
    seqs = [r.seq for r in log if ev.event_type(r.event) in ev.HANDOFF_EVENTS]
    # Reconnected after the first message with a Last-Event-ID that was ignored, and the end never shown.
    frames = [(seq, {}) for seq in seqs[:2] + seqs[1:-1]]
    missed, doubled = live_frames(log, frames)
    assert missed == [f"seq {seqs[-1]} handoff_ended"] and doubled == [f"seq {seqs[1]} 2 times"]


def test_a_handoff_that_did_not_end_as_the_operator_ended_it_is_found():
    talk = Talk(Visitor(0, SESSION), ends=["closed"], held=[shown(2, "ANSWER")], afters=[shown(3, "HANDOFF")])
    problems = handoff_states(log_of(*a_handoff("released")), talk)
    assert problems == ["handoffs ended ['released'] in the log, by the operator ['closed']",
                        "turn 2 written while held ended ANSWER", "turn 3 after the handoff ended: HANDOFF, answered"]
    # Left held: the operator's release never got to the log, and the question after it got no AI answer.
    held = a_handoff()[:12]
    talk = Talk(Visitor(0, SESSION), ends=["released"], afters=[shown(3, "ANSWER")])
    assert handoff_states(log_of(*held, requested(3), completed(3)), talk) == [
        "handoffs ended [] in the log, by the operator ['released']", "the last handoff left held",
        "turn 3 after the handoff ended: ANSWER, no AI answer"]


@pytest.mark.timeout(240)
def test_bounded_chaos_loses_nothing_corrupts_nothing_and_hangs_nothing():
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cli", "chaos", "--bounded"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=230)
    assert out.stdout.strip(), out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    report = f"{out.stdout[-3000:]}\n{out.stderr[-1500:]}"
    scenarios = figures["scenarios"]
    assert list(scenarios) == ["kill-responder", "nats-restart", "duplicates", "handoff"], report
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
    assert figures["visitor_messages"] > 0, report
    assert figures["visitor_messages_lost"] == figures["visitor_messages_doubled"] == 0, report
    # The gateway died as an operator wrote to it; every message answered 2xx is stored once,
    # those sent again after their 2xx included, and every live channel showed each once.
    assert scenarios["handoff"]["recovery_s"] is not None, report
    handoffs = figures["handoffs"]
    assert handoffs["handoffs"] >= 2 and handoffs["released"] >= 1 and handoffs["closed"] >= 1, report
    assert handoffs["operator_messages"] > 0 and handoffs["sent_again"] > 0, report
    assert handoffs["operator_messages_in_log"] >= handoffs["operator_messages"], report
    assert handoffs["operator_messages_lost"] == handoffs["operator_messages_doubled"] == 0, report
    assert handoffs["ai_answers_in_handoff_turns"] == 0 and handoffs["held_turns"] > 0, report
    assert handoffs["live_resumed"] > 0 and handoffs["live_missed"] == handoffs["live_doubled"] == 0, report
    assert handoffs["wrong_states"] == handoffs["operator_refused"] == 0, report
    assert figures["unmet"] == [], report
    assert time.monotonic() - started < 200, report
