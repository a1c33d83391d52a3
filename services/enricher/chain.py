"""The enrichment source chain: which company is this visitor from, asked of the sources in
priority order until one returns a completed profile, all within one deadline; completed
profiles are remembered in the cache and the returning-visitor store. Run by the
`enrichment` node (enrichment.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from shared import events as ev
from shared.state import merge_visitor_profiles
from services.enricher.sources import CacheSource, Lookup, ReturningVisitorSource, SourceError

log = logging.getLogger(__name__)


@dataclass
class Enricher:
    redis: Any
    cache: CacheSource
    returning: ReturningVisitorSource
    sources: list  # the rest, in priority order, after cache and returning visitor
    deadline_s: float = 1.5

    def chain(self, fresh: bool) -> list:
        """`fresh`: the visitor sent new identifying data, so what was stored about them is
        not asked first."""
        return ([] if fresh else [self.cache, self.returning]) + self.sources

    async def run(self, q: Lookup, chain: list, statuses: dict[str, str]) -> ev.VisitorProfile:
        """Try `chain` in order; record each source's outcome in `statuses` as it goes."""
        profile = ev.VisitorProfile()
        started = time.monotonic()
        for source in chain:
            if profile.status == "completed":
                statuses[source.name] = "skipped: an earlier source hit"
                continue
            remaining = self.deadline_s - (time.monotonic() - started)
            if remaining <= 0:
                statuses[source.name] = "skipped: deadline"
                continue
            statuses[source.name] = "running"
            try:
                async with asyncio.timeout(remaining):
                    found = await source.lookup(q)
            except TimeoutError:
                statuses[source.name] = "timeout"
                continue
            except SourceError as exc:
                text = str(exc)
                statuses[source.name] = text if text.startswith(("failed", "timeout", "circuit")) else f"failed: {text}"
                continue
            except Exception as exc:  # a store (Redis) being down must not end the chain
                statuses[source.name] = f"failed: {type(exc).__name__}"
                log.warning("enrichment source failed", extra={"source": source.name, "error": repr(exc)})
                continue
            if found is None:
                statuses[source.name] = "miss"
                continue
            statuses[source.name] = "hit" if found.status == "completed" else "partial"
            profile = merge_visitor_profiles(profile, found)
            if found.status == "completed":
                profile = msgspec.structs.replace(profile, status="completed", source=found.source)
        return profile

    async def remember(self, q: Lookup, profile: ev.VisitorProfile, statuses: dict[str, str]) -> None:
        if profile.status != "completed":
            return
        try:
            if statuses.get(self.cache.name) != "hit":
                await self.cache.store(q, profile)
            if profile.source != self.returning.name:
                await self.returning.store(q, profile)
        except Exception as exc:
            log.warning("enrichment result not cached", extra={"error": repr(exc)})
