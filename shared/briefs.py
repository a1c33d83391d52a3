"""Lead briefs as operators ask for and read them: a site's leads, each lead's latest brief,
the work items that ask for a brief or a triage, a triage in the order to act on it.

One place for both ways in: `concierge briefs` (cli/briefs.py) and the gateway's operator
API (services/gateway/routes/briefs.py). The briefs themselves are written by the enricher's brief
nodes, which take the work items off the BRIEFS queue and store their steps in the lead's
conversation (`conv.<site>.<session>.brief_*`); a site's triages live in the conversation
`TRIAGE_SESSION`.

A lead is a conversation with a `LeadCaptured` (an erased visitor's, its e-mail redacted,
is no lead any more); its latest brief is its newest stored `BriefCompleted` or
`BriefFailed` (a failed retry after a good brief is what an operator should see); an open
lead, one whose latest brief completed, is what a triage ranks and what a new brief is
compared with (the enricher's brief nodes read them here too).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from shared import events as ev
from shared import subjects
from shared.bus import Bus
from shared.privacy import REDACTED
from shared.state import Record

Outcome = ev.BriefCompleted | ev.BriefFailed
OUTCOMES = ("brief_completed", "brief_failed")  # the event types that end a brief
STEPS = ("brief_gathered", *OUTCOMES)  # a brief's steps in the lead's log
PRODUCERS = ("cli", "gateway")
# The order a triage is read in: whom to call, whom to keep warm, whom to drop.
CLASS_ORDER = {name: i for i, name in enumerate(ev.TRIAGE_CLASSES)}


class UnknownLead(Exception):
    """A session named as a lead has no captured lead on that site."""

    def __init__(self, site: str, sessions: Iterable[str]):
        self.site, self.sessions = site, sorted(sessions)
        super().__init__(f"no captured lead {', '.join(self.sessions)} on site {site!r}")


# --- pure ------------------------------------------------------------------------------

def first_captures(records: Iterable[Record]) -> dict[str, ev.LeadCaptured]:
    """Each lead's capture (its first `LeadCaptured`), by session, in capture order; erased
    leads left out."""
    leads: dict[str, ev.LeadCaptured] = {}
    for record in records:
        if isinstance(record.event, ev.LeadCaptured):
            leads.setdefault(record.event.session_id, record.event)
    return {session: lead for session, lead in leads.items() if lead.email != REDACTED}


def latest_outcomes(records: Iterable[Record]) -> dict[str, Outcome]:
    """Each session's newest brief outcome (by stream sequence: the records of several
    subjects may come in any order)."""
    newest: dict[str, Record] = {}
    for record in records:
        if isinstance(record.event, (ev.BriefCompleted, ev.BriefFailed)):
            seen = newest.get(record.event.session_id)
            if seen is None or record.seq > seen.seq:
                newest[record.event.session_id] = record
    return {session: record.event for session, record in newest.items()}


def open_leads(captures: dict[str, ev.LeadCaptured], latest: dict[str, Outcome]) -> list[str]:
    """The leads a triage ranks: those whose latest brief completed."""
    return [session for session in captures if isinstance(latest.get(session), ev.BriefCompleted)]


def has_step_in(log: Mapping[str, Iterable[ev.Envelope]], request_id: str) -> bool:
    """Whether the lead's stored events (`log`, by type: the brief nodes' declared reads of
    STEPS or OUTCOMES) hold a step of the brief asked for as `request_id`: a log stored again
    by an erase is not a new request."""
    return any(getattr(event, "request_id", None) == request_id for events in log.values() for event in events)


def latest_open(captures: dict[str, ev.LeadCaptured], latest: dict[str, Outcome]) -> list[ev.BriefCompleted]:
    """The latest brief of each open lead, in capture order."""
    return [latest[session] for session in open_leads(captures, latest)]


def brief_request(site: str, session_id: str, turn: int, producer: str) -> ev.BriefRequested:
    """An operator's work item for one lead's brief, as of the conversation's turn `turn`."""
    request_id = ev.new_id()
    return ev.BriefRequested(event_id=ev.derived_id(request_id, "briefs", session_id), site=site,
                             session_id=session_id, turn=turn, ts=ev.now(), producer=producer,
                             reason="operator", request_id=request_id)


def triage_request(site: str, producer: str) -> ev.TriageRequested:
    request_id = ev.new_id()
    return ev.TriageRequested(event_id=ev.derived_id(request_id, "briefs", ev.TRIAGE_SESSION), site=site,
                              session_id=ev.TRIAGE_SESSION, turn=0, ts=ev.now(), producer=producer,
                              request_id=request_id)


def ranked(triage: ev.TriageCompleted) -> list[ev.TriageItem]:
    """The triage's items, call_first first, then nurture, then disqualify (stable within a class)."""
    return sorted(triage.items, key=lambda item: CLASS_ORDER[item.classification])


def row(capture: ev.LeadCaptured, outcome: Outcome | None) -> dict:
    """One lead as a line of a list: who, and where its latest brief stands."""
    line: dict = {"session_id": capture.session_id, "email": capture.email, "captured": capture.ts,
                  "status": "none", "priority": None, "stage": None, "verdict": None, "backend": None,
                  "request_id": None, "ts": None}
    match outcome:
        case ev.BriefCompleted():
            line.update(status="completed", priority=outcome.metadata.priority, stage=outcome.metadata.stage,
                        metadata=ev.to_builtins(outcome.metadata), verdict=outcome.verdict or None,
                        backend=outcome.backend, request_id=outcome.request_id, ts=outcome.ts)
        case ev.BriefFailed():
            line.update(status="failed", reason=outcome.reason, request_id=outcome.request_id, ts=outcome.ts)
    return line


# --- reading and queueing ----------------------------------------------------------------

async def leads(bus: Bus, site: str) -> dict[str, ev.LeadCaptured]:
    return first_captures(await bus.read(subjects.conv_of_type("lead_captured", site)))


async def outcomes(bus: Bus, site: str, session_id: str = "*") -> dict[str, Outcome]:
    """The latest brief outcome of each of the site's leads (or of one)."""
    records = [*await bus.read(subjects.conv(site, session_id, "brief_completed")),
               *await bus.read(subjects.conv(site, session_id, "brief_failed"))]
    return latest_outcomes(records)


async def open_briefs(bus: Bus, site: str) -> list[ev.BriefCompleted]:
    """The latest brief of each open lead of the site, in capture order."""
    return latest_open(await leads(bus, site), await outcomes(bus, site))


async def latest_triage(bus: Bus, site: str) -> ev.TriageCompleted | ev.BriefFailed | None:
    """The site's newest triage, or its newest give-up when that came later (the triager
    could not store one): what an operator waiting for a triage must see."""
    return await bus.newest(*(subjects.conv(site, ev.TRIAGE_SESSION, kind)
                               for kind in ("triage_completed", "brief_failed")))


async def requests_for(bus: Bus, site: str, sessions: Iterable[str] | None, producer: str) -> list[ev.BriefRequested]:
    """One work item per lead named (None: every lead of the site), each as of its
    conversation's current turn. Raises `UnknownLead` before anything is made when a
    session has no captured lead."""
    known = await leads(bus, site)
    wanted = list(known) if sessions is None else list(dict.fromkeys(sessions))
    if missing := [s for s in wanted if s not in known]:
        raise UnknownLead(site, missing)
    return [brief_request(site, session, await current_turn(bus, site, session), producer) for session in wanted]


async def current_turn(bus: Bus, site: str, session_id: str) -> int:
    """The conversation's latest turn (its newest `TurnRequested`'s), 0 before its first."""
    requested = await bus.last(subjects.conv(site, session_id, "turn_requested"))
    return requested.turn if isinstance(requested, ev.TurnRequested) else 0


async def queue(bus: Bus, items: Iterable[ev.BriefRequested | ev.TriageRequested]) -> None:
    for item in items:
        await bus.publish_work(item)
