"""The enrichment source chain: which company is this visitor from, asked of the sources in
priority order until one returns a completed profile, all within one deadline; completed
profiles are remembered in the cache and the returning-visitor store. Run by the
`enrichment` node (enrichment.py).

The chain of a lookup is made from the site's config (`[enrichment]`): cache → returning
visitor → the local sources (the browser's reveal) → the site's remote providers in its
order → the offline IP data when no IP API is asked. A provider is asked with the site's
own key (a variable its config names, whose value is bound to the site and the provider) or
else the deployment's; with neither a vendor is not called at all, and its status says so
(`skipped: no key`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from shared import events as ev
from shared.site_config import ENRICHMENT_SOURCES, Enrichment
from shared.state import merge_visitor_profiles
from services.enricher.sources import CacheSource, Guarded, HttpSource, Lookup, ReturningVisitorSource, SourceError

log = logging.getLogger(__name__)

# A site that names no order: the providers that need nothing of the visitor's person. The
# person API receives a hash of the visitor's e-mail, personal data a site's privacy notice
# must cover: only a site that lists it asks it.
# Guarded adapters a provider keeps (one per key and account: the deployment's, each site's own).
GUARDED = 512
DEFAULT_ORDER = tuple(name for name in ENRICHMENT_SOURCES if name != "person_api")


@dataclass(frozen=True)
class Skipped:
    """A provider of the site's chain that is not called; `why` is its status."""

    name: str
    why: str


@dataclass
class Provider:
    """A remote source as the deployment configured it (ENRICH_<SOURCE>_*): its adapter made
    for a key and an account (`make`), wrapped in its guard (`guard`: timeout, retries, a
    breaker), one per key and account, so each site's key has its own breaker."""

    name: str  # session_provider | person_api | ip_api
    make: Callable[[str, str], HttpSource]
    guard: Callable[[HttpSource], Guarded]
    key: str = ""  # the deployment's
    account: str = ""  # the deployment's
    needs_account: bool = False  # the vendor wants an account id in its path (Snitcher)
    # A vendor's API takes no request without a key; a `concierge`-format service (a stand-in,
    # the site's own) may be open inside the deployment, so it is called without one.
    keyed: bool = True
    # (key, account) → its guarded adapter (with its circuit breaker), the GUARDED used last:
    # sites with keys of their own must not grow it without end.
    _guarded: OrderedDict[tuple[str, str], Guarded] = field(default_factory=OrderedDict)

    def for_site(self, site: str, config: Enrichment, site_keys: dict[str, str]) -> Guarded | Skipped:
        """The guarded adapter with the site's key, or why it is not called.

        A site's own key is the value of the variable its config names, written
        `<site id>:<source>:<key>`: bound to that site and that provider, so a config naming
        another site's variable, or one made for another vendor, gets no key (and the status
        does not say which variables exist). With its own key the site may name its own
        account; with the deployment's key, the deployment's account is used."""
        variable = getattr(config, f"{self.name}_key_env", "")
        account = self.account
        if variable:  # the site's own account: never billed to the deployment's
            bound_site, _, rest = site_keys.get(variable, "").partition(":")
            source, _, key = rest.partition(":")
            if bound_site != site or source != self.name or not key.strip():
                return Skipped(self.name, "skipped: no key")
            key = key.strip()
            account = getattr(config, f"{self.name}_account", "") or self.account
        elif not (key := self.key) and self.keyed:
            return Skipped(self.name, "skipped: no key")
        if self.needs_account and not account:
            return Skipped(self.name, "skipped: no account")
        guarded = self._guarded.get((key, account))
        if guarded is None:
            guarded = self._guarded[key, account] = self.guard(self.make(key, account))
            while len(self._guarded) > GUARDED:
                self._guarded.popitem(last=False)
        self._guarded.move_to_end((key, account))
        return guarded


@dataclass
class Enricher:
    redis: Any
    cache: CacheSource
    returning: ReturningVisitorSource
    sources: list  # the local ones, in priority order, after cache and returning visitor
    providers: dict[str, Provider] = field(default_factory=dict)  # by source name: those configured
    ip_fallback: list = field(default_factory=list)  # last, when no IP API is asked: the offline data
    site_keys: dict[str, str] = field(default_factory=dict)  # the ENRICH_KEY_… variables
    deadline_s: float = 1.5

    def chain(self, fresh: bool, config: Enrichment | None = None, site: str = "") -> list:
        """`fresh`: the visitor sent new identifying data, so what was stored about them is
        not asked first. `config`: the site `site`'s `[enrichment]` (its providers' order and keys)."""
        config = config or Enrichment()
        remote: list = []
        for name in DEFAULT_ORDER if config.sources is None else config.sources:
            if name in self.providers:
                remote.append(self.providers[name].for_site(site, config, self.site_keys))
            elif config.sources is not None:  # named by the site, not offered by the deployment
                remote.append(Skipped(name, "skipped: not configured"))
        ip_asked = any(s.name == "ip_api" and not isinstance(s, Skipped) for s in remote)
        return (([] if fresh else [self.cache, self.returning]) + self.sources + remote
                + ([] if ip_asked else self.ip_fallback))

    async def run(self, q: Lookup, chain: list, statuses: dict[str, str]) -> ev.VisitorProfile:
        """Try `chain` in order; record each source's outcome in `statuses` as it goes."""
        profile = ev.VisitorProfile()
        started = time.monotonic()
        for source in chain:
            if isinstance(source, Skipped):
                statuses[source.name] = source.why
                continue
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
