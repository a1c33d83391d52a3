"""What may be stored about a visitor, and how it is keyed.

A raw IP never enters the event log or the logs: events carry `ip_hash` (a keyed HMAC,
truncated). The raw IP lives only in Redis, under a short TTL, for the enrichment
providers that need it, and is erased with the visitor.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any, Iterable

import msgspec

from shared import events as ev
from shared.config import Settings, env_float, env_str

# A deployment sets its own secret, so hashes cannot be reversed by hashing all IPv4s.
DEV_SECRET = "concierge-dev-only-ip-secret"


class PrivacySettings(Settings):
    """The IP hash's key (IP_HASH_SECRET) and how long a raw IP stays in Redis (RAW_IP_TTL_S)."""

    SECRETS = ("ip_hash_secret",)
    ip_hash_secret: str = DEV_SECRET
    raw_ip_ttl_s: float = 900.0

    @classmethod
    def from_env(cls) -> "PrivacySettings":
        d = cls()
        return cls(ip_hash_secret=env_str("IP_HASH_SECRET", d.ip_hash_secret),
                   raw_ip_ttl_s=env_float("RAW_IP_TTL_S", d.raw_ip_ttl_s))

    def ip_hash(self, ip: str) -> str:
        return ip_hash(ip, self.ip_hash_secret)


def ip_hash(ip: str, secret: str) -> str:
    return hmac.new(secret.encode(), ip.strip().encode(), hashlib.sha256).hexdigest()[:16]


def raw_ip_key(site: str, session_id: str) -> str:
    return f"concierge:rawip:{site}:{session_id}"


def cache_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:cache:{site}:{ip_digest}"


def returning_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:visitor:{site}:{ip_digest}"


def seen_key(site: str, session_id: str) -> str:
    return f"concierge:enrich:seen:{site}:{session_id}"


REDACTED = "[redacted]"
# The header on an erased visitor's events as `concierge erase-visitor` stores them again:
# nodes ack such a copy unhandled (shared/consumer.py), so the erase makes no answer, model
# call, webhook or analytics event again.
ERASED_COPY = "Concierge-Erased"
# The header on an event of another conversation the erase rewrites (one that mentions the
# visitor): the durables that had acked the original, comma-separated; they ack the copy
# unhandled, and every other node (one the original was pending for, or made since) handles it.
SETTLED_COPY = "Concierge-Settled"
# An e-mail address in free text, wherever one is looked for (redaction, the router's
# booking rule, the booking flow, the form-field extractor): the domain is dot-separated
# labels, none empty, ending in a TLD of two letters or more.
EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def _scrub(text: str) -> str:
    return EMAIL_RE.sub(REDACTED, text)


def email_hash(email: str) -> str:
    """What the widget's `visitor.email_hash` is of an address: SHA-256 of it in lower case."""
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()


# The identifiers the widget may send that name the person (not the company).
IDENTIFIERS = ("person_id", "email_hash", "session_uuid", "email")
MIN_IDENTIFIER_CHARS = 4  # shorter ids ("42") are not looked for in free text: too many false hits


def identifiers(events: Iterable[ev.Envelope]) -> set[str]:
    """What names the visitor in a conversation's log, wherever else it may be copied: the IP
    hash, the ids the widget sent (`IDENTIFIERS`), the e-mail of a lead or a profile."""
    found: set[str] = set()
    for event in events:
        match event:
            case ev.TurnRequested():
                if event.ip_hash and event.ip_hash != REDACTED:
                    found.add(event.ip_hash)
                visitor = event.visitor or {}
                found |= {visitor[k] for k in IDENTIFIERS if isinstance(visitor.get(k), str)}
            case ev.LeadCaptured():
                found.add(event.email)
            case ev.EnrichmentCompleted() | ev.ProfileInferred():
                found.add(event.profile.email)
    return {i for i in found if len(i) >= MIN_IDENTIFIER_CHARS and i not in (REDACTED, ev.UNKNOWN)}


# An envelope's own fields: ids and positions, never personal data.
ENVELOPE = frozenset(ev.Envelope.__struct_fields__)


def _known_re(known: Iterable[str]) -> re.Pattern | None:
    ids = sorted(set(known), key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, ids)) + r")(?!\w)") if ids else None


def _scrub_all(value: Any, known: re.Pattern | None) -> Any:
    """Every string in `value` (builtins: dicts, lists, strings) scrubbed of e-mail addresses
    and of the visitor's identifiers."""
    if isinstance(value, str):
        text = _scrub(value)
        return known.sub(REDACTED, text) if known else text
    if isinstance(value, dict):
        return {k: _scrub_all(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_all(v, known) for v in value]
    return value


def _everywhere(event: ev.Envelope, known: re.Pattern | None) -> dict:
    """The fields of `event` (not its envelope) that still hold an e-mail address or one of
    the visitor's identifiers in some string, scrubbed: what no event-specific rule covers
    (a search query, an operator's message, an identifier quoted in a prompt)."""
    changes = {}
    for field in msgspec.structs.fields(event):
        if field.name in ENVELOPE:
            continue
        value = msgspec.to_builtins(getattr(event, field.name))
        scrubbed = _scrub_all(value, known)
        if scrubbed == value:
            continue
        try:
            changes[field.name] = msgspec.convert(scrubbed, field.type)
        except msgspec.ValidationError:
            # An identifier the visitor chose can equal a value of the field's type (a
            # `person_id` "ANSWER" and a route): such a field holds no free text, it stays.
            continue
    return changes


def _profile(profile: ev.VisitorProfile) -> ev.VisitorProfile:
    return msgspec.structs.replace(
        profile,
        ip=REDACTED if profile.ip not in ("", ev.UNKNOWN) else profile.ip,
        email=REDACTED if profile.email not in ("", ev.UNKNOWN) else profile.email,
    )


def _brief_inputs(inputs: ev.BriefInputs) -> ev.BriefInputs:
    return msgspec.structs.replace(
        inputs,
        email=REDACTED if inputs.email else "",
        capture_context=_scrub(inputs.capture_context),
        transcript=[msgspec.structs.replace(m, content=_scrub(m.content)) for m in inputs.transcript],
        profile=_profile(inputs.profile),
        form_fields={k: REDACTED for k in inputs.form_fields},
        similar_leads=[msgspec.structs.replace(lead, summary=_scrub(lead.summary)) for lead in inputs.similar_leads],
    )


def redact_log(events: list[ev.Envelope]) -> list[tuple[ev.Envelope, list[str]]]:
    """A conversation's events redacted (`redact`), each with the fields it touched; the
    visitor's identifiers are those the log itself holds (`identifiers`)."""
    known = identifiers(events)
    return [redact(event, known) for event in events]


def redact(event: ev.Envelope, known: Iterable[str] = ()) -> tuple[ev.Envelope, list[str]]:
    """The event with its personal data removed, and the names of the fields it touched.

    Personal data: the visitor object the widget sent (its person_id, email_hash,
    session_uuid, reveal, e-mail, pages), IP hashes, e-mail addresses in profiles, form
    fields, a vote's reason, and, in every other string of the event (messages, prompts,
    answers, search queries, operators' messages, a lead's brief, its call script and what
    its brief was written from), e-mail addresses and the visitor's `known` identifiers."""
    changes: dict = {}
    match event:
        case ev.TurnRequested():
            if event.visitor:
                changes["visitor"] = None
            if event.ip_hash and event.ip_hash != REDACTED:
                changes["ip_hash"] = REDACTED
            if _scrub(event.message) != event.message:
                changes["message"] = _scrub(event.message)
            if event.previous and _scrub(event.previous) != event.previous:
                changes["previous"] = _scrub(event.previous)
        case ev.EnrichmentCompleted() | ev.ProfileInferred():
            if (fixed := _profile(event.profile)) != event.profile:
                changes["profile"] = fixed
        case ev.LLMCallRecorded():
            call = event.call
            messages = [{**m, "content": _scrub(m["content"])} if isinstance(m.get("content"), str) else m
                        for m in call.messages]
            fixed = msgspec.structs.replace(call, messages=messages, response_text=_scrub(call.response_text))
            if fixed != call:
                changes["call"] = fixed
        case ev.ResponseCompleted():
            if _scrub(event.text) != event.text:
                changes["text"] = _scrub(event.text)
        case ev.FormFieldsExtracted():
            if event.values:
                changes["values"] = {k: REDACTED for k in event.values}
        case ev.BookingProgressed():
            if event.collected:
                changes["collected"] = {k: REDACTED for k in event.collected}
        case ev.FeedbackGiven():
            if event.reason and event.reason != REDACTED:
                changes["reason"] = REDACTED
        case ev.LeadCaptured():
            if event.email != REDACTED:
                changes["email"] = REDACTED
        case ev.TurnCompleted():
            profile = event.metadata.get("visitor_profile")
            if isinstance(profile, dict) and any(profile.get(k) not in (None, "", ev.UNKNOWN) for k in ("ip", "email")):
                cleaned = {**profile, **{k: REDACTED for k in ("ip", "email")
                                         if profile.get(k) not in (None, "", ev.UNKNOWN)}}
                changes["metadata"] = {**event.metadata, "visitor_profile": cleaned}
        case ev.BriefGathered():
            if (fixed := _brief_inputs(event.inputs)) != event.inputs:
                changes["inputs"] = fixed
        case ev.BriefDrafted():
            if _scrub(event.text) != event.text:
                changes["text"] = _scrub(event.text)
        case ev.BriefEvaluated():
            if [_scrub(i) for i in event.issues] != event.issues:
                changes["issues"] = [_scrub(i) for i in event.issues]
        case ev.BriefCompleted():
            for name in ("brief", "call_script", "summary"):
                if _scrub(getattr(event, name)) != getattr(event, name):
                    changes[name] = _scrub(getattr(event, name))
            if [_scrub(i) for i in event.issues] != event.issues:
                changes["issues"] = [_scrub(i) for i in event.issues]
        case ev.BriefFailed():
            if _scrub(event.reason) != event.reason:
                changes["reason"] = _scrub(event.reason)
    fixed, touched = _changed(event, changes)
    rest = _everywhere(fixed, _known_re(known))
    if not rest:
        return fixed, touched
    return msgspec.structs.replace(fixed, **rest), sorted(set(touched) | set(rest))


def forget_mentions(event: ev.Envelope, sessions: set[str]) -> tuple[ev.Envelope, list[str]]:
    """An event of another conversation with what it says about the leads of `sessions`
    removed: their reasons in a site's triage, their summaries among a brief's similar
    leads. (Which leads they were stays: an id, no personal data.)"""
    changes: dict = {}
    match event:
        case ev.TriageCompleted() if any(item.session_id in sessions for item in event.items):
            changes["items"] = [msgspec.structs.replace(item, reason=REDACTED) if item.session_id in sessions
                                else item for item in event.items]
        case ev.BriefGathered() if any(lead.session_id in sessions for lead in event.inputs.similar_leads):
            similar = [msgspec.structs.replace(lead, summary=REDACTED) if lead.session_id in sessions else lead
                       for lead in event.inputs.similar_leads]
            changes["inputs"] = msgspec.structs.replace(event.inputs, similar_leads=similar)
    return _changed(event, changes)


def _changed(event: ev.Envelope, changes: dict) -> tuple[ev.Envelope, list[str]]:
    if not changes:
        return event, []
    return msgspec.structs.replace(event, **changes), sorted(changes)
