"""One lead, one delivery: who delivers a conversation's lead, and how it went.

A conversation has one lead (the state keeps its first `LeadCaptured`), so the lead is
named by site and session, whatever else a copy of its event carries: a second
`LeadCaptured` from two booking turns racing, an erased copy republished by
`erase-visitor`, a replay past JetStream's dedupe window. The first event to `create` the
key in the `lead_claims` bucket owns the delivery; the others are duplicates. The claim
names its owner's event id, so a redelivery of the owner (its process died after claiming)
still delivers, and, once the owner stored the outcome, a redelivery reports that outcome
instead of sending again.

The one window left is between the receiver's 2xx and storing the outcome: a crash there
sends again on redelivery, with the same `webhook-id` (`lead_id`) for the receiver to drop.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import msgspec
from nats.js.errors import KeyWrongLastSequenceError

from shared import subjects
from shared.bus import BUS_UNAVAILABLE, Bus

SETTLE_WAIT_S = 20.0
SETTLE_RETRY_S = 0.5


class Outcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The delivery's result: `WebhookRecorded`'s fields."""

    target: str
    ok: bool
    status: int | None = None
    attempts: int = 0
    error: str | None = None
    skipped: bool = False


class Claim(msgspec.Struct, kw_only=True, omit_defaults=True):
    owner: str  # the LeadCaptured event_id that delivers this lead
    outcome: Outcome | None = None  # None: claimed, not (yet) delivered


def lead_id(site: str, session_id: str) -> str:
    """The lead's stable id: the `webhook-id` of every attempt and every copy."""
    return "lead_" + hashlib.blake2b(f"{site}|{session_id}".encode(), digest_size=16).hexdigest()


_decoder = msgspec.json.Decoder(Claim)


class LeadClaims:
    def __init__(self, bus: Bus):
        self.kv = bus.bucket(subjects.LEAD_CLAIM_BUCKET)

    async def claim(self, site: str, session_id: str, event_id: str) -> Claim:
        """A new claim owned by `event_id`, or the claim already there (ours or another's)."""
        key = subjects.kv_key(site, session_id)
        try:
            await self.kv.create(key, msgspec.json.encode(Claim(owner=event_id)))
            return Claim(owner=event_id)
        except KeyWrongLastSequenceError:
            entry = await self.kv.get(key)
            return _decoder.decode(entry.value)

    async def settle(self, site: str, session_id: str, owner: str, outcome: Outcome) -> None:
        """Store the owner's outcome; only the owner writes here, so a plain put is safe.
        The webhook has gone out: an outcome not stored would send it again on the retry, so
        a bucket that does not answer (its stream electing a leader, 4-9 s) is waited out
        for up to `SETTLE_WAIT_S` (a bounded rehearsal sent a lead twice that way)."""
        data = msgspec.json.encode(Claim(owner=owner, outcome=outcome))
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            try:
                await self.kv.put(subjects.kv_key(site, session_id), data)
                return
            except BUS_UNAVAILABLE:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(SETTLE_RETRY_S)
