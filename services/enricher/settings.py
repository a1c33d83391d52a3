"""The enricher's settings, read once at start (main.py) and handed to its sources and nodes."""

from __future__ import annotations

import os
from pathlib import Path

from shared import redis_client
from shared.config import ConfigError, LLMRoleConfig, Settings, env_bool, env_choice, env_float, env_int, env_str
from shared.site_config import ENRICH_KEY_PREFIX, ENV_NAME_RE

# The demo's fictional IP ranges → companies (127.0.0.0/8 is Northwind): read only when
# ENRICH_IP_DATASET names it, as `make run` and the test harness do (cli/harness/supervisor.py).
DATASET = Path(__file__).parent / "data" / "ip_companies.csv"


# How each remote source's provider answers (ENRICH_<SOURCE>_FORMAT): Concierge's own
# profile JSON, or a vendor's API and answer (main.py ADAPTERS, sources.py).
SESSION_PROVIDER_FORMATS = ("concierge", "snitcher")
PERSON_API_FORMATS = ("concierge", "pdl")
IP_API_FORMATS = ("concierge", "ipinfo")


class RemoteSource(Settings):
    """A remote company-lookup API, with its timeout, retries and circuit breaker
    (ENRICH_<SOURCE>_*: SESSION_PROVIDER, PERSON_API or IP_API)."""

    SECRETS = ("key",)

    url: str
    key: str = ""  # the deployment's key: a site without its own (`[enrichment]`) uses it
    # How the provider answers (`<prefix>_FORMAT`): `concierge`, Concierge's own profile JSON,
    # or a vendor's response mapped onto the profile (sources.py: `snitcher`, `pdl`, `ipinfo`).
    format: str = "concierge"
    # The deployment's account id where the vendor wants one in its path (Snitcher: the Radar
    # tracking script); a site may name its own.
    account: str = ""
    timeout_s: float = 0.8
    retries: int = 1
    breaker_threshold: int = 3
    breaker_reset_s: float = 30.0

    @classmethod
    def from_env(cls, prefix: str, formats: tuple[str, ...] = ("concierge",)) -> "RemoteSource | None":
        """None when `<prefix>_URL` is not set (its other variables are then not read)."""
        url = env_str(f"{prefix}_URL", "")
        if not url:
            return None
        d = cls(url=url)
        return cls(
            url=url,
            key=env_str(f"{prefix}_KEY", d.key),
            format=env_choice(f"{prefix}_FORMAT", d.format, formats),
            account=env_str(f"{prefix}_ACCOUNT", d.account),
            timeout_s=env_float(f"{prefix}_TIMEOUT_S", d.timeout_s),
            retries=env_int(f"{prefix}_RETRIES", d.retries),
            breaker_threshold=env_int(f"{prefix}_BREAKER_THRESHOLD", d.breaker_threshold),
            breaker_reset_s=env_float(f"{prefix}_BREAKER_RESET_S", d.breaker_reset_s),
        )


class EnricherSettings(Settings):
    SECRETS = ("site_keys",)

    redis_url: str = redis_client.DEFAULT_URL
    session_provider: RemoteSource | None = None
    person_api: RemoteSource | None = None
    ip_api: RemoteSource | None = None  # None (or not asked for a site): the offline sources below
    # The sites' own provider keys: every variable named ENRICH_KEY_… as the process started
    # with it (a site's `[enrichment]` names its variables, and site configs change while the
    # process runs; other variables are not kept, so no config can have them sent anywhere).
    site_keys: dict[str, str] = {}
    ip_dataset: str = ""  # a CSV of IP ranges → companies (DATASET: the demo's); empty: none
    ip_owners: bool = True  # the owner of the address's network (ip_owners.py), when there is no IP API
    cache_ttl_s: float = 600.0
    returning_ttl_s: float = 30 * 24 * 3600.0
    deadline_s: float = 1.5  # all sources of one enrichment together
    profiler_backend: str = "local"  # `llm`: the `profiler` LLM role
    # With the LLM: how long the profiler waits for the turn's route (visitor_profiler.py).
    profiler_route_wait_s: float = 2.0
    # Lead briefs: `llm` (the `briefs` role) or `data` (from the captured data only, no
    # model); empty: `llm` when the role has an endpoint (LLM_BASE_URL / LLM_BRIEFS_BASE_URL).
    briefs_backend: str = ""
    # How many leads' briefs are written at once, across all replicas (lead_briefer.py).
    briefs_concurrency: int = 2
    # How many accounts' reports are written at once, across all replicas (account_reporter.py;
    # reports use the briefs' backend and role).
    reports_concurrency: int = 2
    llm: dict[str, LLMRoleConfig] = {}  # `briefs`; `profiler` when its backend is `llm`

    def briefs_with_llm(self) -> bool:
        """Whether briefs are written by the `briefs` role (else from the data only)."""
        role = self.llm.get("briefs")
        if self.briefs_backend == "llm" and (role is None or not role.base_url):
            raise ConfigError("BRIEFS_BACKEND=llm needs LLM_BASE_URL or LLM_BRIEFS_BASE_URL")
        return self.briefs_backend == "llm" or (self.briefs_backend == "" and role is not None and bool(role.base_url))

    @classmethod
    def from_env(cls) -> "EnricherSettings":
        d = cls()
        backend = env_choice("PROFILER_BACKEND", d.profiler_backend, ("local", "llm"))
        roles = {"briefs": LLMRoleConfig.from_env("briefs")}
        if backend == "llm":
            roles["profiler"] = LLMRoleConfig.from_env("profiler")
        return cls(
            redis_url=env_str("REDIS_URL", d.redis_url),
            session_provider=RemoteSource.from_env("ENRICH_SESSION_PROVIDER", SESSION_PROVIDER_FORMATS),
            person_api=RemoteSource.from_env("ENRICH_PERSON_API", PERSON_API_FORMATS),
            ip_api=RemoteSource.from_env("ENRICH_IP_API", IP_API_FORMATS),
            site_keys={name: value for name, value in os.environ.items()
                       if name.startswith(ENRICH_KEY_PREFIX) and ENV_NAME_RE.match(name)},
            ip_dataset=env_str("ENRICH_IP_DATASET", d.ip_dataset),
            ip_owners=env_bool("ENRICH_IP_OWNERS", d.ip_owners),
            cache_ttl_s=env_float("ENRICH_CACHE_TTL_S", d.cache_ttl_s),
            returning_ttl_s=env_float("ENRICH_RETURNING_TTL_S", d.returning_ttl_s),
            deadline_s=env_float("ENRICH_DEADLINE_S", d.deadline_s),
            profiler_backend=backend,
            profiler_route_wait_s=env_float("PROFILER_ROUTE_WAIT_S", d.profiler_route_wait_s),
            briefs_backend=env_choice("BRIEFS_BACKEND", d.briefs_backend, ("", "llm", "data"), "use llm or data"),
            briefs_concurrency=env_int("BRIEFS_CONCURRENCY", d.briefs_concurrency),
            reports_concurrency=env_int("REPORTS_CONCURRENCY", d.reports_concurrency),
            llm=roles,
        )
