"""What a process keeps per site stays bounded whatever the number of sites: the per-site
metric series (shared/metrics.py `SiteLabels`) and an enrichment provider's guarded
adapters, one per site's own key (services/enricher/chain.py). The retriever's pool:
tests/test_kb_pool.py; the site config cache: tests/test_site_config.py."""

from __future__ import annotations

from services.enricher import chain
from shared import metrics
from shared.site_config import Enrichment


def test_per_site_series_name_the_first_sites_and_sum_the_rest():
    labels = metrics.SiteLabels(3)
    assert [labels(f"s{n}") for n in range(5)] == ["s0", "s1", "s2", "_other", "_other"]
    assert labels("s1") == "s1" and labels("s9") == "_other"


def test_a_provider_keeps_the_adapters_of_the_keys_used_last(monkeypatch):
    monkeypatch.setattr(chain, "GUARDED", 3)
    made: list[tuple[str, str]] = []

    def make(key: str, account: str):
        made.append((key, account))
        return (key, account)

    provider = chain.Provider(name="ip_api", make=make, guard=lambda source: ("guarded", source))
    config = Enrichment(ip_api_key_env="SITE_KEY")
    for n in range(10):
        site = f"site{n}"
        assert provider.for_site(site, config, {"SITE_KEY": f"{site}:ip_api:key{n}"}) == ("guarded", (f"key{n}", ""))
    assert len(provider._guarded) == 3 and len(made) == 10
    provider.for_site("site9", config, {"SITE_KEY": "site9:ip_api:key9"})  # kept: not made again
    assert len(made) == 10
