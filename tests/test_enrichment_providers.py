"""The enrichment providers against a local server answering in each vendor's format
(tests/providers.py): Snitcher Radar (session id → company) and People Data Labs (e-mail
hash → the person's employer), their answers mapped onto the profile, their errors and
rate limits failures the breaker counts; and a site's `[enrichment]`: its order of
providers, its own keys, and no key, no call (the stand-in sees no request)."""

from __future__ import annotations

import uuid

import httpx
import msgspec
import pytest
from prometheus_client import REGISTRY

from services.enricher.breaker import CircuitBreaker
from services.enricher.chain import Enricher
from services.enricher.main import build_enricher
from services.enricher.settings import DATASET, EnricherSettings, RemoteSource
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, Lookup, PdlSource, ReturningVisitorSource, SnitcherSource, pdl_profile,
    snitcher_profile,
)
from shared import events as ev
from shared import privacy
from shared.site_config import Enrichment, SiteConfig
from tests.providers import PDL_EMAIL, SNITCHER_SCRIPT, sha256

KEYS = privacy.PrivacySettings()



@pytest.fixture
async def client():
    async with httpx.AsyncClient() as c:
        yield c


def lookup(site=None, ip=None, session_uuid=None, email=None, email_hash=None):
    return Lookup(site=site or f"s{uuid.uuid4().hex[:8]}", session_id=uuid.uuid4().hex,
                  ip_hash=KEYS.ip_hash(ip) if ip else None, ip=ip, reveal=None, session_uuid=session_uuid,
                  email=email, email_hash=email_hash)


def snitcher(providers, client, key="secret", account=SNITCHER_SCRIPT, **guard):
    source = SnitcherSource(f"{providers.url}/snitcher", key, client, account)
    return Guarded(source, **{"timeout_s": 1.0, "retries": 1, **guard})


def pdl(providers, client, key="secret", **guard):
    return Guarded(PdlSource(f"{providers.url}/pdl", key, client), **{"timeout_s": 1.0, "retries": 1, **guard})


def calls(source: str, site: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("concierge_enrichment_provider_calls_total",
                                     {"source": source, "site": site, "outcome": outcome}) or 0.0


async def run(enricher: Enricher, q: Lookup, config: Enrichment | None = None):
    statuses: dict[str, str] = {}
    profile = await enricher.run(q, enricher.chain(fresh=True, config=config, site=q.site), statuses)
    return profile, statuses


def make(redis, *sources) -> Enricher:
    return Enricher(redis=redis, cache=CacheSource(redis), returning=ReturningVisitorSource(redis),
                    sources=list(sources))


# --- Snitcher Radar ------------------------------------------------------------------------------

async def test_snitchers_company_for_a_session_becomes_a_completed_profile(providers, client):
    q = lookup(session_uuid="sess-business")
    profile = await snitcher(providers, client).lookup(q)
    assert (profile.company_name, profile.company_domain, profile.sector, profile.company_size, profile.country,
            profile.match_confidence, profile.status, profile.source) == (
        "Initech", "initech.example", "Information Technology and Services", "51-200", "Netherlands", "high",
        "completed", "session_provider")
    assert profile.company_description == "Initech makes TPS reports."
    asked = providers.seen[-1]
    assert asked["path"] == f"/snitcher/radar/operator/v1/tracking-scripts/{SNITCHER_SCRIPT}/company/find"
    assert asked["body"] == {"session_uuid": "sess-business"} and asked["auth"] == "Bearer secret"
    assert calls("session_provider", q.site, "hit") == 1


async def test_a_fuzzy_snitcher_match_is_less_sure_and_an_isp_queued_or_unknown_session_a_miss(providers, client):
    fuzzy = await snitcher(providers, client).lookup(lookup(session_uuid="sess-fuzzy"))
    assert (fuzzy.company_name, fuzzy.match_confidence, fuzzy.country, fuzzy.company_size) == (
        "Globex", "medium", "United States", "1001-5000")
    for session in ("sess-isp", "sess-queued", "sess-nobody"):
        q = lookup(session_uuid=session)
        assert await snitcher(providers, client).lookup(q) is None, session
        assert calls("session_provider", q.site, "miss") == 1, session


async def test_snitcher_is_not_asked_without_a_session_id(providers, client):
    before = providers.hits["snitcher"]
    q = lookup(ip="203.0.113.10")
    assert await snitcher(providers, client).lookup(q) is None
    assert providers.hits["snitcher"] == before and calls("session_provider", q.site, "miss") == 0


@pytest.mark.parametrize("session, key, why, outcome", [
    ("sess-ratelimited", "secret", "HTTP 429: the plan's request limit", "rate_limited"),
    ("sess-quota", "secret", "HTTP 403: the plan's quota is used up", "quota"),
    ("sess-business", "wrong", "HTTP 401: the key was refused", "refused"),
])
async def test_snitchers_limits_and_a_refused_key_are_failures_not_retried(redis, providers, client, session, key,
                                                                          why, outcome):
    before = providers.hits["snitcher"]
    q = lookup(session_uuid=session)
    profile, statuses = await run(make(redis, snitcher(providers, client, key=key, retries=2)), q)
    assert profile.company_name == "unknown" and statuses["session_provider"] == f"failed: {why}"
    assert providers.hits["snitcher"] - before == 1  # retrying cannot help: one request, not three
    assert calls("session_provider", q.site, outcome) == 1


def test_snitchers_malformed_answer_is_a_failure():
    with pytest.raises(Exception, match="malformed"):
        snitcher_profile(["not", "an", "object"], "session_provider")
    assert snitcher_profile({"ip": "1.2.3.4", "company": None}, "session_provider") is None


# --- People Data Labs ----------------------------------------------------------------------------

async def test_pdls_person_becomes_their_employers_profile_and_nothing_of_the_person(providers, client):
    q = lookup(email_hash=sha256(PDL_EMAIL))
    profile = await pdl(providers, client).lookup(q)
    assert (profile.company_name, profile.company_domain, profile.sector, profile.company_size, profile.country,
            profile.match_confidence, profile.status, profile.source) == (
        "Hooli", "hooli.example", "Computer software", "1001-5000", "United States", "high", "completed",
        "person_api")
    stored = msgspec.json.encode(profile).decode().lower()
    assert "ada" not in stored and "lovelace" not in stored and "head of engineering" not in stored
    asked = providers.seen[-1]
    assert asked["auth"] == "secret" and asked["query"] == {
        "email_hash": sha256(PDL_EMAIL), "min_likelihood": "6", "required": "job_company_name"}
    assert calls("person_api", q.site, "hit") == 1


async def test_a_typed_address_is_sent_to_pdl_only_as_its_hash(providers, client):
    profile = await pdl(providers, client).lookup(lookup(email="  " + PDL_EMAIL.upper() + " "))
    assert profile.company_name == "Hooli"
    asked = providers.seen[-1]["query"]
    assert asked["email_hash"] == sha256(PDL_EMAIL) and "email" not in asked
    assert "hooli.example" not in str(asked).lower()


async def test_pdls_medium_match_keeps_its_own_spelling_and_a_website_becomes_a_domain(providers, client):
    profile = await pdl(providers, client).lookup(lookup(email_hash=sha256("grace@initech.example")))
    assert (profile.company_name, profile.company_domain, profile.country, profile.match_confidence) == (
        "Initech GmbH", "initech.example", "Germany", "medium")


async def test_pdls_weak_match_no_employer_and_nobody_are_misses(providers, client):
    for email in ("weak@globex.example", "between@jobs.example", "nobody@example.com"):
        q = lookup(email_hash=sha256(email))
        assert await pdl(providers, client).lookup(q) is None, email
        assert calls("person_api", q.site, "miss") == 1, email


@pytest.mark.parametrize("email, key, why, outcome", [
    ("credits@pdl.example", "secret", "HTTP 402: the plan's credits are used up", "quota"),
    ("rate@pdl.example", "secret", "HTTP 429: the plan's request limit", "rate_limited"),
    (PDL_EMAIL, "wrong", "HTTP 401: the key was refused", "refused"),
])
async def test_pdls_errors_are_failures_the_breaker_counts(redis, providers, client, email, key, why, outcome):
    breaker = CircuitBreaker(threshold=1, reset_after_s=60)
    source = pdl(providers, client, key=key, breaker=breaker)
    q = lookup(email_hash=sha256(email))
    profile, statuses = await run(make(redis, source), q)
    assert profile.company_name == "unknown" and statuses["person_api"] == f"failed: {why}"
    assert breaker.state == "open" and calls("person_api", q.site, outcome) == 1


def test_pdls_answer_without_data_is_malformed():
    with pytest.raises(Exception, match="malformed"):
        pdl_profile({"status": 200, "likelihood": 9}, "person_api")


# --- the cost counter ------------------------------------------------------------------------------

async def test_every_request_sent_is_counted_even_one_without_an_answer(redis, providers, client):
    """Two timed-out attempts are two requests; one the enrichment's deadline cut short is
    counted as cancelled: the provider saw it all the same."""
    q = lookup(ip="203.0.113.9")
    slow = Guarded(IpApiSource(f"{providers.url}/slow", "secret", client), timeout_s=0.2, retries=1, backoff_s=0)
    _, statuses = await run(make(redis, slow), q)
    assert statuses["ip_api"] == "timeout" and calls("ip_api", q.site, "timeout") == 2
    q = lookup(ip="203.0.113.9")
    enricher = make(redis, Guarded(IpApiSource(f"{providers.url}/slow", "secret", client), timeout_s=5, retries=0))
    enricher.deadline_s = 0.2
    _, statuses = await run(enricher, q)
    assert statuses["ip_api"] == "timeout" and calls("ip_api", q.site, "cancelled") == 1


# --- a site's providers: order, keys, no key no call ---------------------------------------------

def settings(providers, *, key="secret", **extra) -> EnricherSettings:
    def remote(path, fmt, **more):
        return RemoteSource(url=f"{providers.url}/{path}", key=key, format=fmt, timeout_s=1.0, retries=0, **more)
    return EnricherSettings(
        session_provider=remote("snitcher", "snitcher", account=SNITCHER_SCRIPT),
        person_api=remote("pdl", "pdl"), ip_api=remote("ipinfo", "ipinfo"), ip_dataset=str(DATASET),
        ip_owners=False, **extra)


def everyone() -> Lookup:
    """A visitor every provider knows: Snitcher's Initech, PDL's Hooli, IPinfo's Initech."""
    return lookup(ip="203.0.113.10", session_uuid="sess-business", email_hash=sha256(PDL_EMAIL))


async def test_the_default_order_asks_the_session_then_the_ip_never_the_person(redis, providers, client):
    """A site naming no order: the providers that need nothing personal, stopping at the first
    hit; the person API (it is sent a hash of the visitor's e-mail) only for a site listing it."""
    before = dict(providers.hits)
    profile, statuses = await run(build_enricher(redis, client, settings(providers)), everyone())
    assert list(statuses) == ["reveal", "session_provider", "ip_api"]
    assert statuses["session_provider"] == "hit" and profile.company_name == "Initech"
    assert statuses["ip_api"] == "skipped: an earlier source hit"
    assert providers.hits["pdl"] == before.get("pdl", 0) and providers.hits["ipinfo"] == before.get("ipinfo", 0)
    profile, statuses = await run(build_enricher(redis, client, settings(providers)), everyone(),
                                  Enrichment(sources=["person_api", "session_provider", "ip_api"]))
    assert statuses["person_api"] == "hit" and profile.company_name == "Hooli" and profile.source == "person_api"


async def test_a_site_asks_its_providers_in_its_own_order(redis, providers, client):
    enricher = build_enricher(redis, client, settings(providers))
    profile, statuses = await run(enricher, everyone(), Enrichment(sources=["session_provider", "person_api"]))
    assert list(statuses) == ["reveal", "session_provider", "person_api", "ip_dataset"]
    assert statuses["session_provider"] == "hit" and profile.company_name == "Initech"
    assert profile.source == "session_provider"
    profile, statuses = await run(enricher, everyone(), Enrichment(sources=["ip_api"]))
    assert list(statuses) == ["reveal", "ip_api"] and statuses["ip_api"] == "hit"  # no dataset: an IP API is asked


async def test_no_key_no_call(redis, providers, client):
    """No deployment key and no site key: not one request reaches a provider, each status
    says why, and the offline IP data answers in the IP API's stead."""
    before = dict(providers.hits)
    enricher = build_enricher(redis, client, settings(providers, key=""))
    profile, statuses = await run(enricher, lookup(ip="127.0.0.1", session_uuid="sess-business",
                                                   email_hash=sha256(PDL_EMAIL)),
                                  Enrichment(sources=["person_api", "session_provider", "ip_api"]))
    assert {name: statuses[name] for name in ("person_api", "session_provider", "ip_api")} == {
        "person_api": "skipped: no key", "session_provider": "skipped: no key", "ip_api": "skipped: no key"}
    assert statuses["ip_dataset"] == "hit" and profile.company_name.startswith("Northwind")
    assert dict(providers.hits) == before


async def test_a_site_naming_its_own_key_uses_it_and_never_the_deployments(redis, providers, client):
    """Its PDL variable is set: PDL is asked with it. Its Snitcher variable is not: Snitcher
    is not called, though the deployment has a key (the site's account is not billed to it)."""
    before = dict(providers.hits)
    q = everyone()
    enricher = build_enricher(redis, client, settings(providers, site_keys={
        "ENRICH_KEY_ACME_PDL": f"{q.site}:person_api:site-secret"}))
    own = Enrichment(sources=["session_provider", "person_api"], person_api_key_env="ENRICH_KEY_ACME_PDL",
                     session_provider_key_env="ENRICH_KEY_ACME_SNITCHER")
    profile, statuses = await run(enricher, q, own)
    assert statuses["session_provider"] == "skipped: no key"  # which variables exist is not said
    assert statuses["person_api"] == "hit" and providers.seen[-1]["auth"] == "site-secret"
    assert profile.company_name == "Hooli" and providers.hits["snitcher"] == before.get("snitcher", 0)


async def test_a_sites_key_serves_only_that_site_and_that_provider(redis, providers, client):
    """A key's value names its site and its provider: another site naming the variable, or a
    config naming it for another vendor, gets no key, and nothing is sent."""
    before = dict(providers.hits)
    enricher = build_enricher(redis, client, settings(providers, key="", site_keys={
        "ENRICH_KEY_ACME_PDL": "acme:person_api:site-secret", "ENRICH_KEY_ACME_SNITCHER": "acme:session_provider:x"}))
    thief = Enrichment(sources=["person_api", "ip_api"], person_api_key_env="ENRICH_KEY_ACME_PDL",
                       ip_api_key_env="ENRICH_KEY_ACME_SNITCHER")
    _, statuses = await run(enricher, lookup(site="globex", ip="203.0.113.10", email_hash=sha256(PDL_EMAIL)), thief)
    assert statuses["person_api"] == statuses["ip_api"] == "skipped: no key"
    _, statuses = await run(enricher, lookup(site="acme", ip="203.0.113.10", email_hash=sha256(PDL_EMAIL)), thief)
    assert statuses["person_api"] == "hit" and statuses["ip_api"] == "skipped: no key"  # Snitcher's key, not IPinfo's
    assert providers.hits["ipinfo"] == before.get("ipinfo", 0) and providers.hits["pdl"] == before.get("pdl", 0) + 1


async def test_a_concierge_format_service_without_a_key_is_called(redis, providers, client):
    """No key, no call holds for vendors; a service answering in Concierge's own format (a
    stand-in, the site's own inside the deployment) may be open, and is asked without one."""
    before = providers.hits["fast"]
    enricher = build_enricher(redis, client, EnricherSettings(
        ip_api=RemoteSource(url=f"{providers.url}/fast", format="concierge", retries=0), ip_owners=False))
    profile, statuses = await run(enricher, lookup(ip="203.0.113.10"))
    assert statuses["ip_api"] == "hit" and profile.company_name == "Hooli" and providers.hits["fast"] == before + 1


async def test_a_sites_refused_key_opens_its_own_breaker_not_the_other_sites(redis, providers, client):
    q = everyone()
    base = settings(providers, site_keys={"ENRICH_KEY_BAD": f"{q.site}:session_provider:revoked"})
    enricher = build_enricher(redis, client, msgspec.structs.replace(base, session_provider=msgspec.structs.replace(
        base.session_provider, breaker_threshold=1, breaker_reset_s=60)))
    bad = Enrichment(sources=["session_provider"], session_provider_key_env="ENRICH_KEY_BAD")
    _, statuses = await run(enricher, q, bad)
    assert statuses["session_provider"] == "failed: HTTP 401: the key was refused"
    before = providers.hits["snitcher"]
    _, statuses = await run(enricher, q, bad)  # its breaker is open: not asked again
    assert statuses["session_provider"] == "circuit open" and providers.hits["snitcher"] == before
    profile, statuses = await run(enricher, everyone(), Enrichment(sources=["session_provider"]))
    assert statuses["session_provider"] == "hit" and profile.company_name == "Initech"  # the deployment's key


async def test_snitcher_without_a_tracking_script_is_not_called_and_a_site_can_name_its_own(redis, providers,
                                                                                            client):
    before = providers.hits["snitcher"]
    enricher = build_enricher(redis, client, msgspec.structs.replace(
        settings(providers), session_provider=RemoteSource(url=f"{providers.url}/snitcher", key="secret",
                                                           format="snitcher", retries=0)))
    _, statuses = await run(enricher, everyone(), Enrichment(sources=["session_provider"]))
    assert statuses["session_provider"] == "skipped: no account" and providers.hits["snitcher"] == before
    # A site's own account goes with its own key: never with the deployment's.
    _, statuses = await run(enricher, everyone(), Enrichment(sources=["session_provider"],
                                                             session_provider_account=SNITCHER_SCRIPT))
    assert statuses["session_provider"] == "skipped: no account" and providers.hits["snitcher"] == before
    q = everyone()
    enricher.site_keys = {"ENRICH_KEY_ACME_SNITCHER": f"{q.site}:session_provider:site-secret"}
    profile, statuses = await run(enricher, q, Enrichment(sources=["session_provider"],
                                                          session_provider_key_env="ENRICH_KEY_ACME_SNITCHER",
                                                          session_provider_account=SNITCHER_SCRIPT))
    assert statuses["session_provider"] == "hit" and profile.company_name == "Initech"


async def test_a_provider_the_site_names_but_the_deployment_lacks_says_so(redis, client):
    enricher = build_enricher(redis, client, EnricherSettings(ip_dataset=str(DATASET), ip_owners=False))
    _, statuses = await run(enricher, everyone(), Enrichment(sources=["session_provider"]))
    assert statuses["session_provider"] == "skipped: not configured"
    _, statuses = await run(enricher, everyone())  # the site says nothing: only what is configured
    assert list(statuses) == ["reveal", "ip_dataset"]


async def test_the_enrichment_node_builds_its_chain_from_the_sites_config(redis, site, providers, client):
    """The node end to end: the widget's `email_hash` and `session_uuid`, the site's order."""
    from services.enricher import enrichment
    from tests.helpers import decide

    node = enrichment.make_node(build_enricher(redis, client, settings(providers)))
    visitor = {"session_uuid": "sess-business", "email_hash": sha256(PDL_EMAIL)}
    event = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="n1", turn=1, ts=ev.now(), producer="test",
                             message="hello", visitor=visitor)
    config = SiteConfig(enrichment=Enrichment(sources=["session_provider", "person_api"]))
    (done,) = (await decide(node, event, config=config)).events
    assert done.sources["session_provider"] == "hit" and done.profile.company_name == "Initech"
    assert done.profile.company_size == "51-200" and done.sources["person_api"] == "skipped: an earlier source hit"
    (done,) = (await decide(node, msgspec.structs.replace(event, session_id="n2", event_id=ev.new_id()))).events
    assert "person_api" not in done.sources and done.profile.company_name == "Initech"  # the default order


async def test_a_providers_profile_picks_the_sites_segment_for_its_industry_and_size(providers, client):
    """What the adapters map is what the answer's segments read (shared/segments.py): the
    vendor's industry as the sector, its employee range as the company's size."""
    from shared import segments
    from shared.site_config import Segment

    config = SiteConfig(segments=[
        Segment(name="software", sectors=["computer software"], example="Software teams ship with us."),
        Segment(name="it", sectors=["Information Technology and Services"], example="IT firms resell us."),
        Segment(name="large", employees="1000+", offer="The Enterprise plan fits."),
        Segment(name="mid", employees="51-200", offer="The Growth plan fits.")])
    person = await pdl(providers, client).lookup(lookup(email_hash=sha256(PDL_EMAIL)))
    session = await snitcher(providers, client).lookup(lookup(session_uuid="sess-business"))
    assert segments.for_visitor(config, person).segments == ("software", "large")
    assert segments.for_visitor(config, session).segments == ("it", "mid")
