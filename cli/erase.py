"""`concierge erase-visitor --site SITE (--session ID ... | --ip ADDRESS | --person-id ID | --email ADDRESS)`:
forget a visitor.

The visitor is every session of the site tied to the sessions (or the IP, person id or
e-mail) given: by the `person_id` the site's page passed, by the `email_hash` it passed or
an e-mail address the visitor gave (compared by their SHA-256), or by an IP hash when the
session names no other person (`Traits.tie`). Each session erased may name more, so it
goes on until no session is new. For each of those sessions:
- the conversation log is rewritten with personal data redacted (`shared.privacy.redact_log`):
  the events are read, the session's subjects purged, and the redacted events appended
  again in their original order with their original ids;
- the state snapshot, the token chunks and the session's dead letters are removed, and its
  insight record (shared/insight.py) is made again from the redacted log;
- its lead brief's steps are redacted with the rest of its log (the e-mail, the form
  fields, e-mails in the transcript, the brief, the call script); and where other
  conversations speak of it, the site's triages (its reason) and other leads' briefs (its
  summary among their similar leads), that is redacted too;
- the site's test cases made from its turns (shared/eval_cases.py) are rewritten with the
  visitor's e-mail addresses and identifiers scrubbed from them, every version;
- Redis: the raw IP, the enrichment cache (by IP hash and by session), the
  returning-visitor profile and the identity fingerprint (`seen`) are deleted.
The rewritten events are marked so that no node acts on what it acted on before
(`_rewrite`). It prints what it touched. Sessions with a turn in flight are refused (run
it again later), so no turn is written into a log that is being rewritten. Run again, it
changes nothing more: an erased session no longer shows what found it, and `--session`
rewrites it into the same log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Callable

from shared import events as ev
from shared import eval_runs, insight, privacy, redis_client, subjects
from shared.bus import Bus, connect
from shared.config import BusConfig
from shared.session_guard import SessionGuard

HOLD_S = 120  # an erase that dies mid-way frees the session after this


class Busy(Exception):
    pass


@dataclass
class Traits:
    """What ties sessions to one visitor: IP hashes, the site's ids of the person, and
    e-mail hashes (SHA-256 of the lower-case address, as the widget sends them)."""

    ip_hashes: set[str] = field(default_factory=set)
    person_ids: set[str] = field(default_factory=set)
    email_hashes: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.ip_hashes or self.person_ids or self.email_hashes)

    def __ior__(self, other: "Traits") -> "Traits":
        self.ip_hashes |= other.ip_hashes
        self.person_ids |= other.person_ids
        self.email_hashes |= other.email_hashes
        return self

    @classmethod
    def of(cls, events: list[ev.Envelope]) -> "Traits":
        """The traits a session's (unredacted) events show."""
        traits = cls()
        for event in events:
            match event:
                case ev.TurnRequested():
                    if event.ip_hash and event.ip_hash != privacy.REDACTED:
                        traits.ip_hashes.add(event.ip_hash)
                    traits |= cls._of_visitor(event.visitor)
                case ev.LeadCaptured() if event.email != privacy.REDACTED:
                    traits.email_hashes.add(privacy.email_hash(event.email))
        return traits

    @classmethod
    def _of_visitor(cls, visitor: dict | None) -> "Traits":
        traits, visitor = cls(), visitor or {}
        if isinstance(visitor.get("person_id"), str):
            traits.person_ids.add(visitor["person_id"])
        if isinstance(visitor.get("email_hash"), str):
            traits.email_hashes.add(visitor["email_hash"].lower())
        if isinstance(visitor.get("email"), str):
            traits.email_hashes.add(privacy.email_hash(visitor["email"]))
        return traits

    def names_someone(self) -> bool:
        return bool(self.person_ids or self.email_hashes)

    def tie(self, theirs: "Traits") -> bool:
        """Whether a session with traits `theirs` is this visitor's: it names the same person
        (a person id, an e-mail hash), or it shares an IP hash and names nobody else. An IP
        is shared by an office or a carrier: a session there in which the site said who the
        visitor is, someone other than this visitor, is that person's, not this visitor's.
        (Until this visitor is known as a person, an IP takes everyone behind it.)"""
        if theirs.person_ids & self.person_ids or theirs.email_hashes & self.email_hashes:
            return True
        return bool(theirs.ip_hashes & self.ip_hashes) and not (self.names_someone() and theirs.names_someone())


async def sessions_of(bus: Bus, site: str, traits: Traits) -> set[str]:
    """The site's sessions tied to `traits` (`Traits.tie`), from their requests and leads."""
    theirs: dict[str, Traits] = {}
    for event_type in ("turn_requested", "lead_captured"):
        for record in await bus.read(subjects.conv_of_type(event_type, site)):
            found = theirs.setdefault(record.event.session_id, Traits())
            found |= Traits.of([record.event])
    return {session_id for session_id, found in theirs.items() if traits.tie(found)}


@asynccontextmanager
async def _held(bus: Bus, site: str, session_id: str):
    """The session's guard, so no turn is written into a log being rewritten."""
    guard = SessionGuard(bus, ttl_s=HOLD_S)
    hold = await guard.acquire(site, session_id, holder=b"erasing")
    if hold is None:
        raise Busy(f"{site}/{session_id} has a turn in flight; try again when it is idle")
    try:
        yield
    finally:
        await guard.release(site, session_id, hold)


async def _rewrite(bus: Bus, site: str, session_id: str,
                   fix: Callable[[list[ev.Envelope]], list[tuple[ev.Envelope, list[str]]]],
                   erased: bool) -> tuple[list[ev.Envelope], int]:
    """The conversation's log again with `fix` applied to its events (each fixed one with
    the fields it changed): read, purged, and the fixed events appended in their original
    order with their original ids. `erased`: the log is the erased visitor's, its copies
    marked so that no node handles them again (`privacy.ERASED_COPY`); otherwise a copy
    names the nodes that had acked its original (`privacy.SETTLED_COPY`), which skip it, and
    every other node handles it (not lost: one that had not acked it, or did not exist yet,
    handles it; handled twice at worst).
    Returns the events as they were, and how many fields `fix` changed."""
    records = await bus.read(subjects.conversation(site, session_id))
    results = fix([r.event for r in records])
    fields = sum(len(touched) for _, touched in results)
    fixed = [clean for clean, _ in results]
    # A purge leaves the stream's dedupe window as it was: a message id used by an earlier
    # rewrite of this log (a site's triage, rewritten for each visitor erased) would be
    # dropped as a duplicate after the purge, the event lost. Each rewrite has ids of its own.
    rewrite = ev.new_id()
    if records:
        # Read before the purge: the purged originals would count as acked after it.
        floors = [] if erased else await _ack_floors(bus)
        await bus.js.purge_stream(subjects.CONV_STREAM, subject=subjects.conversation(site, session_id))
        for record, event in zip(records, fixed, strict=True):
            subject = subjects.conv(site, session_id, ev.event_type(event))
            headers = {"Nats-Msg-Id": f"{event.event_id}:erased:{rewrite}"}
            if erased:
                headers[privacy.ERASED_COPY] = rewrite
            elif settled := sorted(name for name, filters, floor in floors if floor >= record.seq
                                   and any(subjects.matches(f, record.subject) for f in filters)):
                headers[privacy.SETTLED_COPY] = ",".join(settled)
            await bus.js.publish(subject, ev.encode(event), stream=subjects.CONV_STREAM, headers=headers)
    return [r.event for r in records], fields


async def _ack_floors(bus: Bus) -> list[tuple[str, list[str], int]]:
    """Each node's durable on the log: its name, what it consumes (its filters) and its ack
    floor (the stream sequence up to which it has acked everything)."""
    floors = []
    for info in await bus.js.consumers_info(subjects.CONV_STREAM):
        filters = info.config.filter_subjects or [info.config.filter_subject or ">"]
        floors.append((info.name, filters, info.ack_floor.stream_seq))
    return floors


async def erase_session(bus: Bus, redis, site: str, session_id: str, report: dict,
                        known: set[str] | None = None) -> Traits:
    """Erase one session; returns the traits it had (IP hashes, person ids, e-mail hashes),
    and adds what named the visitor in it to `known` (`privacy.identifiers`)."""
    async with _held(bus, site, session_id):
        events, fields = await _rewrite(bus, site, session_id, privacy.redact_log, erased=True)
        traits = Traits.of(events)
        if known is not None:
            known |= privacy.identifiers(events)
        # What the enricher stored of the session, and of its IP hashes now (not after the
        # other sessions): the rewritten log no longer names them, so a run that dies later
        # would not find them again.
        keys = [privacy.raw_ip_key(site, session_id), privacy.seen_key(site, session_id),
                privacy.cache_key(site, f"session-{session_id}")]
        keys += [key(site, digest) for digest in sorted(traits.ip_hashes)
                 for key in (privacy.cache_key, privacy.returning_key)]
        deleted = await redis.delete(*keys)
        await bus.js.purge_stream(subjects.TOKENS_STREAM, subject=subjects.session_tokens(site, session_id))
        await _purge_snapshot(bus, site, session_id, report)
        dead = await _delete_dead_letters(bus, site, session_id)
        # Its insight record (votes' reasons, questions) made again from the redacted log.
        await insight.project_session(bus, site, session_id)
        report["sessions"][session_id] = {"events_rewritten": len(events), "fields_redacted": fields,
                                          "dead_letters_deleted": dead, "redis_keys_deleted": deleted}
        return traits


async def forget_mentions(bus: Bus, site: str, erased: set[str], report: dict) -> None:
    """What other conversations of the site say about the erased leads: the site's triages
    (their reasons) and other leads' briefs (their summaries among the similar leads)."""
    mentioning = set()
    for event_type in ("triage_completed", "brief_gathered"):
        for record in await bus.read(subjects.conv_of_type(event_type, site)):
            if record.event.session_id not in erased and privacy.forget_mentions(record.event, erased)[1]:
                mentioning.add(record.event.session_id)
    for session_id in sorted(mentioning):
        async with _held(bus, site, session_id):
            events, fields = await _rewrite(bus, site, session_id,
                                            lambda log: [privacy.forget_mentions(e, erased) for e in log],
                                            erased=False)
            # Its snapshot held the mention and the log's old positions: folded again from the log.
            await _purge_snapshot(bus, site, session_id, report)
        report["mentions"][session_id] = {"events_rewritten": len(events), "fields_redacted": fields}


async def forget_in_cases(bus: Bus, site: str, erased: set[str], known: set[str], report: dict) -> None:
    """The site's test cases made from an erased visitor's turns (shared/eval_cases.py):
    each case's log rewritten with what named the visitor scrubbed from its message and the
    conversation it holds, every version; and so are the logs of the runs that asked such a
    case (its result) and of the turns it was asked in."""
    saved = [r.event for r in await bus.read(subjects.conv(site, "*", "eval_case_saved"))
             if r.event.case.from_session in erased]
    cases = sorted({event.session_id for event in saved})
    # What the cases' runs copied: each run's result (its message and answer) and the turns
    # the case was asked in (shared/eval_runs.py).
    ids = {event.case.id for event in saved}
    results = [r.event for r in await bus.read(subjects.conv(site, "*", "eval_case_result")) if r.event.case_id in ids]
    runs = sorted({event.session_id for event in results})
    tries = sorted({eval_runs.try_session(eval_runs.run_of(event.session_id), event.case_id) for event in results})
    for session_id in [*cases, *runs, *tries]:
        events, fields = await _rewrite(bus, site, session_id,
                                        lambda log: [privacy.redact(e, known) for e in log], erased=False)
        report["cases"][session_id] = {"events_rewritten": len(events), "fields_redacted": fields}


async def _purge_snapshot(bus: Bus, site: str, session_id: str, report: dict) -> None:
    try:
        await bus.bucket(subjects.SNAPSHOT_BUCKET).purge(subjects.kv_key(site, session_id))
    except Exception as exc:  # no snapshot is fine
        report["notes"].append(f"snapshot {site}/{session_id}: {exc!r}")


async def _delete_dead_letters(bus: Bus, site: str, session_id: str) -> int:
    info = await bus.js.stream_info(subjects.DLQ_STREAM)
    deleted = 0
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(subjects.DLQ_STREAM, seq)
        except Exception:
            continue  # already deleted
        subject = (msg.headers or {}).get("Concierge-Subject", "")
        # The conversation's events, and its work items (a lead's brief requests).
        if subjects.in_conversation(subject, site, session_id) or subject.startswith(
                subjects.work(site, session_id, "")):
            await bus.js.delete_msg(subjects.DLQ_STREAM, seq)
            deleted += 1
    return deleted


async def erase(config: BusConfig, redis_url: str, site: str, sessions: list[str], ip: str | None,
                secrets: privacy.PrivacySettings = privacy.PrivacySettings(), *,
                person_ids: list[str] = (), emails: list[str] = (), email_hashes: list[str] = ()) -> dict:
    """`secrets`: the deployment's IP hash key, which found the visitor's sessions by `ip`.
    `person_ids`, `emails`, `email_hashes`: find the visitor's sessions by what the site
    knows them by (the widget's `person_id`, the address or its `email_hash`)."""
    bus = await connect(config, name="erase")
    redis = redis_client.connect(redis_url)
    report: dict = {"site": site, "sessions": {}, "mentions": {}, "cases": {}, "ip_hashes": [], "notes": []}
    try:
        traits = Traits(ip_hashes={secrets.ip_hash(ip)} if ip else set(), person_ids=set(person_ids),
                        email_hashes={h.lower() for h in email_hashes} | {privacy.email_hash(e) for e in emails})
        done: set[str] = set()
        known: set[str] = set()
        todo = set(sessions) | (await sessions_of(bus, site, traits) if traits else set())
        while todo:  # each erased session may reveal another trait, hence more sessions
            for session_id in sorted(todo):
                traits |= await erase_session(bus, redis, site, session_id, report, known)
                done.add(session_id)
            todo = (await sessions_of(bus, site, traits)) - done
        await forget_mentions(bus, site, done, report)
        await forget_in_cases(bus, site, done, known, report)
        report["person_ids"], report["email_hashes"] = len(traits.person_ids), len(traits.email_hashes)
        for digest in sorted(traits.ip_hashes):
            n = await redis.delete(privacy.cache_key(site, digest), privacy.returning_key(site, digest))
            report["ip_hashes"].append({"ip_hash": digest, "redis_keys_deleted": n})
    finally:
        await redis.aclose()
        await bus.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge erase-visitor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", required=True)
    parser.add_argument("--session", action="append", default=[], help="a session of the visitor (repeatable)")
    parser.add_argument("--ip", help="the visitor's IP address (finds their sessions by its hash)")
    parser.add_argument("--person-id", action="append", default=[],
                        help="the site's id of the person, as its page passed it to the widget (repeatable)")
    parser.add_argument("--email", action="append", default=[],
                        help="the visitor's e-mail address: finds the sessions that gave it or its hash (repeatable)")
    parser.add_argument("--email-hash", action="append", default=[],
                        help="SHA-256 of the lower-case e-mail address, as the widget's email_hash (repeatable)")
    parser.add_argument("--nats-url", default=None)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    if not (args.session or args.ip or args.person_id or args.email or args.email_hash):
        parser.error("give --session, --ip, --person-id, --email or --email-hash")
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    try:
        report = asyncio.run(erase(config, args.redis_url or os.environ.get("REDIS_URL", redis_client.DEFAULT_URL),
                                   args.site, args.session, args.ip, privacy.PrivacySettings.from_env(),
                                   person_ids=args.person_id, emails=args.email, email_hashes=args.email_hash))
    except Busy as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(report, indent=2))
    return 0
