"""enrichment: which company is this visitor from?

On a session's first turn, again when the visitor sends new identifying data, and on the
turn after one whose enrichment fell short for infrastructure reasons (its `trouble`), the
source chain (chain.py, with its Redis and HTTP clients injected) is run. Every turn gets
an `EnrichmentCompleted` (with `ran=False` when nothing needed doing) so that whoever waits
for it never waits in vain. A REDIRECT or BOOKING route for the turn cancels unfinished
work, and the event says so.

The node asks the runner for the session's last `EnrichmentCompleted` (one direct get),
the turn's route and the site's config (its `[enrichment]`: which providers, in which order,
with whose keys), not the conversation's state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

import msgspec

from shared import events as ev
from shared import privacy
from shared.node import Context, Inputs, Needs, Node
from services.enricher.chain import Enricher
from services.enricher.sources import Lookup

log = logging.getLogger(__name__)

NAME = "enrichment"
IDENTIFYING = ("reveal", "email", "session_uuid", "person_id", "email_hash")  # a change of any: enrich again


def identity_fingerprint(visitor: dict | None) -> str | None:
    if not visitor:
        return None
    present = {k: visitor[k] for k in IDENTIFYING if visitor.get(k)}
    if not present:
        return None
    return hashlib.sha256(json.dumps(present, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_node(enricher: Enricher) -> Node:
    async def enrich(event: ev.TurnRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        visitor = event.visitor or {}
        fingerprint = identity_fingerprint(visitor)
        seen_key = privacy.seen_key(event.site, event.session_id)
        new_identity = False
        if fingerprint:
            previous = await _safe(enricher.redis.get(seen_key))
            new_identity = previous is None or previous.decode() != fingerprint
        if event.turn != 1 and not new_identity and not fell_short(inputs.latest["enrichment_completed"]):
            return [ctx.follow(ev.EnrichmentCompleted, profile=ev.VisitorProfile(), ran=False)]

        trouble: list[str] = []
        try:
            raw_ip = await enricher.redis.get(privacy.raw_ip_key(event.site, event.session_id))
        except Exception as exc:  # noqa: BLE001 - Redis down: IP sources skipped, retried next turn
            log.warning("redis unavailable for the raw IP", extra={"error": repr(exc)})
            raw_ip, trouble = None, ["redis unavailable"]
        if raw_ip is None and event.ip_hash and not trouble:
            trouble.append("raw IP missing")  # the gateway saw an address that did not reach Redis
        reveal = visitor.get("reveal") if isinstance(visitor.get("reveal"), dict) else None
        q = Lookup(
            site=event.site, session_id=event.session_id, ip_hash=event.ip_hash,
            ip=raw_ip.decode() if raw_ip else None, reveal=reveal,
            session_uuid=str(visitor["session_uuid"]) if visitor.get("session_uuid") else None,
            email=str(visitor["email"]) if visitor.get("email") else None,
            email_hash=str(visitor["email_hash"]) if visitor.get("email_hash") else None,
            person_id=str(visitor["person_id"]) if visitor.get("person_id") else None,
        )
        statuses: dict[str, str] = {}
        chain = enricher.chain(fresh=event.turn != 1, config=inputs.config.enrichment, site=event.site)
        work = asyncio.create_task(enricher.run(q, chain, statuses))
        cancelled = await inputs.route.race(work)
        if cancelled:
            for name, status in statuses.items():
                if status == "running":
                    statuses[name] = "cancelled"
            for source in chain:
                statuses.setdefault(source.name, "cancelled")
            return [ctx.follow(ev.EnrichmentCompleted, profile=ev.VisitorProfile(), sources=statuses,
                               cancelled=True)]
        profile = work.result()
        if q.email and profile.email in ("", ev.UNKNOWN):
            profile = msgspec.structs.replace(profile, email=q.email)
        profile = msgspec.structs.replace(profile, ip=event.ip_hash or ev.UNKNOWN)
        await enricher.remember(q, profile, statuses)
        if fingerprint:
            await _safe(enricher.redis.set(seen_key, fingerprint, ex=24 * 3600))
        if profile.status != "completed":
            trouble += [f"{name}: {status}" for name, status in statuses.items()
                        if status.startswith(("failed", "timeout", "circuit"))]
        else:
            trouble = []
        return [ctx.follow(ev.EnrichmentCompleted, profile=profile, sources=statuses, trouble=trouble)]

    return Node(name=NAME, consumes=("turn_requested",), handle=enrich,
                needs=Needs(latest=("enrichment_completed",), route=True, config=True))


def fell_short(last: ev.Envelope | None) -> bool:
    """The session's last enrichment fell short for infrastructure reasons (its `trouble`):
    this turn tries again, so an outage costs a turn's profile, not the session's."""
    return isinstance(last, ev.EnrichmentCompleted) and bool(last.trouble)


async def _safe(awaitable):
    """Redis reads and writes around the chain: trouble is logged, not fatal."""
    try:
        return await awaitable
    except Exception as exc:
        log.warning("redis unavailable for enrichment bookkeeping", extra={"error": repr(exc)})
        return None
