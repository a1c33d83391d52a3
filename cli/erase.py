"""`concierge erase-visitor --site SITE (--session ID ... | --ip ADDRESS)`: forget a visitor.

The visitor is every session of the site that shares an IP hash with the sessions (or
the IP) given. For each of those sessions:
- the conversation log is rewritten with personal data redacted (`shared.privacy.redact`):
  the events are read, the session's subjects purged, and the redacted events appended
  again in their original order with their original ids;
- the state snapshot, the token chunks and the session's dead letters are removed, and its
  insight record (shared/insight.py) is made again from the redacted log;
- its lead brief's steps are redacted with the rest of its log (the e-mail, the form
  fields, e-mails in the transcript, the brief, the call script); and where other
  conversations speak of it, the site's triages (its reason) and other leads' briefs (its
  summary among their similar leads), that is redacted too;
- Redis: the raw IP, the enrichment cache, the returning-visitor profile and the
  identity fingerprint are deleted.
It prints what it touched. Sessions with a turn in flight are refused (run it again
later), so no turn is written into a log that is being rewritten.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import asynccontextmanager
from typing import Callable

from shared import events as ev
from shared import insight, privacy, redis_client, subjects
from shared.bus import Bus, connect
from shared.config import BusConfig
from shared.session_guard import SessionGuard

HOLD_S = 120  # an erase that dies mid-way frees the session after this


class Busy(Exception):
    pass


async def sessions_of(bus: Bus, site: str, ip_hashes: set[str]) -> set[str]:
    found = set()
    for record in await bus.read(subjects.conv_of_type("turn_requested", site)):
        if record.event.ip_hash in ip_hashes:
            found.add(record.event.session_id)
    return found


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
                   fix: Callable[[ev.Envelope], tuple[ev.Envelope, list[str]]]) -> tuple[list[ev.Envelope], int]:
    """The conversation's log again with `fix` applied to each event: read, purged, and the
    fixed events appended in their original order with their original ids. Returns the
    events as they were, and how many fields `fix` changed."""
    records = await bus.read(subjects.conversation(site, session_id))
    fields = 0
    fixed = []
    for record in records:
        clean, touched = fix(record.event)
        fields += len(touched)
        fixed.append(clean)
    # A purge leaves the stream's dedupe window as it was: a message id used by an earlier
    # rewrite of this log (a site's triage, rewritten for each visitor erased) would be
    # dropped as a duplicate after the purge, the event lost. Each rewrite has ids of its own.
    rewrite = ev.new_id()
    if records:
        await bus.js.purge_stream(subjects.CONV_STREAM, subject=subjects.conversation(site, session_id))
        for event in fixed:
            subject = subjects.conv(site, session_id, ev.event_type(event))
            await bus.js.publish(subject, ev.encode(event), stream=subjects.CONV_STREAM,
                                 headers={"Nats-Msg-Id": f"{event.event_id}:erased:{rewrite}"})
    return [r.event for r in records], fields


async def erase_session(bus: Bus, redis, site: str, session_id: str, report: dict) -> set[str]:
    """Erase one session; returns the IP hashes it had."""
    async with _held(bus, site, session_id):
        events, fields = await _rewrite(bus, site, session_id, privacy.redact)
        hashes = {e.ip_hash for e in events if isinstance(e, ev.TurnRequested) and e.ip_hash}
        await bus.js.purge_stream(subjects.TOKENS_STREAM, subject=subjects.session_tokens(site, session_id))
        try:
            await bus.bucket(subjects.SNAPSHOT_BUCKET).purge(subjects.kv_key(site, session_id))
        except Exception as exc:  # no snapshot is fine
            report["notes"].append(f"snapshot {site}/{session_id}: {exc!r}")
        dead = await _delete_dead_letters(bus, site, session_id)
        # Its insight record (votes' reasons, questions) made again from the redacted log.
        await insight.project_session(bus, site, session_id)
        keys = [privacy.raw_ip_key(site, session_id), privacy.seen_key(site, session_id),
                privacy.cache_key(site, f"session-{session_id}")]
        deleted = await redis.delete(*keys)
        report["sessions"][session_id] = {"events_rewritten": len(events), "fields_redacted": fields,
                                          "dead_letters_deleted": dead, "redis_keys_deleted": deleted}
        return hashes


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
            events, fields = await _rewrite(bus, site, session_id, lambda e: privacy.forget_mentions(e, erased))
        report["mentions"][session_id] = {"events_rewritten": len(events), "fields_redacted": fields}


async def _delete_dead_letters(bus: Bus, site: str, session_id: str) -> int:
    info = await bus.js.stream_info(subjects.DLQ_STREAM)
    deleted = 0
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(subjects.DLQ_STREAM, seq)
        except Exception:
            continue  # already deleted
        subject = (msg.headers or {}).get("Concierge-Subject", "")
        if subjects.in_conversation(subject, site, session_id):
            await bus.js.delete_msg(subjects.DLQ_STREAM, seq)
            deleted += 1
    return deleted


async def erase(config: BusConfig, redis_url: str, site: str, sessions: list[str], ip: str | None,
                secrets: privacy.PrivacySettings = privacy.PrivacySettings()) -> dict:
    """`secrets`: the deployment's IP hash key, which found the visitor's sessions by `ip`."""
    bus = await connect(config, name="erase")
    redis = redis_client.connect(redis_url)
    report: dict = {"site": site, "sessions": {}, "mentions": {}, "ip_hashes": [], "notes": []}
    try:
        hashes = {secrets.ip_hash(ip)} if ip else set()
        done: set[str] = set()
        todo = set(sessions) | (await sessions_of(bus, site, hashes) if hashes else set())
        while todo:  # each erased session may reveal another IP hash, hence more sessions
            for session_id in sorted(todo):
                hashes |= await erase_session(bus, redis, site, session_id, report)
                done.add(session_id)
            todo = (await sessions_of(bus, site, hashes)) - done
        await forget_mentions(bus, site, done, report)
        for digest in sorted(hashes):
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
    parser.add_argument("--nats-url", default=None)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    if not args.session and not args.ip:
        parser.error("give --session or --ip")
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    try:
        report = asyncio.run(erase(config, args.redis_url or os.environ.get("REDIS_URL", redis_client.DEFAULT_URL),
                                   args.site, args.session, args.ip, privacy.PrivacySettings.from_env()))
    except Busy as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(report, indent=2))
    return 0
