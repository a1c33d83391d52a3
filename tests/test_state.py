"""Reducers and the fold: given these events, then this state."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import events as ev
from shared import subjects
from shared.events import VisitorProfile
from tests.helpers import state_of, turn
from shared.state import (
    Record, copy_state, decode_state, encode_state, fold, merge_dialog_supervision,
    merge_form_collection, merge_interest_signals, merge_visitor_profiles, DialogSupervisionState,
    FormCollectionState, InterestSignalsState,
)


def env(cls, turn, **fields):
    return cls(event_id=ev.new_id(), site="acme", session_id="s1", turn=turn, ts=1.0, **fields)


def records(*events):
    return [Record(seq=i + 1, subject=subjects.conv("acme", "s1", ev.event_type(e)), event=e) for i, e in enumerate(events)]


def test_visitor_profile_prefers_known_and_later_known_wins():
    old = VisitorProfile(company_name="Acme", sector="retail")
    new = VisitorProfile(company_name="unknown", sector="fintech", email="a@b.co")
    merged = merge_visitor_profiles(old, new)
    assert merged.company_name == "Acme"
    assert merged.sector == "fintech"
    assert merged.email == "a@b.co"
    assert merged.tier == "unknown"


def test_dialog_supervision_keeps_ever_flags_and_latest_turn():
    s = merge_dialog_supervision(DialogSupervisionState(), {"email_captured": True, "asked": True}, 1)
    s = merge_dialog_supervision(s, {"email_captured": False, "asked": False}, 2)
    assert s.ever == {"email_captured": True, "asked": True}
    assert s.latest == {"email_captured": False, "asked": False}
    assert s.latest_turn == 2


def test_interest_signals_replace_and_form_values_merge():
    i = merge_interest_signals(InterestSignalsState(), {"pricing": True}, 0.4, 1)
    i = merge_interest_signals(i, {"timeline": True}, 0.7, 2)
    assert i.signals == {"timeline": True} and i.score == 0.7
    f = merge_form_collection(FormCollectionState(), {"email": "a@b.co"}, 3)
    f = merge_form_collection(f, {"company": "Acme"}, 2)
    assert f.values == {"email": "a@b.co", "company": "Acme"} and f.max_turn == 3


def test_fold_builds_history_turns_and_counters():
    state = fold(records(
        env(ev.TurnRequested, 1, message="Hello"),
        env(ev.RouteDecided, 1, route="ANSWER", reason="r", intent="LEARN"),
        env(ev.ResponseCompleted, 1, node="answer_writer", text="Hi!", token_count=1),
        env(ev.TurnCompleted, 1, metadata={"route": "ANSWER"}),
        env(ev.TurnRequested, 2, message="hello "),
        env(ev.RouteDecided, 2, route="REDIRECT", reason="r", intent="HACK", hack_increment=1),
        env(ev.TurnFailed, 2, node="redirect_handler", reason="boom", attempts=4),
    ))
    assert [(m.role, m.content) for m in state.messages] == [("user", "Hello"), ("assistant", "Hi!"), ("user", "hello ")]
    assert state.turn == 2 and state.hack_count == 1 and state.spam_count == 1
    assert state.turns[1].status == "completed" and state.turns[2].status == "failed"
    assert state.turn_requested_seq == 5 and state.last_seq == 7


def test_a_second_response_for_a_turn_does_not_rewrite_history():
    state = fold(records(
        env(ev.TurnRequested, 1, message="Hello"),
        env(ev.ResponseCompleted, 1, node="answer_writer", text="first", token_count=1, attempt=1),
        env(ev.ResponseCompleted, 1, node="answer_writer", text="second", token_count=1, attempt=2),
    ))
    assert [m.content for m in state.messages] == ["Hello", "first"]


# --- properties ----------------------------------------------------------------------------

words = st.text(alphabet="abcdef xyz", min_size=0, max_size=12)
known = st.sampled_from(["unknown", "Acme", "Globex", "retail", ""])
profiles = st.builds(VisitorProfile, company_name=known, sector=known, email=known, tier=known)
flags = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.booleans(), max_size=3)


def event_strategy(turn: int):
    return st.one_of(
        st.builds(lambda m: env(ev.TurnRequested, turn, message=m), words),
        st.builds(lambda r, h: env(ev.RouteDecided, turn, route=r, reason="x", hack_increment=h),
                  st.sampled_from(["ANSWER", "REDIRECT", "BOOKING"]), st.integers(0, 1)),
        st.builds(lambda p: env(ev.EnrichmentCompleted, turn, profile=p), profiles),
        st.builds(lambda p: env(ev.ProfileInferred, turn, profile=p), profiles),
        st.builds(lambda f: env(ev.DialogStateExtracted, turn, flags=f), flags),
        st.builds(lambda s, x: env(ev.InterestSignalsDetected, turn, signals=s, score=x), flags,
                  st.floats(0, 1, allow_nan=False)),
        st.builds(lambda v: env(ev.FormFieldsExtracted, turn, values=v),
                  st.dictionaries(st.sampled_from(["email", "company"]), words, max_size=2)),
        st.builds(lambda t, a: env(ev.ResponseCompleted, turn, node="n", text=t, token_count=1, attempt=a),
                  words, st.integers(1, 3)),
        st.builds(lambda: env(ev.TurnCompleted, turn, metadata={"k": turn})),
        st.builds(lambda: env(ev.TurnFailed, turn, node="n", reason="r", attempts=2)),
        st.builds(lambda r: env(ev.TurnBlocked, turn, reason=r, reply="no", message_chars=3),
                  st.sampled_from(["hack", "spam"])),
        st.builds(lambda i, m: env(ev.IntentClassified, turn, intent=i, confidence=0.5, classifier="local",
                                   markers=m), st.sampled_from(["LEARN", "HACK"]), st.lists(words, max_size=2)),
        st.builds(lambda k: env(ev.SkillsSelected, turn, skills=k), st.lists(words, max_size=2)),
        st.builds(lambda k, q: env(ev.SkillsApplied, turn, skills=k, qualification_question=q),
                  st.lists(st.sampled_from(["propose_demo", "collect_email", "x"]), max_size=2),
                  st.one_of(st.none(), words)),
        st.builds(lambda f, c, d: env(ev.BookingProgressed, turn, pending_field=f, collected=c, done=d),
                  st.one_of(st.none(), words), st.dictionaries(st.sampled_from(["email", "phone"]), words,
                                                              max_size=2), st.booleans()),
        st.builds(lambda e: env(ev.LeadCaptured, turn, email=e), words),
        st.builds(lambda t: env(ev.RetrievalCompleted, turn, documents=[ev.RetrievedDocument(
            n=1, document_type="chunk", title=t, source="s", snippet=t, content=t)]), words),
    )


logs = st.lists(st.integers(1, 5).flatmap(event_strategy), max_size=40).map(lambda es: records(*es))


@settings(max_examples=200, deadline=None)
@given(log=logs, cut=st.integers(0, 40))
def test_snapshot_plus_tail_equals_full_fold(log, cut):
    cut = min(cut, len(log))
    snapshot = decode_state(encode_state(fold(log[:cut])))  # as stored in KV and read back
    assert fold(log[cut:], initial=snapshot) == fold(log)


@settings(max_examples=200, deadline=None)
@given(log=logs)
def test_fold_is_deterministic_and_pure(log):
    before = msgspec.json.encode(log)
    first, second = fold(log), fold(log)
    assert first == second
    assert encode_state(first) == encode_state(second)
    assert msgspec.json.encode(log) == before  # the events themselves were not touched


@settings(max_examples=100, deadline=None)
@given(log=logs)
def test_initial_state_is_not_mutated_by_fold(log):
    initial = fold(log[:3])
    kept = copy_state(initial)
    fold(log[3:], initial=initial)
    assert initial == kept


@settings(max_examples=200, deadline=None)
@given(log=logs, cut=st.integers(0, 40))
def test_folding_a_fork_leaves_the_original_as_it_was(log, cut):
    """A load hands the cache's state to handlers and folds new events into a fork of it
    (shared/store/cached.py): no event type may change the original through what they share."""
    original = fold(log[:cut])
    before = encode_state(original)
    forked = fold_into_fork(original, log[cut:])
    assert encode_state(original) == before
    assert forked == fold(log)


def fold_into_fork(state, records):
    from shared.state import apply, fork
    forked = fork(state)
    for record in records:
        apply(forked, record)
    return forked


def test_only_the_newest_turn_keeps_its_retrieved_text():
    from shared import events as ev
    from shared.state import Record, fold

    def retrieval(turn: int, n_docs: int) -> ev.RetrievalCompleted:
        docs = [ev.RetrievedDocument(n=i, document_type="chunk", title=f"t{i}", source="s", snippet="x", content="text")
                for i in range(1, n_docs + 1)]
        return ev.RetrievalCompleted(event_id=f"r{turn}", site="a", session_id="s", turn=turn, ts=0.0, documents=docs)

    state = fold([Record(seq=1, subject=subjects.conv("a", "s", "retrieval_completed"), event=retrieval(1, 3)),
                  Record(seq=2, subject=subjects.conv("a", "s", "retrieval_completed"), event=retrieval(1, 5))])
    assert len(state.turns[1].sources) == 3  # a redelivery does not replace what was stored
    state = fold([Record(seq=3, subject=subjects.conv("a", "s", "retrieval_completed"), event=retrieval(2, 2))], state)
    assert state.turns[1].sources == [] and len(state.turns[2].sources) == 2


def test_an_answer_stored_after_its_turn_ended_or_after_the_next_turn_began_stays_out_of_the_history():
    first = turn("s", "late", 1, "Do you integrate with Xero?")
    failed = ev.follow(first, ev.TurnFailed, "gateway", key="deadline", node="gateway", reason="deadline", attempts=0)
    late = ev.follow(first, ev.ResponseCompleted, "answer_writer", node="answer_writer", text="Yes [1]", token_count=2, attempt=1)
    second = turn("s", "late", 2, "And QuickBooks?")
    for log in ([first, failed, late, second], [first, second, late]):
        state = state_of(*log)
        assert [(m.role, m.turn) for m in state.messages] == [("user", 1), ("user", 2)]
    on_time = state_of(first, late)
    assert [(m.role, m.content) for m in on_time.messages] == [("user", first.message), ("assistant", "Yes [1]")]
