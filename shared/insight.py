"""Insight: what a site owner asks of a week live, projected from the conversation log.

A conversation's log becomes one `ConversationFacts` record (`conversation_facts`, pure:
the same events give the same record, whichever process folds them): each turn's question,
language, route, outcome, time to first token, the sources it cited and the closest ones it
was given, and the visitor's vote on it; the conversation's lead, booking and outcome. The
`insight_projector` node (services/enricher/insight_projector.py) keeps each conversation's
record in the `insight` bucket as its turns end; `rebuild` makes every record of a site again
from the log (`concierge insight rebuild --site SITE`) and gives the same records.

`figures` sums the records over a date range (filtered by language and route): per site and
per day. shared/gaps.py groups the questions the knowledge base could not answer, and puts
them beside the figures (`report`).

A turn's outcome:
- answered: routed ANSWER and its answer cites at least one source;
- not_found: routed ANSWER and its answer cites none ("I did not find that…");
- redirected: routed REDIRECT (support, careers, …: answered by pointing elsewhere);
- booking: routed BOOKING (the in-chat booking flow asked for its next field);
- handoff: routed HANDOFF (a person of the team was asked for, or holds the conversation);
- blocked: refused by the abuse gate; failed: ended by a `TurnFailed`; pending: not ended.
An answered turn is `weak` when its citation audit flagged it (sources given and none cited,
or figures no source holds).

A conversation's outcome (HubSpot's resolution: answered, no human asked for, feedback
positive or absent; converted first):
- converted: a lead was captured or a booking completed;
- abandoned: not converted, and it stopped mid-way: a booking started and not finished, or
  no turn got a reply (every turn blocked, failed or pending);
- unresolved: neither, and the visitor was handed to a person (`handoffs`), an answer was
  rated down, or its last ANSWER turn was not_found;
- resolved: the rest (answered from the knowledge base or redirected, never rated down).
`resolution_rate` = (resolved + converted) / conversations.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Mapping

import msgspec

from shared import events as ev
from shared import language, subjects
from shared.bus import Bus

log = logging.getLogger(__name__)

# The event types a conversation's record is made of, and those that end a turn or change a
# vote: the projector consumes the latter and reads the former.
KINDS = ("turn_requested", "turn_blocked", "response_completed", "turn_completed", "turn_failed",
         "booking_progressed", "lead_captured", "feedback_given", "handoff_requested")
TRIGGERS = ("turn_completed", "turn_failed", "turn_blocked", "feedback_given")
QUESTION_CHARS = 500
CLOSEST = 3  # the closest knowledge-base sections kept per turn (the sources it was given, best first)
TURN_OUTCOMES = ("answered", "not_found", "redirected", "booking", "handoff", "blocked", "failed", "pending")
OUTCOMES = ("resolved", "unresolved", "converted", "abandoned")


class Source(msgspec.Struct, kw_only=True, omit_defaults=True):
    title: str
    url: str


class TurnFacts(msgspec.Struct, kw_only=True, omit_defaults=True):
    turn: int
    ts: float
    question: str = ""
    language: str = "en"
    route: str = ""
    outcome: str = "pending"
    weak: bool = False
    ttft_ms: float | None = None
    cited: list[Source] = []
    closest: list[Source] = []
    rating: str = ""  # up | down | "" (no vote)
    reason: str = ""


class ConversationFacts(msgspec.Struct, kw_only=True, omit_defaults=True):
    site: str
    session_id: str
    events: int = 0  # events folded: a record made from more of the log replaces one made from less
    started_ts: float = 0.0
    language: str = "en"  # its first turn's
    turns: list[TurnFacts] = []
    lead: bool = False
    booking_started: bool = False
    booking_completed: bool = False
    handoffs: int = 0
    outcome: str = "abandoned"


def conversation_facts(site: str, session_id: str, log: Mapping[str, Iterable[ev.Envelope]]) -> ConversationFacts:
    """The record of one conversation from its stored events of each of `KINDS` (each kind's
    in log order; how kinds interleave does not matter). The first stored event of a kind
    counts for a turn, as in the fold (shared/state.py); a vote's latest counts."""
    by_kind = {kind: list(log.get(kind, ())) for kind in KINDS}
    turns: dict[int, TurnFacts] = {}
    for event in by_kind["turn_requested"]:
        if event.turn not in turns:
            lang = _language(event.message, (event.visitor or {}).get("language"))
            turns[event.turn] = TurnFacts(turn=event.turn, ts=event.ts, question=event.message[:QUESTION_CHARS],
                                          language=lang)
    for event in by_kind["turn_blocked"]:
        facts = turns.setdefault(event.turn, TurnFacts(turn=event.turn, ts=event.ts, language=event.language))
        facts.outcome = "blocked"
    answers: dict[int, ev.ResponseCompleted] = {}
    for event in by_kind["response_completed"]:
        answers.setdefault(event.turn, event)
    ended: set[int] = set()
    for event in by_kind["turn_completed"]:
        facts = turns.get(event.turn)
        if facts is None or event.turn in ended or facts.outcome == "blocked":
            continue
        ended.add(event.turn)
        route = event.metadata.get("route") or ""
        facts.route = route
        given = [s for s in event.metadata.get("sources") or [] if isinstance(s, dict)]
        facts.cited = [Source(title=str(s.get("title", "")), url=str(s.get("url", ""))) for s in given if s.get("cited")]
        facts.closest = [Source(title=str(s.get("title", "")), url=str(s.get("url", ""))) for s in given[:CLOSEST]]
        answer = answers.get(event.turn)
        if route == "ANSWER":
            facts.outcome = "answered" if facts.cited else "not_found"
            facts.weak = bool(answer and (answer.uncited or answer.unsupported_numbers))
        elif route == "REDIRECT":
            facts.outcome = "redirected"
        elif route == "BOOKING":
            facts.outcome = "booking"
        elif route == "HANDOFF":
            facts.outcome = "handoff"
        else:
            facts.outcome = "answered" if facts.cited else "not_found"
        if answer is not None and answer.first_token_ts > 0:
            facts.ttft_ms = round(max(0.0, answer.first_token_ts - facts.ts) * 1000, 1)
    for event in by_kind["turn_failed"]:
        facts = turns.get(event.turn)
        if facts is not None and event.turn not in ended and facts.outcome == "pending":
            facts.outcome = "failed"
    for event in by_kind["feedback_given"]:
        if event.turn in turns:
            turns[event.turn].rating, turns[event.turn].reason = event.rating, event.reason
    ordered = [turns[n] for n in sorted(turns)]
    record = ConversationFacts(
        site=site, session_id=session_id, events=sum(len(v) for v in by_kind.values()),
        started_ts=ordered[0].ts if ordered else 0.0, language=ordered[0].language if ordered else "en",
        turns=ordered, lead=bool(by_kind["lead_captured"]),
        booking_started=any(t.route == "BOOKING" for t in ordered),
        booking_completed=any(e.done for e in by_kind["booking_progressed"]),
        handoffs=len({e.turn for e in by_kind["handoff_requested"]}))
    record.outcome = outcome(record)
    return record


@functools.lru_cache(maxsize=4096)
def _language(message: str, declared: str | None) -> str:
    """A question's language (each trigger makes the record again: its earlier questions' are
    remembered)."""
    return language.guess(message, {"language": declared} if isinstance(declared, str) else None)


def outcome(record: ConversationFacts) -> str:
    """The conversation's outcome (the module's docstring defines each)."""
    if record.lead or record.booking_completed:
        return "converted"
    replied = [t for t in record.turns if t.outcome not in ("blocked", "failed", "pending")]
    if not replied or (record.booking_started and not record.booking_completed):
        return "abandoned"
    answers = [t for t in record.turns if t.route == "ANSWER" and t.outcome in ("answered", "not_found")]
    if record.handoffs or any(t.rating == "down" for t in record.turns) or (
            answers and answers[-1].outcome == "not_found"):
        return "unresolved"
    return "resolved"


# --- figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    since: float = 0.0  # unix seconds; a conversation counts on the day its first turn started
    until: float = float("inf")
    language: str | None = None  # the conversation's (its first turn's)
    route: str | None = None  # conversations with a turn of this route; turns of this route


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d")


def selected(records: Iterable[ConversationFacts], filters: Filters) -> list[ConversationFacts]:
    return [r for r in records if r.turns and filters.since <= r.started_ts < filters.until
            and (filters.language is None or r.language == filters.language)
            and (filters.route is None or any(t.route == filters.route for t in r.turns))]


def _counts(records: list[ConversationFacts], route: str | None) -> dict:
    turns = [t for r in records for t in r.turns if route is None or t.route == route]
    outcomes = Counter(t.outcome for t in turns)
    ttft = sorted(t.ttft_ms for t in turns if t.ttft_ms is not None)
    conversation_outcomes = Counter(r.outcome for r in records)
    n = len(records)
    return {
        "conversations": n,
        "turns": len(turns),
        "routes": dict(sorted(Counter(t.route for t in turns if t.route).items())),
        "answered": outcomes["answered"],
        "not_found": outcomes["not_found"],
        "weak": sum(1 for t in turns if t.weak),
        "redirected": outcomes["redirected"],
        "handoff_turns": outcomes["handoff"],
        "bookings": sum(1 for r in records if r.booking_started),
        "bookings_completed": sum(1 for r in records if r.booking_completed),
        "leads": sum(1 for r in records if r.lead),
        "handoffs": sum(r.handoffs for r in records),
        "blocked": outcomes["blocked"],
        "failed": outcomes["failed"],
        "feedback_up": sum(1 for t in turns if t.rating == "up"),
        "feedback_down": sum(1 for t in turns if t.rating == "down"),
        "ttft_ms_p50": round(statistics.median(ttft), 1) if ttft else None,
        "ttft_ms_p95": round(ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))], 1) if ttft else None,
        "languages": dict(sorted(Counter(r.language for r in records).items())),
        "outcomes": {name: conversation_outcomes[name] for name in OUTCOMES},
        "resolution_rate": round((conversation_outcomes["resolved"] + conversation_outcomes["converted"]) / n, 3)
        if n else None,
        "conversion_rate": round(conversation_outcomes["converted"] / n, 3) if n else None,
    }


def figures(records: Iterable[ConversationFacts], filters: Filters = Filters()) -> dict:
    """The site's figures over `filters`' range, in total and per day (the days that had a
    conversation), as `concierge insight` prints them and the operator API serves them."""
    chosen = selected(records, filters)
    by_day: dict[str, list[ConversationFacts]] = {}
    for record in chosen:
        by_day.setdefault(day_of(record.started_ts), []).append(record)
    return {**_counts(chosen, filters.route),
            "days": [{"day": day, **_counts(by_day[day], filters.route)} for day in sorted(by_day)]}


def since_seconds(value: str) -> float:
    """"7d", "24h", "90m", "3600" (seconds) → seconds; ValueError otherwise."""
    text = value.strip().lower()
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    seconds = float(number) * units[unit]
    if not seconds > 0:
        raise ValueError(f"{value!r}: a positive duration like 7d, 24h or 90m")
    return seconds


# --- the store: one record per conversation in the `insight` bucket -------------------------

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ConversationFacts)


def key(site: str, session_id: str) -> str:
    return f"{site}.{session_id}"


class Projections:
    """The `insight` bucket: each conversation's record under `<site>.<session>`."""

    def __init__(self, bus: Bus):
        self.bus = bus

    @property
    def kv(self):
        return self.bus.bucket(subjects.INSIGHT_BUCKET)

    async def save(self, record: ConversationFacts, force: bool = False) -> tuple[bool, ConversationFacts | None]:
        """Store `record` unless the bucket holds it, or one made from more of the log
        (`force`: a rebuild's or an erase's, stored over anything else). Returns whether it
        stored it, and the record it replaced (None: none). Replicas racing: compare-and-set,
        read again on conflict."""
        from nats.js.errors import NotFoundError

        name, data = key(record.site, record.session_id), _encoder.encode(record)
        for _ in range(10):
            try:
                entry = await self.kv.get(name)
            except NotFoundError:  # never written, or deleted
                entry = None
            old = _decoder.decode(entry.value) if entry is not None and entry.value else None
            if old is not None and (old == record or (not force and old.events > record.events)):
                return False, old
            try:
                if entry is None:
                    await self.kv.create(name, data)
                else:
                    await self.kv.update(name, data, last=entry.revision)
                return True, old
            except Exception as exc:  # noqa: BLE001 - only a racing writer's conflict is tried again
                if not _conflict(exc):
                    raise
        raise RuntimeError(f"insight record {name} kept changing under 10 writes")

    async def records(self, site: str) -> list[ConversationFacts]:
        """Every stored record of `site`."""
        out = []
        async for _seq, _subject, data in self.bus.read_raw(f"$KV.{subjects.INSIGHT_BUCKET}.{site}.>",
                                                             stream=f"KV_{subjects.INSIGHT_BUCKET}"):
            if data:
                out.append(_decoder.decode(data))
        return out

    async def delete(self, site: str, session_id: str) -> None:
        await self.kv.purge(key(site, session_id))


def _conflict(exc: Exception) -> bool:
    from nats.js.errors import APIError, KeyWrongLastSequenceError

    return isinstance(exc, KeyWrongLastSequenceError) or (isinstance(exc, APIError) and exc.err_code == 10071)


# --- rebuilding from the log ------------------------------------------------------------------


async def site_logs(bus: Bus, site: str) -> dict[str, dict[str, list[ev.Envelope]]]:
    """Every conversation of `site` (not the site's own logs: `ev.is_conversation`), its
    events of each of `KINDS` in log order."""
    logs: dict[str, dict[str, list[ev.Envelope]]] = {}
    for kind in KINDS:
        for record in await bus.read(subjects.conv_of_type(kind, site)):
            session = record.event.session_id
            if ev.is_conversation(session):
                logs.setdefault(session, {}).setdefault(kind, []).append(record.event)
    return logs


async def rebuild(bus: Bus, site: str) -> dict:
    """Every record of `site` made again from the log and stored (records of conversations
    the log no longer holds are deleted). Returns what it did."""
    started = time.monotonic()
    projections = Projections(bus)
    logs = await site_logs(bus, site)
    for session, kinds in logs.items():
        await projections.save(conversation_facts(site, session, kinds), force=True)
    stale = [r.session_id for r in await projections.records(site) if r.session_id not in logs]
    for session in stale:
        await projections.delete(site, session)
    return {"site": site, "conversations": len(logs), "deleted": len(stale),
            "seconds": round(time.monotonic() - started, 2)}


async def project_session(bus: Bus, site: str, session_id: str) -> ConversationFacts:
    """One conversation's record made again from its log and stored (an erase's rewrite)."""
    kinds = {kind: [r.event for r in await bus.read(subjects.conv(site, session_id, kind))] for kind in KINDS}
    record = conversation_facts(site, session_id, kinds)
    await Projections(bus).save(record, force=True)
    return record
