"""Where a visitor's company can come from, in priority order.

Each source answers a `Lookup` with a profile (status "completed" when it names the
company), None for a miss, or raises `SourceError`. Remote sources run inside `Guarded`:
their own timeout, retries with backoff, and a circuit breaker.
"""

from __future__ import annotations

import asyncio
import csv
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import httpx
import msgspec

from shared import privacy
from shared.events import UNKNOWN, VisitorProfile
from services.enricher.breaker import CircuitBreaker

PROFILE_FIELDS = set(VisitorProfile.__struct_fields__)


class SourceError(Exception):
    """The source answered wrongly (bad status, malformed body) or not at all."""


@dataclass(frozen=True)
class Lookup:
    site: str
    session_id: str
    ip_hash: str | None
    ip: str | None  # raw, from Redis only; never logged or put in an event
    reveal: dict[str, Any] | None
    session_uuid: str | None
    email: str | None


class Source(Protocol):
    name: str

    async def lookup(self, q: Lookup) -> VisitorProfile | None: ...


def profile_from(data: dict[str, Any], source: str) -> VisitorProfile:
    """A provider's JSON object → profile; unknown keys are ignored, values must be strings."""
    if not isinstance(data, dict):
        raise SourceError("malformed response: not a JSON object")
    fields = {k: v for k, v in data.items() if k in PROFILE_FIELDS and k not in ("ip", "source", "status")}
    if any(not isinstance(v, str) for v in fields.values()):
        raise SourceError("malformed response: profile values must be strings")
    named = fields.get("company_name", UNKNOWN) not in ("", UNKNOWN)
    return VisitorProfile(**fields, source=source, status="completed" if named else "partial")


_profile_decoder = msgspec.json.Decoder(VisitorProfile)


@dataclass
class CacheSource:
    """Profiles found in the last `ttl_s`, by IP hash (or session when there is no IP)."""

    redis: Any
    ttl_s: float = 600.0
    name: str = "cache"

    def key(self, q: Lookup) -> str:
        return privacy.cache_key(q.site, q.ip_hash or f"session-{q.session_id}")

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        data = await self.redis.get(self.key(q))
        return _profile_decoder.decode(data) if data else None

    async def store(self, q: Lookup, profile: VisitorProfile) -> None:
        await self.redis.set(self.key(q), msgspec.json.encode(profile), ex=int(self.ttl_s))


@dataclass
class ReturningVisitorSource:
    """Completed profiles of earlier sessions from the same (hashed) IP."""

    redis: Any
    ttl_s: float = 30 * 24 * 3600.0
    name: str = "returning_visitor"

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.ip_hash:
            return None
        data = await self.redis.get(privacy.returning_key(q.site, q.ip_hash))
        if not data:
            return None
        return msgspec.structs.replace(_profile_decoder.decode(data), source=self.name)

    async def store(self, q: Lookup, profile: VisitorProfile) -> None:
        if q.ip_hash:
            await self.redis.set(privacy.returning_key(q.site, q.ip_hash), msgspec.json.encode(profile),
                                 ex=int(self.ttl_s))


@dataclass
class RevealSource:
    """What the widget found in the browser (`visitor.reveal`)."""

    name: str = "reveal"

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.reveal:
            return None
        data = dict(q.reveal)
        if "company" in data and "company_name" not in data:
            data["company_name"] = data.pop("company")
        if "domain" in data and "company_domain" not in data:
            data["company_domain"] = data.pop("domain")
        return profile_from(data, self.name)


@dataclass
class SessionProviderSource:
    """A session-identification API: POST {"session_uuid"} → profile JSON."""

    url: str
    api_key: str
    client: httpx.AsyncClient
    name: str = "session_provider"

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.session_uuid:
            return None
        response = await self.client.post(self.url, json={"session_uuid": q.session_uuid},
                                          headers=_auth(self.api_key))
        return _http_profile(response, self.name)


@dataclass
class IpApiSource:
    """A server-side IP enrichment API: GET ?ip=… → profile JSON."""

    url: str
    api_key: str
    client: httpx.AsyncClient
    name: str = "ip_api"

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.ip:
            return None
        response = await self.client.get(self.url, params={"ip": q.ip}, headers=_auth(self.api_key))
        return _http_profile(response, self.name)


@dataclass
class IpinfoSource(IpApiSource):
    """IPinfo (ipinfo.io), an IP-to-company API: GET <url>/<ip>/json with the token as a
    bearer, mapped by `ipinfo_profile`. A bogon (private) address or a 404 ("Wrong ip") is a
    miss; a 429 (the plan's limit) or a refused token is a failure the breaker counts."""

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.ip:
            return None
        response = await self.client.get(f"{self.url.rstrip('/')}/{q.ip}/json", headers=_auth(self.api_key))
        return _http_profile(response, self.name, ipinfo_profile)


IPINFO_NETWORKS = ("isp", "hosting")  # an address of a carrier or a cloud: not the visitor's company
IPINFO_SECTORS = {"education": "Education", "government": "Government"}


def ipinfo_profile(data: Any, source: str) -> VisitorProfile | None:
    """IPinfo's answer → profile. `company` (paid plans: name, domain, type) says who uses the
    address, else `asn` (name, domain, type), else `org` ("AS15169 Google LLC": only the
    network's owner). A type of isp or hosting names a carrier or a cloud, not who is visiting:
    a miss. With a business, education or government type the profile is completed; with no
    type (`org` alone) it only says whose network it is: partial, the chain goes on."""
    if not isinstance(data, dict):
        raise SourceError("malformed response: not a JSON object")
    if data.get("bogon"):
        return None
    company = data.get("company") if isinstance(data.get("company"), dict) else {}
    asn = data.get("asn") if isinstance(data.get("asn"), dict) else {}
    found = company or asn
    kind = str(found.get("type") or "").lower()
    if kind in IPINFO_NETWORKS:
        return None
    name = str(found.get("name") or "")
    org = data.get("org")
    if not name and isinstance(org, str):
        name = org.split(" ", 1)[1] if org.startswith("AS") and " " in org else org
    if not name:
        return None
    fields = {"company_name": name[:200]}
    if found.get("domain"):
        fields["company_domain"] = str(found["domain"])[:253]
    if kind in IPINFO_SECTORS:
        fields["sector"] = IPINFO_SECTORS[kind]
    return VisitorProfile(**fields, source=source, status="completed" if kind else "partial")


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _http_profile(response: httpx.Response, name: str,
                  mapped: Callable[[Any, str], VisitorProfile | None] | None = None) -> VisitorProfile | None:
    """A provider's answer: 404 a miss, any other error a failure (said for a plan's limit and a
    refused key), else its JSON mapped onto a profile (`mapped`: Concierge's own format by default)."""
    if response.status_code == 404:
        return None
    if response.status_code == 429:
        raise SourceError("HTTP 429: the plan's request limit")
    if response.status_code in (401, 403):
        raise SourceError(f"HTTP {response.status_code}: the key was refused")
    if response.status_code >= 400:
        raise SourceError(f"HTTP {response.status_code}")
    try:
        data = response.json()
    except ValueError:
        raise SourceError("malformed response: not JSON") from None
    return (mapped or profile_from)(data, name)


@dataclass
class IpDatasetSource:
    """The offline server-side source: a CSV of IP ranges → companies."""

    path: Path
    name: str = "ip_dataset"
    _ranges: list[tuple[Any, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self):
        with open(self.path, newline="") as f:
            for row in csv.DictReader(f):
                network = ipaddress.ip_network(row.pop("cidr"))
                self._ranges.append((network, row))
        # Most specific range first.
        self._ranges.sort(key=lambda item: item[0].prefixlen, reverse=True)

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.ip:
            return None
        try:
            address = ipaddress.ip_address(q.ip)
        except ValueError:
            raise SourceError("not an IP address") from None
        for network, row in self._ranges:
            if address.version == network.version and address in network:
                return profile_from(row, self.name)
        return None


@dataclass
class Guarded:
    """A remote source with its timeout, retries and circuit breaker."""

    source: Source
    timeout_s: float = 0.8
    retries: int = 1
    backoff_s: float = 0.05
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    @property
    def name(self) -> str:
        return self.source.name

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not self.breaker.allow():
            raise SourceError("circuit open")
        last = "failed"
        for attempt in range(self.retries + 1):
            try:
                async with asyncio.timeout(self.timeout_s):
                    profile = await self.source.lookup(q)
                self.breaker.success()
                return profile
            except TimeoutError:
                last = "timeout"
            except (SourceError, httpx.HTTPError) as exc:
                last = f"failed: {exc}" if str(exc) else f"failed: {type(exc).__name__}"
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        self.breaker.failure()
        raise SourceError(last)
