"""Conversation state is the fold of the conversation's event log.

Pure functions only: `apply(state, record)` is the one transition, `fold(records)`
repeats it. The reducers are the original system's: visitor profiles prefer known
values over "unknown", dialog supervision keeps cumulative "ever" flags next to the
latest turn's flags, interest signals replace, form collection merges values and
keeps the highest turn seen.
"""

from __future__ import annotations

from typing import Any, Iterable

import msgspec

from shared import events as ev
from shared.events import UNKNOWN, VisitorProfile


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str
    turn: int


class DialogSupervisionState(msgspec.Struct, kw_only=True):
    ever: dict[str, bool] = {}
    latest: dict[str, bool] = {}
    latest_turn: int = 0


class InterestSignalsState(msgspec.Struct, kw_only=True):
    signals: dict[str, bool] = {}
    score: float = 0.0
    turn: int = 0


class FormCollectionState(msgspec.Struct, kw_only=True):
    values: dict[str, str] = {}
    max_turn: int = 0


class BookingState(msgspec.Struct, kw_only=True):
    """The in-chat booking flow: started by a BOOKING route, ended by STOP, EXIT or its
    last field (BookingProgressed.done). A captured lead stays captured."""

    active: bool = False
    started_turn: int = 0
    pending_field: str | None = None  # the field the bot asked for last
    collected: dict[str, str] = {}
    lead_captured: bool = False
    lead_turn: int = 0
    ended_turn: int = 0  # the turn whose booking step asked for nothing more (BookingProgressed.done)


class HandoffState(msgspec.Struct, kw_only=True):
    """A person of the site's team and the conversation: `waiting` for one (HandoffRequested),
    `held` by `operator` (OperatorJoined; the AI does not answer), back to "" once it ended
    (HandoffEnded). An operator who leaves without ending it leaves it waiting."""

    status: str = ""  # "" | waiting | held
    reason: str = ""
    requested_turn: int = 0
    requested_ts: float = 0.0
    operator: str = ""
    handoffs: int = 0  # handoffs requested in the conversation
    replied: bool = False  # an operator has written to the visitor since the request
    # Nobody could take the last handoff (HandoffEnded out_of_hours / no_answer) and the
    # visitor was asked for an e-mail address; set until a lead is captured.
    follow_up: bool = False


class TurnRecord(msgspec.Struct, kw_only=True):
    turn: int
    status: str = "requested"  # requested -> completed | failed; or blocked
    route: str | None = None
    branch: str | None = None
    intent: str | None = None
    intent_confidence: float | None = None
    intent_runner_up: str | None = None  # IntentClassified.runner_up: where an unsure HACK is routed
    intent_markers: list[str] = []  # IntentClassified.markers: injection markers and cues found
    skills_selected: list[str] | None = None
    skills: list[str] | None = None  # as applied
    qualification_question: str | None = None
    response_attempt: int | None = None
    fallback_used: bool = False
    error: str | None = None
    metadata: dict[str, Any] = {}
    sources: list[ev.RetrievedDocument] | None = None  # None: no retrieval stored for the turn
    sources_cited: list[int] = []  # the documents the answer was given (ResponseCompleted.sources)
    unknown_names: list[str] = []  # RetrievalCompleted.unknown_names: named, never mentioned by the site
    contact_page: str = ""  # RetrievalCompleted.contact_page: the site's contact page among its synced pages
    seen: list[str] = []  # event types stored for this turn, in arrival order
    language: str = ""  # TurnRequested.visitor["language"], when the widget sent one
    client_message_id: str | None = None  # the message's id from the client (a message sent again: the same)
    rating: str = ""  # the visitor's latest vote on the turn's answer (FeedbackGiven): up | down | ""
    requested_ts: float = 0.0  # when the visitor sent the message (TurnRequested.ts)


class SyncProgress(msgspec.Struct, kw_only=True):
    """A knowledge source's log (session `ev.SOURCE_PREFIX`…): its latest sync run. `pages`
    maps every page the run fetches to its outcome ("" while pending), in the order they
    were queued: the start's pages, then the links found (when the run discovers) up to the
    source's page limit, decided here in log order so every reader agrees. Replaced, never
    changed in place, by each event that changes it (states are shared)."""

    run: int = 0
    max_pages: int = 0
    discover: bool = False
    pages: dict[str, str] = {}
    pending: int = 0
    ended: str = ""  # "" while running | completed | failed

    @property
    def complete(self) -> bool:
        """Every page the run queued has its outcome, and the run has not ended yet."""
        return self.run > 0 and not self.ended and self.pending == 0


def apply_sync(progress: SyncProgress, event: ev.Envelope) -> SyncProgress:
    """A source's run progress after one of its events."""
    match event:
        case ev.SyncStarted():
            if event.turn <= progress.run:
                return progress  # a redelivered start of a run already under way
            pages = dict.fromkeys([p.url for p in event.pages][:max(1, event.source.max_pages)], "")
            return SyncProgress(run=event.turn, max_pages=max(1, event.source.max_pages), discover=event.discover,
                                pages=pages, pending=len(pages))
        case ev.PageFetched():
            if event.turn != progress.run or progress.pages.get(event.url, None) != "":
                return progress  # another run's, a page not queued, or one already fetched
            pages = {**progress.pages, event.url: event.outcome}
            pending = progress.pending - 1
            if progress.discover:
                for link in event.links:
                    if len(pages) >= progress.max_pages:
                        break
                    if link not in pages:
                        pages[link] = ""
                        pending += 1
            return msgspec.structs.replace(progress, pages=pages, pending=pending)
        case ev.SyncCompleted() | ev.SyncFailed():
            if event.turn != progress.run:
                return progress
            return msgspec.structs.replace(progress, ended="completed" if isinstance(event, ev.SyncCompleted) else "failed")
    return progress


class ConversationState(msgspec.Struct, kw_only=True):
    site: str = ""
    session_id: str = ""
    turn: int = 0
    last_seq: int = 0
    turn_requested_seq: int = 0
    event_count: int = 0
    messages: list[Message] = []
    turns: dict[int, TurnRecord] = {}
    visitor_profile: VisitorProfile = msgspec.field(default_factory=VisitorProfile)
    dialog: DialogSupervisionState = msgspec.field(default_factory=DialogSupervisionState)
    interest: InterestSignalsState = msgspec.field(default_factory=InterestSignalsState)
    form: FormCollectionState = msgspec.field(default_factory=FormCollectionState)
    booking: BookingState = msgspec.field(default_factory=BookingState)
    last_cta_turn: int = 0  # the last turn whose applied skills proposed a demo or asked for an e-mail
    qualification_asked: list[str] = []  # post-conversion questions already asked
    hack_count: int = 0
    spam_count: int = 0
    last_input: str = ""
    llm_calls: int = 0
    sync: SyncProgress = msgspec.field(default_factory=SyncProgress)  # a knowledge source's log only
    handoff: HandoffState = msgspec.field(default_factory=HandoffState)
    # The site's own id of the visitor, when its page passed one (TurnRequested.visitor's
    # `person_id`; the latest given): what analytics and the lead webhook tie the lead to.
    person_id: str = ""
    # Enrichment named the company's sector: what the conversation suggests (ProfileInferred)
    # no longer overrides it, whichever of the two is stored first.
    sector_enriched: bool = False


class Record(msgspec.Struct, kw_only=True):
    """An event as stored: its stream sequence and subject next to it."""

    seq: int
    subject: str
    event: ev.Event


# --- reducers ---------------------------------------------------------------------------


def merge_visitor_profiles(old: VisitorProfile, new: VisitorProfile) -> VisitorProfile:
    """Known beats "unknown"; between two known values the later one wins."""
    merged = {}
    for field in VisitorProfile.__struct_fields__:
        value = getattr(new, field)
        merged[field] = getattr(old, field) if _unknown(value) else value
    return VisitorProfile(**merged)


def _unknown(value: str) -> bool:
    return value is None or value == "" or value.lower() == UNKNOWN


def merge_dialog_supervision(
    old: DialogSupervisionState, flags: dict[str, bool], turn: int
) -> DialogSupervisionState:
    ever = dict(old.ever)
    for name, seen in flags.items():
        ever[name] = ever.get(name, False) or seen
    return DialogSupervisionState(ever=ever, latest=dict(flags), latest_turn=turn)


def merge_interest_signals(
    old: InterestSignalsState, signals: dict[str, bool], score: float, turn: int
) -> InterestSignalsState:
    return InterestSignalsState(signals=dict(signals), score=score, turn=turn)


def merge_form_collection(old: FormCollectionState, values: dict[str, str], turn: int) -> FormCollectionState:
    return FormCollectionState(values={**old.values, **values}, max_turn=max(old.max_turn, turn))


CTA_SKILLS = frozenset({"propose_demo", "collect_email"})


def apply_route_to_booking(old: BookingState, event: ev.RouteDecided) -> BookingState:
    booking = msgspec.structs.replace(old)
    if event.branch in ("STOP", "EXIT"):
        booking.active = False
        booking.pending_field = None
    elif event.route == "BOOKING" and not booking.lead_captured:
        if not booking.active:
            booking.active = True
            booking.started_turn = event.turn
    return booking


# --- the transition ---------------------------------------------------------------------


def _turn(state: ConversationState, turn: int) -> TurnRecord:
    record = state.turns.get(turn)
    if record is None:
        record = TurnRecord(turn=turn)
        state.turns[turn] = record
    return record


def apply(state: ConversationState, record: Record) -> ConversationState:
    """Apply one stored event. Mutates and returns `state` (callers copy when they need to)."""
    event = record.event
    state.site = event.site
    state.session_id = event.session_id
    state.last_seq = record.seq
    state.event_count += 1
    seen = _turn(state, event.turn).seen
    if ev.event_type(event) not in seen:
        seen.append(ev.event_type(event))

    match event:
        case ev.TurnRequested():
            normalized = event.message.strip().lower()
            state.spam_count = state.spam_count + 1 if normalized == state.last_input else 0
            state.last_input = normalized
            state.turn = max(state.turn, event.turn)
            state.turn_requested_seq = record.seq
            state.messages.append(Message(role="user", content=event.message, turn=event.turn))
            rec = _turn(state, event.turn)
            rec.client_message_id = event.client_message_id
            rec.requested_ts = event.ts
            if event.visitor and isinstance(event.visitor.get("language"), str):
                rec.language = event.visitor["language"]
            if event.visitor and isinstance(event.visitor.get("person_id"), str):
                state.person_id = event.visitor["person_id"]
        case ev.TurnBlocked():
            # A blocked turn uses its number but leaves the spam counters as they were, so
            # repeating the message stays blocked and a different one unblocks.
            state.turn = max(state.turn, event.turn)
            rec = _turn(state, event.turn)
            rec.status = "blocked"
            rec.error = event.reason
            rec.client_message_id = event.client_message_id
        case ev.RouteDecided():
            rec = _turn(state, event.turn)
            rec.route = event.route
            rec.branch = event.branch
            rec.intent = event.intent
            state.hack_count += event.hack_increment
            state.booking = apply_route_to_booking(state.booking, event)
        case ev.IntentClassified():
            rec = _turn(state, event.turn)
            rec.intent = event.intent
            rec.intent_confidence = event.confidence
            rec.intent_runner_up = event.runner_up or None
            rec.intent_markers = list(event.markers)
        case ev.InterestSignalsDetected():
            state.interest = merge_interest_signals(state.interest, event.signals, event.score, event.turn)
        case ev.SkillsSelected():
            _turn(state, event.turn).skills_selected = list(event.skills)
        case ev.SkillsApplied():
            rec = _turn(state, event.turn)
            rec.skills = list(event.skills)
            rec.qualification_question = event.qualification_question
            if CTA_SKILLS & set(event.skills):
                state.last_cta_turn = max(state.last_cta_turn, event.turn)
            if event.qualification_question and event.qualification_question not in state.qualification_asked:
                state.qualification_asked.append(event.qualification_question)
        case ev.BookingProgressed():
            booking = state.booking
            booking.pending_field = event.pending_field
            booking.collected = {**booking.collected, **event.collected}
            if event.done:
                booking.active = False
                booking.pending_field = None
                booking.ended_turn = event.turn
        case ev.LeadCaptured():
            booking = state.booking
            if not booking.lead_captured:
                booking.lead_captured = True
                booking.lead_turn = event.turn
            if state.handoff.follow_up:
                state.handoff = msgspec.structs.replace(state.handoff, follow_up=False)
        case ev.EnrichmentCompleted():
            profile = merge_visitor_profiles(state.visitor_profile, event.profile)
            if not _unknown(event.profile.sector):  # the company's sector, with its own sub-sector
                state.sector_enriched = True
                profile = msgspec.structs.replace(profile, sub_sector=event.profile.sub_sector,
                                                  sector_confidence_level=event.profile.sector_confidence_level)
            state.visitor_profile = profile
        case ev.ProfileInferred():
            inferred = event.profile
            if state.sector_enriched:  # the profiler ran beside enrichment: its guess of the sector is not used
                inferred = msgspec.structs.replace(inferred, sector=ev.UNKNOWN, sub_sector=ev.UNKNOWN,
                                                   sector_confidence_level=ev.UNKNOWN)
            state.visitor_profile = merge_visitor_profiles(state.visitor_profile, inferred)
        case ev.RetrievalCompleted():
            rec = _turn(state, event.turn)
            if rec.sources is None:  # a redelivered retrieval: the first stored one counts
                rec.sources = list(event.documents)
                rec.unknown_names = list(event.unknown_names)
                rec.contact_page = event.contact_page
                # Only the newest turn keeps the documents' text (its answer and finalize use
                # it); earlier turns' sources stay in the log and, without text, in their
                # TurnCompleted metadata, so snapshots do not grow with every turn.
                for other in state.turns.values():
                    if other.turn < event.turn and other.sources:
                        other.sources = []
        case ev.DialogStateExtracted():
            state.dialog = merge_dialog_supervision(state.dialog, event.flags, event.turn)
        case ev.FormFieldsExtracted():
            state.form = merge_form_collection(state.form, event.values, event.turn)
        case ev.LLMCallRecorded():
            state.llm_calls += 1
        case ev.ResponseCompleted():
            rec = _turn(state, event.turn)
            # A redelivered responder may answer again; the first stored answer is the turn's.
            # An answer stored after its turn ended (the gateway gave up on it at the deadline)
            # or after the next turn began is late: kept in the log, never in the history.
            if rec.response_attempt is None and rec.status == "requested" and event.turn == state.turn:
                rec.response_attempt = event.attempt
                rec.fallback_used = event.fallback_used
                rec.sources_cited = list(event.sources)
                state.messages.append(Message(role="assistant", content=event.text, turn=event.turn))
        case ev.TurnCompleted():
            rec = _turn(state, event.turn)
            rec.status = "completed"
            rec.metadata = dict(event.metadata)
        case ev.TurnFailed():
            rec = _turn(state, event.turn)
            if rec.status != "completed":
                rec.status = "failed"
                rec.error = f"{event.node}: {event.reason}"
        case ev.FeedbackGiven():
            _turn(state, event.turn).rating = event.rating
        case ev.HandoffRequested():
            # A copy of an earlier turn's request (republished by an erase, or redelivered past the
            # dedupe window) reopens nothing.
            if state.handoff.status != "held" and event.turn >= state.turn:
                state.handoff = HandoffState(status="waiting", reason=event.reason, requested_turn=event.turn,
                                             requested_ts=event.ts, handoffs=state.handoff.handoffs + 1)
        case ev.OperatorJoined():
            state.handoff = msgspec.structs.replace(state.handoff, status="held", operator=event.operator)
        case ev.OperatorMessage():
            if state.handoff.status and not state.handoff.replied:
                state.handoff = msgspec.structs.replace(state.handoff, replied=True)
        case ev.OperatorLeft():
            if state.handoff.status == "held" and state.handoff.operator == event.operator:
                state.handoff = msgspec.structs.replace(state.handoff, status="waiting", operator="")
        case ev.HandoffEnded() if not (event.by == "system" and state.handoff.status == "held"):
            # (An end by "system", nobody available, that raced an operator's claim ends nothing.)
            follow_up = event.outcome in ev.UNANSWERED and not state.booking.lead_captured
            state.handoff = msgspec.structs.replace(state.handoff, status="", operator="",
                                                    follow_up=follow_up or state.handoff.follow_up)
        case ev.SyncStarted() | ev.PageFetched() | ev.SyncCompleted() | ev.SyncFailed():
            state.sync = apply_sync(state.sync, event)
    return state


def fold(records: Iterable[Record], initial: ConversationState | None = None) -> ConversationState:
    state = copy_state(initial) if initial is not None else ConversationState()
    for record in records:
        apply(state, record)
    return state


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(ConversationState)


def encode_state(state: ConversationState) -> bytes:
    return _state_encoder.encode(state)


def decode_state(data: bytes) -> ConversationState:
    return _state_decoder.decode(data)


_copy_encoder = msgspec.msgpack.Encoder()
_copy_decoder = msgspec.msgpack.Decoder(ConversationState)


def fork(state: ConversationState) -> ConversationState:
    """A copy that `apply` may fold forward while `state` stays as it was, at a fraction of
    `copy_state`'s cost: new are the containers `apply` changes in place (the state, its
    message list, each turn's record and `seen` list, the booking, the asked questions);
    shared is what it only ever replaces (messages, profiles, a record's other lists, the
    retrieved documents). Neither side may be changed other than by `apply`: a load hands
    the cache's states to handlers as they are (tests/helpers.decide checks no handler
    changes its input; tests/test_state.py that folding a fork leaves the original as it
    was, for every event type)."""
    return msgspec.structs.replace(
        state,
        messages=list(state.messages),
        turns={n: msgspec.structs.replace(r, seen=list(r.seen)) for n, r in state.turns.items()},
        booking=msgspec.structs.replace(state.booking),
        qualification_asked=list(state.qualification_asked),
    )


def copy_state(state: ConversationState) -> ConversationState:
    """A deep copy (every load copies: callers may change what they get). MessagePack, not
    JSON: the faster of the two on a long conversation's state, and the copy is on the hot
    path."""
    return _copy_decoder.decode(_copy_encoder.encode(state))

