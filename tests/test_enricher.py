"""The enrichment source chain (chain.py) and its sources against a real Redis and a local
HTTP server playing the providers. The `enrichment` node itself: tests/test_enrichment.py."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from shared import privacy
from services.enricher.breaker import CircuitBreaker
from services.enricher.chain import Enricher
from services.enricher.settings import DATASET
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, IpDatasetSource, IpinfoSource, Lookup, ReturningVisitorSource, RevealSource,
    SessionProviderSource,
)

KEYS = privacy.PrivacySettings()  # the development IP hash key



@pytest.fixture
async def client():
    async with httpx.AsyncClient() as c:
        yield c


def lookup(site="acme", ip="127.0.0.1", reveal=None, session_uuid=None, session=None):
    return Lookup(site=site, session_id=session or uuid.uuid4().hex, ip_hash=KEYS.ip_hash(ip) if ip else None,
                  ip=ip, reveal=reveal, session_uuid=session_uuid, email=None)


def make(redis, sources, deadline_s=1.5):
    return Enricher(redis=redis, cache=CacheSource(redis), returning=ReturningVisitorSource(redis),
                    sources=sources, deadline_s=deadline_s)


async def run(enricher, q, fresh=False):
    statuses: dict[str, str] = {}
    profile = await enricher.run(q, enricher.chain(fresh), statuses)
    await enricher.remember(q, profile, statuses)
    return profile, statuses


def provider(kind, providers, client, path, **guard):
    cls = SessionProviderSource if kind == "session" else IpApiSource
    return Guarded(cls(f"{providers.url}/{path}", "secret", client), **{"timeout_s": 0.5, "retries": 1, **guard})


async def test_first_completed_source_wins_in_priority_order(redis, providers, client):
    site = f"s{uuid.uuid4().hex[:8]}"
    session_provider = provider("session", providers, client, "fast")
    before = providers.hits["fast"]
    e = make(redis, [RevealSource(), session_provider, IpDatasetSource(DATASET)])
    profile, statuses = await run(e, lookup(site, reveal={"company": "Reveal Corp", "sector": "Media"},
                                            session_uuid="u1"))
    assert profile.company_name == "Reveal Corp" and profile.source == "reveal" and profile.status == "completed"
    assert list(statuses) == ["cache", "returning_visitor", "reveal", "session_provider", "ip_dataset"]
    assert statuses["cache"] == "miss" and statuses["returning_visitor"] == "miss" and statuses["reveal"] == "hit"
    assert statuses["session_provider"].startswith("skipped") and providers.hits["fast"] == before


async def test_session_provider_then_cache_then_returning_visitor(redis, providers, client):
    site = f"s{uuid.uuid4().hex[:8]}"
    e = make(redis, [RevealSource(), provider("session", providers, client, "fast"), IpDatasetSource(DATASET)])
    q = lookup(site, ip="198.51.100.7", session_uuid="u-42")
    profile, statuses = await run(e, q)
    assert profile.company_name == "Hooli" and statuses["session_provider"] == "hit"
    assert providers.seen[-1]["auth"] == "Bearer secret" and "u-42" in providers.seen[-1]["body"]

    again, statuses = await run(e, q)
    assert statuses["cache"] == "hit" and again.company_name == "Hooli"

    # A later session from the same IP: the cache entry is gone, the returning-visitor lookup knows it.
    await redis.delete(privacy.cache_key(site, q.ip_hash))
    later = lookup(site, ip="198.51.100.7")
    profile, statuses = await run(e, later)
    assert statuses["cache"] == "miss" and statuses["returning_visitor"] == "hit"
    assert profile.company_name == "Hooli" and profile.source == "returning_visitor"


async def test_offline_dataset_names_the_demo_visitor(redis):
    e = make(redis, [RevealSource(), IpDatasetSource(DATASET)])
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="127.0.0.1"))
    assert profile.company_name.startswith("Northwind") and statuses["ip_dataset"] == "hit"
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="10.9.9.9"))
    assert profile.status == "unknown" and statuses["ip_dataset"] == "miss"


async def test_slow_source_never_holds_the_turn_past_the_deadline(redis, providers, client):
    slow = provider("ip", providers, client, "slow", timeout_s=5.0, retries=0)
    e = make(redis, [slow, IpDatasetSource(DATASET)], deadline_s=0.3)
    started = time.monotonic()
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="203.0.113.9"))
    assert time.monotonic() - started < 2.5  # the slow source alone would take 5 s
    assert statuses["ip_api"] == "timeout" and statuses["ip_dataset"] == "skipped: deadline"


async def test_source_timeout_skips_to_the_next_source(redis, providers, client):
    slow = provider("ip", providers, client, "slow", timeout_s=0.2, retries=0)
    e = make(redis, [slow, IpDatasetSource(DATASET)], deadline_s=1.5)
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="203.0.113.9"))
    assert statuses["ip_api"] == "timeout" and statuses["ip_dataset"] == "hit"
    assert profile.company_name == "Acme Retail"


async def test_failing_source_is_retried_then_skipped(redis, providers, client):
    before = providers.hits["fail"]
    failing = provider("ip", providers, client, "fail", retries=1)
    e = make(redis, [failing, IpDatasetSource(DATASET)])
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="192.0.2.1"))
    assert providers.hits["fail"] - before == 2
    assert statuses["ip_api"] == "failed: HTTP 500" and profile.company_name == "Globex Manufacturing"


@pytest.mark.parametrize("path, why", [("malformed", "not JSON"), ("badvalues", "must be strings")])
async def test_malformed_answers_are_skipped_and_recorded(redis, providers, client, path, why):
    e = make(redis, [provider("ip", providers, client, path, retries=0), IpDatasetSource(DATASET)])
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="192.0.2.1"))
    assert why in statuses["ip_api"] and statuses["ip_dataset"] == "hit"


async def test_open_circuit_skips_the_source_without_calling_it(redis, providers, client):
    failing = provider("ip", providers, client, "fail", retries=0, breaker=CircuitBreaker(threshold=2, reset_after_s=60))
    e = make(redis, [failing])
    for _ in range(2):
        _, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="192.0.2.1"))
        assert statuses["ip_api"].startswith("failed")
    before = providers.hits["fail"]
    _, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="192.0.2.1"))
    assert statuses["ip_api"] == "circuit open" and providers.hits["fail"] == before


def test_breaker_half_opens_after_the_reset_time():
    now = [0.0]
    b = CircuitBreaker(threshold=2, reset_after_s=10, clock=lambda: now[0])
    b.failure(), b.failure()
    assert b.state == "open" and not b.allow()
    now[0] = 10.0
    assert b.state == "half-open" and b.allow()
    b.failure()
    assert b.state == "open"
    now[0] = 20.0
    b.success()
    assert b.state == "closed"


async def test_one_sites_visitors_are_never_another_sites(redis, providers, client):
    a, b = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    e = make(redis, [RevealSource()])
    profile, _ = await run(e, lookup(a, ip="192.0.2.50", reveal={"company": "Secret Corp"}))
    assert profile.company_name == "Secret Corp"
    profile, statuses = await run(e, lookup(b, ip="192.0.2.50"))  # same visitor IP, other tenant
    assert statuses["cache"] == "miss" and statuses["returning_visitor"] == "miss"
    assert profile.company_name == "unknown"


async def test_ipinfos_answers_become_profiles_and_its_errors_failures(redis, providers, client):
    """IPinfo (ENRICH_IP_API_FORMAT=ipinfo) against a local server answering in its format: a
    business is a completed profile; an ISP's customer, a private address and a "Wrong ip"
    are misses; a free plan's `org` only a partial one; its rate limit and a refused token are
    failures, which the breaker counts and the chain passes over."""
    def ipinfo(key="secret"):
        return Guarded(IpinfoSource(f"{providers.url}/ipinfo", key, client), timeout_s=0.5, retries=0)

    profile, statuses = await run(make(redis, [ipinfo()]), lookup(ip="203.0.113.10"))
    assert (profile.company_name, profile.company_domain, profile.status, profile.source) == (
        "Initech", "initech.example", "completed", "ip_api")
    for ip in ("203.0.113.20", "10.0.0.1", "192.0.2.55"):
        profile, statuses = await run(make(redis, [ipinfo()]), lookup(ip=ip))
        assert profile.company_name == "unknown" and statuses["ip_api"] == "miss", (ip, statuses)
    free = await IpinfoSource(f"{providers.url}/ipinfo", "secret", client).lookup(lookup(ip="198.51.100.7"))
    assert (free.company_name, free.status) == ("Example University", "partial")
    for ip, key, why in (("203.0.113.99", "secret", "429"), ("203.0.113.10", "wrong", "403")):
        # (another site: the first lookup's profile is in the cache for that address)
        profile, statuses = await run(make(redis, [ipinfo(key)]), lookup(site=f"s{uuid.uuid4().hex[:6]}", ip=ip))
        assert profile.company_name == "unknown" and why in statuses["ip_api"], statuses


def test_the_ip_apis_format_picks_its_adapter_and_an_unknown_one_stops_the_service(monkeypatch):
    from services.enricher.main import build_enricher
    from services.enricher.settings import EnricherSettings
    from shared.config import ConfigError

    monkeypatch.setenv("ENRICH_IP_API_URL", "https://ipinfo.io")
    monkeypatch.setenv("ENRICH_IP_API_KEY", "k")
    monkeypatch.setenv("ENRICH_IP_API_FORMAT", "ipinfo")
    settings = EnricherSettings.from_env()
    enricher = build_enricher(None, None, settings)
    assert [type(getattr(s, "source", s)).__name__ for s in enricher.chain(fresh=True)] == [
        "RevealSource", "IpinfoSource"]
    monkeypatch.setenv("ENRICH_IP_API_FORMAT", "clearbit")
    with pytest.raises(ConfigError, match="ENRICH_IP_API_FORMAT"):
        EnricherSettings.from_env()


# --- the keyless IP source: the owner of the address's network (ip_owners.py) ---------------

@pytest.fixture(scope="module")
def owners():
    from services.enricher.ip_owners import IpOwnerSource
    return IpOwnerSource()


@pytest.mark.parametrize("ip, company, domain, sector", [
    ("128.30.2.36", "Massachusetts Institute of Technology", "mit.edu", "Education"),  # AS3, MIT
    ("2603:400a::1", "Massachusetts Institute of Technology", "mit.edu", "Education"),
    ("::ffff:128.30.2.36", "Massachusetts Institute of Technology", "mit.edu", "Education"),  # IPv4-mapped
    ("131.107.0.1", "Microsoft Corporation", "unknown", "unknown"),  # AS3598, Microsoft's own (no website in the data)
    ("2001:4898::1", "Microsoft Corporation", "unknown", "unknown"),
    ("56.0.0.1", "United States Postal Service", "unknown", "unknown"),  # AS5774
])
async def test_an_address_of_an_organisations_own_network_names_its_owner(owners, ip, company, domain, sector):
    profile = await owners.lookup(lookup(ip=ip))
    assert profile is not None, ip
    assert (profile.company_name, profile.company_domain, profile.sector) == (company, domain, sector)
    assert (profile.status, profile.source) == ("partial", "ip_owner")  # the network's owner, maybe not the visitor's


@pytest.mark.parametrize("ip, why", [
    ("73.15.1.1", "Comcast: an ISP"),
    ("87.128.1.1", "Deutsche Telekom: transit"),
    ("165.225.0.1", "Zscaler: hosting"),
    ("8.8.8.8", "Google: a content network (resolvers, crawlers, its cloud's older ranges)"),
    ("1.1.1.1", "Cloudflare: a content network (WARP and proxied traffic)"),
    ("2606:4700:4700::1111", "Cloudflare over IPv6"),
    ("52.94.236.248", "AWS, filed as an enterprise: CLOUD_ASNS"),
    ("10.0.0.1", "private"), ("127.0.0.1", "loopback"), ("100.64.0.1", "carrier-grade NAT"),
    ("192.0.2.1", "documentation"), ("::1", "IPv6 loopback"), ("fe80::1", "link-local"), ("fd00::1", "unique local"),
])
async def test_carriers_clouds_content_networks_and_private_addresses_are_misses(owners, ip, why):
    assert await owners.lookup(lookup(ip=ip)) is None, why


async def test_the_owner_follows_the_demo_dataset_and_a_bad_address_is_a_failure(redis, owners):
    """The chain as a keyless `make run` has it: the demo CSV first (its fictional companies are
    completed profiles), the owner after it; an address the CSV does not know gets its owner."""
    e = make(redis, [RevealSource(), IpDatasetSource(DATASET), owners])
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="127.0.0.1"))
    assert profile.company_name.startswith("Northwind") and statuses["ip_owner"] == "skipped: an earlier source hit"
    profile, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="128.30.2.36"))
    assert statuses["ip_dataset"] == "miss" and statuses["ip_owner"] == "partial"
    assert profile.company_name == "Massachusetts Institute of Technology" and profile.status == "partial"
    _, statuses = await run(e, lookup(f"s{uuid.uuid4().hex[:8]}", ip="not-an-ip"))
    assert statuses["ip_owner"] == "failed: not an IP address"


def test_the_owner_rule_on_a_networks_facts():
    """owner_profile over the data's own fields: which categories name an owner, a carrier's or
    a host's name under an organisation's category, and the domain from the website only."""
    from services.enricher.ip_owners import owner_profile, website_domain
    from whereip_network import Facts

    def facts(category="enterprise", company="Initech Inc.", website="https://www.initech.co.uk/about", asn=64500):
        return Facts(asn, "INITECH", company, "", "", category, 3, "", "", "ripe", 2001, website, "", "", "", "",
                     "abuse@isp.example", "GB")

    named = owner_profile(facts(), "ip_owner")
    assert (named.company_name, named.company_domain, named.sector) == ("Initech Inc.", "initech.co.uk", "unknown")
    assert owner_profile(facts("government"), "ip_owner").sector == "Government"
    assert owner_profile(facts("non-profit"), "ip_owner").sector == "Non-profit"
    for category in ("isp", "mobile", "hosting", "transit", "exchange", "content", ""):
        assert owner_profile(facts(category), "ip_owner") is None, category
    for company in ("Initech Hosting Ltd", "Initech Telecom", "Initech Cloud", "Initech Internet Services", "Initech Fibre"):
        assert owner_profile(facts(company=company), "ip_owner") is None, company
    assert owner_profile(facts(company="Palo Alto Networks, Inc"), "ip_owner").company_name == "Palo Alto Networks, Inc"
    assert owner_profile(facts(asn=0), "ip_owner") is None and owner_profile(facts(asn=16509), "ip_owner") is None
    # No website: no domain (the abuse mailbox's host is often the ISP's).
    assert owner_profile(facts(website=""), "ip_owner").company_domain == "unknown"
    assert [website_domain(w) for w in ("http://mit.edu", "https://blink.ucsd.edu/help", "www.bbc.co.uk",
                                        "https://10.0.0.1/", "localhost")] == [
        "mit.edu", "ucsd.edu", "bbc.co.uk", None, None]


def test_a_keyless_deployment_asks_the_networks_owner_and_reads_the_csv_only_when_configured(monkeypatch):
    from services.enricher.main import build_enricher
    from services.enricher.settings import EnricherSettings

    def kinds():
        enricher = build_enricher(None, None, EnricherSettings.from_env())
        return [type(getattr(s, "source", s)).__name__ for s in enricher.chain(fresh=True)]

    for name in ("ENRICH_IP_API_URL", "ENRICH_IP_DATASET", "ENRICH_IP_OWNERS", "ENRICH_SESSION_PROVIDER_URL",
                 "ENRICH_PERSON_API_URL"):
        monkeypatch.delenv(name, raising=False)
    assert kinds() == ["RevealSource", "IpOwnerSource"]
    monkeypatch.setenv("ENRICH_IP_DATASET", str(DATASET))
    assert kinds() == ["RevealSource", "IpDatasetSource", "IpOwnerSource"]
    monkeypatch.setenv("ENRICH_IP_OWNERS", "off")
    assert kinds() == ["RevealSource", "IpDatasetSource"]
