"""One webhook, one delivery: who delivers a lead or a handoff request, and how it went.

Each kind of webhook has a KV bucket of claims, one key per thing it notifies about:
- a lead (`lead_claims`, key `<site>.<session>`). A conversation has one lead (the state
  keeps its first `LeadCaptured`), so the lead is named by site and session, whatever else a
  copy of its event carries: a second `LeadCaptured` from two booking turns racing, an
  erased copy republished by `erase-visitor`, a replay past JetStream's dedupe window;
- a handoff request (`handoff_deliveries`, key `<site>.<session>.<event id>`). A
  conversation may ask for a person again after a handoff ended, and each request is
  notified: named by its `HandoffRequested` event id (a redelivered handler makes the same
  id, an erased copy keeps it).
The first event to `create` the key owns the delivery; the others are duplicates. The claim
names its owner's event id, so a redelivery of the owner (its process died after claiming)
still delivers, and, once the owner stored the outcome, a redelivery reports that outcome
instead of sending again.

A claim also says when its owner's attempt began (`since`): a second attempt of the same
event (the first one's process frozen past its ack wait, or its ack lost) waits for the
first's outcome for up to LEASE_S rather than send beside it, and takes the delivery over
only once the first is presumed dead. The one window left is between the receiver getting the
request and storing the outcome, in a process that dies there: its redelivery sends again,
with the same `webhook-id` (`lead_id`, `handoff_id`) for the receiver to drop, and the
outcome counts that attempt as `uncertain`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Awaitable, Callable

import msgspec
from nats.js.errors import KeyWrongLastSequenceError

from shared import subjects
from shared.bus import BUS_UNAVAILABLE, Bus

SETTLE_WAIT_S = 20.0
SETTLE_RETRY_S = 0.5
# How long an attempt's claim keeps another attempt of the same event from sending: longer
# than one delivery takes (LEAD_WEBHOOK_ATTEMPTS × timeout and backoff, 25 s by default).
LEASE_S = 30.0


class Outcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The delivery's result: `WebhookRecorded`'s fields."""

    target: str
    ok: bool
    status: int | None = None
    attempts: int = 0
    error: str | None = None
    skipped: bool = False
    # Attempts whose fate is unknown, so the receiver may hold a copy more than the one that
    # succeeded: a request sent and never answered (timed out, cut), or the attempt of an
    # earlier delivery of this event that died (or froze past its lease) before storing its
    # outcome. Only these can reach a receiver twice, with the same `webhook-id`.
    uncertain: int = 0


class Claim(msgspec.Struct, kw_only=True, omit_defaults=True):
    owner: str  # the event_id that delivers this lead or handoff request
    outcome: Outcome | None = None  # None: claimed, not (yet) delivered
    since: float = 0.0  # when the owner's latest attempt claimed it (wall clock)
    taken_over: bool = False  # returned by `claim` only: an earlier attempt's claim, taken over


def lead_id(site: str, session_id: str) -> str:
    """The lead's stable id: the `webhook-id` of every attempt and every copy."""
    return "lead_" + hashlib.blake2b(f"{site}|{session_id}".encode(), digest_size=16).hexdigest()


def handoff_id(site: str, session_id: str, event_id: str) -> str:
    """A handoff request's stable id: the `webhook-id` of every attempt and every copy."""
    return "handoff_" + hashlib.blake2b(f"{site}|{session_id}|{event_id}".encode(), digest_size=16).hexdigest()


def lead_key(site: str, session_id: str, event_id: str) -> str:
    return subjects.kv_key(site, session_id)  # one lead per conversation, whichever event carries it


def handoff_key(site: str, session_id: str, event_id: str) -> str:
    return f"{subjects.kv_key(site, session_id)}.{event_id}"


_decoder = msgspec.json.Decoder(Claim)


class WebhookClaims:
    """The claims of one kind of webhook: its bucket, and the key an event's claim is under
    (`key(site, session_id, event_id)`)."""

    def __init__(self, bus: Bus, bucket: str, key: Callable[[str, str, str], str]):
        self.kv = bus.bucket(bucket)
        self.key = key

    async def claim(self, site: str, session_id: str, event_id: str) -> Claim:
        """A new claim owned by `event_id`, or the claim already there: another's (a
        duplicate), or ours with its outcome. Ours without one is another attempt of this
        event still sending: its outcome is waited for while its lease lasts, then the
        delivery is taken over (a claim with no outcome returned: send)."""
        key = self.key(site, session_id, event_id)
        try:
            await self.kv.create(key, msgspec.json.encode(Claim(owner=event_id, since=time.time())))
            return Claim(owner=event_id)
        except KeyWrongLastSequenceError:
            pass
        while True:
            entry = await self.kv.get(key)
            claim = _decoder.decode(entry.value)
            if claim.owner != event_id or claim.outcome is not None:
                return claim
            wait = claim.since + LEASE_S - time.time()
            if wait <= 0:
                try:  # compare-and-set: of two late attempts, one takes it over
                    await self.kv.update(key, msgspec.json.encode(Claim(owner=event_id, since=time.time())),
                                         last=entry.revision)
                    return Claim(owner=event_id, taken_over=True)
                except KeyWrongLastSequenceError:
                    continue
            await asyncio.sleep(min(SETTLE_RETRY_S, wait))

    async def settle(self, site: str, session_id: str, owner: str, outcome: Outcome) -> None:
        """Store the owner's outcome; only the owner writes here, so a plain put is safe.
        The webhook has gone out: an outcome not stored would send it again on the retry, so
        a bucket that does not answer (its stream electing a leader, 4-9 s) is waited out
        for up to `SETTLE_WAIT_S` (a bounded rehearsal sent a lead twice that way)."""
        data = msgspec.json.encode(Claim(owner=owner, outcome=outcome))
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            try:
                await self.kv.put(self.key(site, session_id, owner), data)
                return
            except BUS_UNAVAILABLE:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(SETTLE_RETRY_S)


def for_leads(bus: Bus) -> WebhookClaims:
    return WebhookClaims(bus, subjects.LEAD_CLAIM_BUCKET, lead_key)


def for_handoffs(bus: Bus) -> WebhookClaims:
    return WebhookClaims(bus, subjects.HANDOFF_DELIVERY_BUCKET, handoff_key)


async def deliver_once(claims: WebhookClaims, site: str, session_id: str, event_id: str,
                       send: Callable[[], Awaitable[Outcome]]) -> Claim:
    """The claim of `event_id`'s delivery, with its outcome: sent now (`send`) when this event
    owns the claim and no outcome is stored yet; another owner's claim (a duplicate) is
    returned as it is, and nothing is sent."""
    claim = await claims.claim(site, session_id, event_id)
    if claim.owner != event_id or claim.outcome is not None:
        return claim
    outcome = await send()
    if claim.taken_over:  # the attempt before may have sent it, and died before saying so
        outcome = msgspec.structs.replace(outcome, uncertain=outcome.uncertain + 1)
    await claims.settle(site, session_id, event_id, outcome)
    return Claim(owner=event_id, outcome=outcome)
