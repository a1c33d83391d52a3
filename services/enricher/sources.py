"""Where a visitor's company can come from, in priority order.

Each source answers a `Lookup` with a profile (status "completed" when it names the
company), None for a miss, or raises `SourceError`. Remote sources (`HttpSource`: a
provider's API, asked with the site's key) run inside `Guarded`: their own timeout, retries
with backoff, a circuit breaker, and a count of every request sent (the cost counter).

One adapter per vendor, each a request and a mapping of the vendor's answer onto the
profile: IPinfo (`ipinfo_profile`), Snitcher Radar (`snitcher_profile`), People Data Labs
(`pdl_profile`); the `concierge` format is Concierge's own profile JSON (`profile_from`).
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol
from urllib.parse import quote, urlsplit

import httpx
import msgspec

from shared import metrics, privacy
from shared.events import UNKNOWN, VisitorProfile
from services.enricher.breaker import CircuitBreaker

PROFILE_FIELDS = set(VisitorProfile.__struct_fields__)


class SourceError(Exception):
    """The source answered wrongly (bad status, malformed body) or not at all. `kind` is how
    the cost counter names it: `rate_limited` (the plan's request rate), `quota` (the plan's
    credits used up), `refused` (the key), `failed` (anything else)."""

    def __init__(self, message: str, kind: str = "failed"):
        super().__init__(message)
        self.kind = kind


# A retry cannot help these: the key, the plan's credits, the plan's rate within milliseconds.
FINAL = ("refused", "quota", "rate_limited")


@dataclass(frozen=True)
class Lookup:
    site: str
    session_id: str
    ip_hash: str | None
    ip: str | None  # raw, from Redis only; never logged or put in an event
    reveal: dict[str, Any] | None
    session_uuid: str | None
    email: str | None
    email_hash: str | None = None  # SHA-256 (hex) of the lower-case address: the widget's, or the given address's
    person_id: str | None = None  # the site's own id of a person it knows


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
class HttpSource:
    """A provider's API, asked with one site's key (`api_key`) and, where the vendor wants
    one in its path, that site's account id there (`account`: Snitcher's tracking script)."""

    url: str
    api_key: str
    client: httpx.AsyncClient
    account: str = ""
    name: str = "remote"

    def asks(self, q: Lookup) -> bool:
        """Whether the lookup has what this API is asked with (else no request: a miss)."""
        return True

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        raise NotImplementedError


@dataclass
class SessionProviderSource(HttpSource):
    """A session-identification API: POST {"session_uuid"} → profile JSON."""

    name: str = "session_provider"

    def asks(self, q: Lookup) -> bool:
        return bool(q.session_uuid)

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not q.session_uuid:
            return None
        response = await self.client.post(self.url, json={"session_uuid": q.session_uuid},
                                          headers=_auth(self.api_key))
        return _http_profile(response, self.name)


@dataclass
class SnitcherSource(SessionProviderSource):
    """Snitcher Radar (docs.snitcher.com), a session-identification API: the site's Radar
    script gives each browser session a `session_uuid`; POST {"session_uuid"} to
    <url>/radar/operator/v1/tracking-scripts/<tracking script id>/company/find with the key as
    a bearer, mapped by `snitcher_profile`. A 404 is a miss, and so is a 202 ("Queued for
    enrichment": not resolved yet, asked again when the visitor's identity changes); a 429 (the
    rate limit), a 403 saying the quota is exceeded, or a refused key are failures the
    breaker counts."""

    def asks(self, q: Lookup) -> bool:
        return bool(q.session_uuid) and bool(self.account)

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not self.asks(q):
            return None
        url = f"{self.url.rstrip('/')}/radar/operator/v1/tracking-scripts/{quote(self.account, safe='')}/company/find"
        response = await self.client.post(url, json={"session_uuid": q.session_uuid},
                                          headers={**_auth(self.api_key), "Accept": "application/json"})
        if response.status_code == 202:
            return None
        if response.status_code == 403 and "quota" in response.text.lower():
            raise SourceError("HTTP 403: the plan's quota is used up", "quota")
        return _http_profile(response, self.name, snitcher_profile)


SNITCHER_CONFIDENCE = {False: "high", True: "medium"}  # `fuzzy`: matched approximately


def snitcher_profile(data: Any, source: str) -> VisitorProfile | None:
    """Snitcher's answer → profile: `company` (name, domain, industry, employee_range,
    location, description; the IP lookup's documented shape, which the session lookup shares)
    names the visitor's company. No company, or a `type` of isp or hosting (a carrier or a
    cloud, not who is visiting): a miss. `fuzzy` (an approximate match) makes the match's
    confidence medium, else high. The country is `company.geo.country` when given, else the
    last part of `company.location` ("…, 1217 JC Hilversum, Netherlands")."""
    if not isinstance(data, dict):
        raise SourceError("malformed response: not a JSON object")
    company = data.get("company") if isinstance(data.get("company"), dict) else {}
    if str(data.get("type") or company.get("type") or "").lower() in IPINFO_NETWORKS:
        return None
    name = _text(company.get("name"))
    if not name:
        return None
    fields = {"company_name": name[:200],
              "company_domain": (_text(company.get("domain")) or _text(data.get("domain")))[:253],
              "company_description": _text(company.get("description"))[:500],
              "sector": _text(company.get("industry"))[:120],
              "company_size": _employees(company.get("employee_range")),
              "country": _country(company)[:80],
              "match_confidence": SNITCHER_CONFIDENCE[bool(data.get("fuzzy"))]}
    return VisitorProfile(**{k: v for k, v in fields.items() if v}, source=source, status="completed")


def _employees(value: Any) -> str:
    """"2-10 employees" → "2-10": sizes compared across vendors."""
    text = _text(value)
    return text.removesuffix(" employees").removesuffix(" employee")[:40]


def _country(company: dict) -> str:
    geo = company.get("geo") if isinstance(company.get("geo"), dict) else {}
    if country := _text(geo.get("country")) or _text(geo.get("country_code")):
        return country
    location = _text(company.get("location"))
    return location.rsplit(",", 1)[-1].strip() if location else ""


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


@dataclass
class IpApiSource(HttpSource):
    """A server-side IP enrichment API: GET ?ip=… → profile JSON."""

    name: str = "ip_api"

    def asks(self, q: Lookup) -> bool:
        return bool(q.ip)

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


def email_hash(q: Lookup) -> str | None:
    """The visitor's e-mail as a person API is asked for it: the SHA-256 of the lower-case
    address (the widget's `email_hash`, or the given address hashed here), never the address."""
    if q.email_hash:
        return q.email_hash
    if q.email:
        return hashlib.sha256(q.email.strip().lower().encode()).hexdigest()
    return None


@dataclass
class PersonApiSource(HttpSource):
    """A person-enrichment API in Concierge's format: GET ?email_hash=…&person_id=… →
    profile JSON of the person's company (e.g. the site's own CRM behind a small service)."""

    name: str = "person_api"

    def asks(self, q: Lookup) -> bool:
        return bool(email_hash(q) or q.person_id)

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not self.asks(q):
            return None
        params = {k: v for k, v in (("email_hash", email_hash(q)), ("person_id", q.person_id)) if v}
        response = await self.client.get(self.url, params=params, headers=_auth(self.api_key))
        return _http_profile(response, self.name)


# Asked of People Data Labs: a match below this likelihood (1-10) is a 404, not a charged match,
# and so is a person whose record names no employer.
PDL_MIN_LIKELIHOOD = 6
PDL_REQUIRED = "job_company_name"


@dataclass
class PdlSource(PersonApiSource):
    """People Data Labs' Person Enrichment API (docs.peopledatalabs.com): GET
    <url>/v5/person/enrich?email_hash=… with the key in `X-Api-Key`, mapped by `pdl_profile`.
    Only the e-mail's SHA-256 is sent. PDL charges per match; `min_likelihood` and `required`
    make a weak match or one without an employer a 404 (a miss, not charged). Its 402 (the
    plan's credits used up), 429 and a refused key are failures the breaker counts."""

    def asks(self, q: Lookup) -> bool:
        return bool(email_hash(q))

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        hashed = email_hash(q)
        if not hashed:
            return None
        response = await self.client.get(
            f"{self.url.rstrip('/')}/v5/person/enrich",
            params={"email_hash": hashed, "min_likelihood": PDL_MIN_LIKELIHOOD, "required": PDL_REQUIRED},
            headers={"X-Api-Key": self.api_key, "Accept": "application/json"})
        return _http_profile(response, self.name, pdl_profile)


def pdl_profile(data: Any, source: str) -> VisitorProfile | None:
    """PDL's answer ({"status": 200, "likelihood": 1-10, "data": {the person}}) → a profile of
    the person's employer only: `job_company_name`, `_website` (its domain), `_industry`,
    `_size`, `_location_country`; the likelihood as the match's confidence (≥ 8 high, ≥ 5
    medium, else low). Nothing about the person (name, addresses, titles) is kept. PDL writes
    names in lower case ("hooli"): those are title-cased."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise SourceError("malformed response: no `data` object")
    person = data["data"]
    name = _text(person.get("job_company_name"))
    if not name:
        return None
    likelihood = data.get("likelihood")
    confidence = "" if not isinstance(likelihood, int) else (
        "high" if likelihood >= 8 else "medium" if likelihood >= 5 else "low")
    fields = {"company_name": (name.title() if name.islower() else name)[:200],
              "company_domain": _domain(_text(person.get("job_company_website")))[:253],
              "sector": _text(person.get("job_company_industry")).capitalize()[:120],
              "company_size": _employees(person.get("job_company_size")),
              "country": _text(person.get("job_company_location_country")).title()[:80],
              "match_confidence": confidence}
    return VisitorProfile(**{k: v for k, v in fields.items() if v}, source=source, status="completed")


def _domain(website: str) -> str:
    """"hooli.com", "https://www.hooli.com/about" → "hooli.com"."""
    if not website:
        return ""
    host = urlsplit(website if "//" in website else f"//{website}").hostname or ""
    return host.removeprefix("www.")


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _http_profile(response: httpx.Response, name: str,
                  mapped: Callable[[Any, str], VisitorProfile | None] | None = None) -> VisitorProfile | None:
    """A provider's answer: 404 a miss, any other error a failure (said for a plan's limits and a
    refused key), else its JSON mapped onto a profile (`mapped`: Concierge's own format by default)."""
    if response.status_code == 404:
        return None
    if response.status_code == 429:
        raise SourceError("HTTP 429: the plan's request limit", "rate_limited")
    if response.status_code == 402:
        raise SourceError("HTTP 402: the plan's credits are used up", "quota")
    if response.status_code in (401, 403):
        raise SourceError(f"HTTP {response.status_code}: the key was refused", "refused")
    if response.status_code >= 400:
        raise SourceError(f"HTTP {response.status_code}")
    try:
        data = response.json()
    except ValueError:
        raise SourceError("malformed response: not JSON") from None
    return (mapped or profile_from)(data, name)


def ip_of(q: Lookup) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The lookup's raw IP as an address (None: none known); a malformed one is a failure."""
    if not q.ip:
        return None
    try:
        return ipaddress.ip_address(q.ip)
    except ValueError:
        raise SourceError("not an IP address") from None


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
        if (address := ip_of(q)) is None:
            return None
        for network, row in self._ranges:
            if address.version == network.version and address in network:
                return profile_from(row, self.name)
        return None


@dataclass
class Guarded:
    """A remote source with its timeout, retries and circuit breaker (one per provider and
    key: a site's refused key opens its own breaker, not every site's), each request it sends
    counted by source, site and outcome (`concierge_enrichment_provider_calls_total`)."""

    source: HttpSource
    timeout_s: float = 0.8
    retries: int = 1
    backoff_s: float = 0.05
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    @property
    def name(self) -> str:
        return self.source.name

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        if not self.source.asks(q):
            return None  # nothing to ask it with: no request, nothing counted
        if not self.breaker.allow():
            raise SourceError("circuit open")
        last = "failed"
        for attempt in range(self.retries + 1):
            outcome = "cancelled"  # the chain's deadline (or the turn's route) ended the request
            try:
                async with asyncio.timeout(self.timeout_s):
                    profile = await self.source.lookup(q)
                self.breaker.success()
                outcome = "miss" if profile is None else "hit" if profile.status == "completed" else "partial"
                return profile
            except TimeoutError:
                outcome = last = "timeout"
            except (SourceError, httpx.HTTPError) as exc:
                outcome = exc.kind if isinstance(exc, SourceError) else "failed"
                last = f"failed: {exc}" if str(exc) else f"failed: {type(exc).__name__}"
                if outcome in FINAL:
                    break
            finally:
                metrics.enrichment_calls.labels(self.name, metrics.site_label(q.site), outcome).inc()
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        self.breaker.failure()
        raise SourceError(last)
