"""Per-site configuration: `sites/<site>.toml` files → the `site_config` KV bucket → every
service.

A file is validated against `SiteConfig` (unknown keys and wrong types are errors); an
invalid file is refused with a message naming the file and the field, and the last good
config of that site stays in the bucket. `SiteConfigSync` loads the directory at start and
polls it for changes (a ConfigMap mounted in Kubernetes, the repo's `sites/` on one
machine); `SiteConfigs` is the read side, a small cache in front of the bucket. Inside the
pipeline a site without a file gets the defaults below; the gateway serves only sites that
have one (`SiteConfigs.find`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import tomllib
from pathlib import Path

import msgspec
import nats.js.errors
from nats.js.errors import KeyNotFoundError, NotFoundError

from shared import subjects
from shared.bus import Bus

log = logging.getLogger(__name__)

RETRIEVAL_MODES = ("global", "local", "hybrid", "mix", "naive")
RERANK_PROVIDERS = ("cohere", "jina")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SKILLS = ("propose_demo", "collect_email", "ask_qualifying_question", "suggest_follow_up", "share_resource")


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class Interest(Strict):
    threshold: float = 0.6  # cumulative interest score at which the bot may steer to booking


class CTA(Strict):
    label: str = "Book a demo"
    url: str = ""
    booking_url: str = ""
    first_turn: int = 2  # no unsolicited demo/email ask before this turn
    cooldown_turns: int = 2  # turns between two unsolicited asks


class FormField(Strict):
    name: str
    label: str = ""
    required: bool = True
    kind: str = "text"  # text | email | phone | choice
    choices: list[str] = []


class Booking(Strict):
    fields: list[FormField] = msgspec.field(default_factory=lambda: [
        FormField(name="email", label="Work email", kind="email"),
    ])


class Qualification(Strict):
    questions: list[str] = []  # asked one per turn once a lead is captured


class Skills(Strict):
    enabled: list[str] = msgspec.field(default_factory=lambda: list(SKILLS))


class Redirects(Strict):
    support: str = ""
    careers: str = ""
    press: str = ""
    partnerships: str = ""
    investors: str = ""


class Persona(Strict):
    """Who the assistant sounds like, and how much (0: not at all; see shared/persona.py)."""

    weight: float = 0.0
    name: str = ""
    tone: str = ""  # basic tone, e.g. "warm and practical"
    descriptors: list[str] = []
    explanation_approach: str = ""
    signature_phrases: list[str] = []
    vocabulary: list[str] = []
    style_markers: list[str] = []
    summary: str = ""


class Lead(Strict):
    webhook_url: str = ""  # where captured leads are POSTed (signed); empty: LEAD_WEBHOOK_URL
    # The environment variable holding this site's webhook secret (never the secret itself:
    # these files live in git); empty: one derived from LEAD_WEBHOOK_SECRET and the site id.
    webhook_secret_env: str = ""


class Classifier(Strict):
    backend: str = ""  # local | llm | cascade; empty: the deployment's default
    cascade_threshold: float = 0.0  # 0: the deployment's default


class Retrieval(Strict):
    """Per-site overrides of the retriever's deployment settings (RETRIEVAL_* variables);
    a key left out keeps the deployment's value."""

    mode: str | None = None  # global | local | hybrid | mix | naive
    rerank_enabled: bool | None = None
    limiter_enabled: bool | None = None
    rerank_top_k: int | None = None
    rerank_provider: str | None = None  # cohere | jina
    rerank_model: str | None = None
    relationships_enabled: bool | None = None
    graph_top_k: int | None = None
    chunk_top_k: int | None = None


class SiteConfig(Strict):
    name: str = ""
    # Browser origins (scheme://host[:port]) whose pages may call this site's visitor
    # endpoints (CORS); the gateway's own origin always may. "*" allows any (not advised).
    allowed_origins: list[str] = []
    # SHA-256 (hex) of this site's operator API keys (`concierge sites key`): the keys
    # themselves are never in the file. Several entries let a key be rotated without a gap.
    operator_key_sha256: list[str] = []
    languages: list[str] = msgspec.field(default_factory=lambda: ["en"])
    instructions: str = ""  # the client's own instructions: the third prompt level
    interest: Interest = msgspec.field(default_factory=Interest)
    cta: CTA = msgspec.field(default_factory=CTA)
    booking: Booking = msgspec.field(default_factory=Booking)
    qualification: Qualification = msgspec.field(default_factory=Qualification)
    skills: Skills = msgspec.field(default_factory=Skills)
    redirects: Redirects = msgspec.field(default_factory=Redirects)
    classifier: Classifier = msgspec.field(default_factory=Classifier)
    lead: Lead = msgspec.field(default_factory=Lead)
    persona: Persona = msgspec.field(default_factory=Persona)
    retrieval: Retrieval = msgspec.field(default_factory=Retrieval)
    version: str = ""  # set by the sync: the file's content hash


class SiteConfigError(ValueError):
    pass


_ORIGIN_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?\Z")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


def _check(config: SiteConfig) -> None:
    for origin in config.allowed_origins:
        if origin != "*" and not _ORIGIN_RE.match(origin):
            raise SiteConfigError(f"allowed_origins: {origin!r} is not an origin "
                                  "(scheme://host[:port], no path, no trailing slash) or \"*\"")
    for digest in config.operator_key_sha256:
        if not _SHA256_RE.match(digest):
            raise SiteConfigError("operator_key_sha256: each entry is a key's SHA-256 in lowercase hex "
                                  "(`concierge sites key --site SITE` prints one)")
    if not 0.0 <= config.interest.threshold <= 1.0:
        raise SiteConfigError("interest.threshold: must be between 0 and 1")
    if not 0.0 <= config.persona.weight <= 1.0:
        raise SiteConfigError("persona.weight: must be between 0 and 1")
    unknown = [s for s in config.skills.enabled if s not in SKILLS]
    if unknown:
        raise SiteConfigError(f"skills.enabled: unknown skill {unknown[0]!r} (known: {', '.join(SKILLS)})")
    if config.classifier.backend not in ("", "local", "llm", "cascade"):
        raise SiteConfigError("classifier.backend: must be local, llm or cascade")
    if config.cta.first_turn < 1 or config.cta.cooldown_turns < 0:
        raise SiteConfigError("cta.first_turn must be ≥ 1 and cta.cooldown_turns ≥ 0")
    r = config.retrieval
    if r.mode is not None and r.mode not in RETRIEVAL_MODES:
        raise SiteConfigError(f"retrieval.mode: must be one of {', '.join(RETRIEVAL_MODES)}")
    if r.rerank_provider is not None and r.rerank_provider not in RERANK_PROVIDERS:
        raise SiteConfigError(f"retrieval.rerank_provider: must be one of {', '.join(RERANK_PROVIDERS)}")
    for key in ("rerank_top_k", "graph_top_k", "chunk_top_k"):
        if getattr(r, key) is not None and getattr(r, key) < 1:
            raise SiteConfigError(f"retrieval.{key}: must be ≥ 1")
    if config.lead.webhook_secret_env and not ENV_NAME_RE.match(config.lead.webhook_secret_env):
        raise SiteConfigError("lead.webhook_secret_env: must name an environment variable (A-Z, 0-9, _), "
                              "not hold the secret")
    names = [f.name for f in config.booking.fields]
    if len(set(names)) != len(names):
        raise SiteConfigError("booking.fields: two fields share a name")
    for i, f in enumerate(config.booking.fields):
        if f.kind not in ("text", "email", "phone", "choice"):
            raise SiteConfigError(f"booking.fields[{i}].kind: must be text, email, phone or choice")


def parse(path: Path) -> SiteConfig:
    """Read and validate one file; errors name the file and the field."""
    import hashlib

    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SiteConfigError(f"{path}: {exc}") from None
    try:
        config = msgspec.convert(data, SiteConfig)
        _check(config)
    except msgspec.ValidationError as exc:
        # msgspec says e.g. "Expected `float`, got `str` - at `$.interest.threshold`"
        raise SiteConfigError(f"{path}: {exc}") from None
    except SiteConfigError as exc:
        raise SiteConfigError(f"{path}: {exc}") from None
    config.version = hashlib.sha256(raw).hexdigest()[:16]
    return config


def site_of(path: Path) -> str:
    site = path.stem
    if not subjects.TOKEN_RE.match(site):
        raise SiteConfigError(f"{path}: the file name must be a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    return site


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SiteConfig)
_registry_decoder = msgspec.json.Decoder(list[str])

# The registry's own record in the bucket: the sites the router has loaded, written after
# their configs. Until it exists nobody knows which sites there are, so the gateway is not
# ready (a site it cannot find then may only not be loaded yet). A site id has no '.'.
REGISTRY_KEY = "registry.sites"


async def register_no_sites(bus: Bus) -> None:
    """A deployment without site files: the registry is loaded, and empty."""
    kv = await bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
    await kv.put(REGISTRY_KEY, _encoder.encode([]))


class SiteConfigSync:
    """Files → bucket. Runs at start and then every `poll_s`; only changed files are
    re-read and only changed configs are written."""

    def __init__(self, bus: Bus, directory: Path, poll_s: float = 1.0):
        self.bus = bus
        self.directory = directory
        self.poll_s = poll_s
        self._mtimes: dict[Path, float] = {}
        self._task: asyncio.Task | None = None
        self.errors: dict[str, str] = {}  # file → last error, for tests and /readyz-style checks
        self._registered: list[str] | None = None  # the sites REGISTRY_KEY lists, once written

    async def sync_once(self) -> dict[str, str]:
        """One pass; returns {site: "loaded" | "unchanged" | "refused: …" | "removed"}."""
        kv = await self.bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
        result: dict[str, str] = {}
        present = set()
        for path in sorted(self.directory.glob("*.toml")):
            present.add(path)
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            if self._mtimes.get(path) == mtime:
                continue
            self._mtimes[path] = mtime
            try:
                site = site_of(path)
                config = parse(path)
            except SiteConfigError as exc:
                self.errors[str(path)] = str(exc)
                result[path.stem] = f"refused: {exc}"
                log.error("site config refused; the last good config stays active", extra={"error": str(exc)})
                continue
            self.errors.pop(str(path), None)
            current = await _get(kv, site)
            if current is not None and current.version == config.version:
                result[site] = "unchanged"
                continue
            await kv.put(site, _encoder.encode(config))
            result[site] = "loaded"
            log.info("site config loaded", extra={"site_id": site, "file": str(path), "version": config.version})
        for path in list(self._mtimes):
            if path not in present:
                del self._mtimes[path]
                self.errors.pop(str(path), None)
                if not subjects.TOKEN_RE.match(path.stem):
                    continue  # refused for its name: nothing of it is in the bucket
                try:
                    await kv.delete(path.stem)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                result[path.stem] = "removed"
                log.info("site config removed (defaults apply)", extra={"site_id": path.stem})
        await self._register(kv, await self._known(kv, result))
        return result

    async def _known(self, kv, result: dict[str, str]) -> list[str]:
        """The sites served after this pass: those listed before, changed by its outcomes (a
        refused file's site stays when its last good config does)."""
        known = set(self._registered or ())
        for site, outcome in result.items():
            if outcome in ("loaded", "unchanged") or (outcome.startswith("refused") and subjects.TOKEN_RE.match(site)
                                                             and await _get(kv, site)):
                known.add(site)
            else:
                known.discard(site)
        return sorted(known)

    async def _register(self, kv, sites: list[str]) -> None:
        """The registry's record (REGISTRY_KEY): this directory's sites are all in the bucket.
        Written after their configs, and again only when the list changes."""
        if sites != self._registered:
            await kv.put(REGISTRY_KEY, _encoder.encode(sites))
            self._registered = sites

    async def start(self) -> None:
        await self.sync_once()
        self._task = asyncio.create_task(self._poll(), name="site-config-sync")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync_once()
            except Exception:  # noqa: BLE001 - a bus hiccup must not end the watch
                log.exception("site config sync failed; retrying")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()


async def _get(kv, site: str) -> SiteConfig | None:
    try:
        entry = await kv.get(site)
    except KeyNotFoundError:
        return None
    if entry is None or not entry.value:
        return None
    return _decoder.decode(entry.value)


async def stored_versions(bus: Bus, site: str) -> dict[str, SiteConfig]:
    """The site's configs the bucket still keeps (its history: shared/bus.py
    `SITE_CONFIG_HISTORY`), by version, the current one included: what a replay reruns a
    turn under, the version the turn recorded. Read a message at a time (a get of the next
    message on the key's subject), as reading the current one is."""
    stream, subject = f"KV_{subjects.SITE_CONFIG_BUCKET}", f"$KV.{subjects.SITE_CONFIG_BUCKET}.{site}"
    found: dict[str, SiteConfig] = {}
    seq = 1
    while True:
        try:
            msg = await bus.js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return found
        if msg.data:  # not a deletion's marker
            config = _decoder.decode(msg.data)
            found[config.version] = config
        seq = msg.seq + 1


MAX_CACHED_SITES = 4096


# How much older than its TTL a cached config may be and still be used once more while it is
# read again in the background.
STALE_S = 60.0


class SiteConfigs:
    """Read side: `await configs.get(site)`, cached for `ttl_s` (SITE_CONFIG_TTL_S, read with
    the process's settings). A copy past its TTL (by less than STALE_S) is used once more
    while a fresh one is read in the background: no turn waits for the bucket because a
    visitor took longer than the TTL to write (a one-session turn read it in four of the
    services on its way; each a round trip on the critical path). A change applies from the
    first use after the TTL plus that read. `ttl_s` 0: read every time."""

    def __init__(self, bus: Bus, ttl_s: float = 2.0):
        self.bus = bus
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, SiteConfig | None]] = {}
        self._sites: tuple[float, list[str]] | None = None
        self._kv = None
        self._refreshing: dict[str, asyncio.Task] = {}
        self._loaded = False

    async def get(self, site: str) -> SiteConfig:
        """The site's config, or the defaults when it has none."""
        return await self.find(site) or SiteConfig()

    async def find(self, site: str) -> SiteConfig | None:
        """The site's config, or None when the site is not configured."""
        hit = self._cache.get(site)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        if hit is not None and self.ttl_s > 0 and now - hit[0] < self.ttl_s + STALE_S:
            if site not in self._refreshing:
                task = asyncio.create_task(self._refresh(site), name="site-config-refresh")
                self._refreshing[site] = task
                task.add_done_callback(lambda _: self._refreshing.pop(site, None))
            return hit[1]
        return await self._read(site, hit, now)

    async def _refresh(self, site: str) -> None:
        hit = self._cache.get(site)
        try:
            await self._read(site, hit, time.monotonic())
        except Exception:  # noqa: BLE001 - the bucket unreachable: the copy stays, read again next use
            log.warning("site config refresh failed", extra={"site": site}, exc_info=True)

    async def _read(self, site: str, hit: tuple[float, SiteConfig | None] | None, now: float) -> SiteConfig | None:
        try:
            config = await _get(await self._bucket(), site)
        except Exception:  # noqa: BLE001 - the bucket unreachable: keep what we had
            if hit is not None:
                return hit[1]
            raise
        if config is None and not self._loaded:
            return None  # not there yet, or not a site: asked again until the registry says which
        self._cache[site] = (now, config)
        if len(self._cache) > MAX_CACHED_SITES:  # made-up names must not grow it for ever
            for stale in [k for k, (at, _) in self._cache.items() if now - at >= self.ttl_s] or list(self._cache)[:1]:
                del self._cache[stale]
        return config

    async def configured(self) -> list[str]:
        """Every configured site, cached like the configs."""
        now = time.monotonic()
        if self._sites is not None and now - self._sites[0] < self.ttl_s:
            return self._sites[1]
        try:
            names = await (await self._bucket()).keys()
        except nats.js.errors.NoKeysError:
            names = []
        self._sites = (now, sorted(name for name in names if name != REGISTRY_KEY))
        return self._sites[1]

    async def loaded(self) -> bool:
        """Whether the registry is loaded: its record written and every site it lists readable
        here (a cluster's replica may lag the leader). Once true, stays true: the record is
        only ever rewritten, never deleted."""
        if self._loaded:
            return True
        kv = await self._bucket()
        try:
            entry = await kv.get(REGISTRY_KEY)
        except KeyNotFoundError:
            return False
        for site in _registry_decoder.decode(entry.value) if entry is not None and entry.value else ():
            if await _get(kv, site) is None:
                return False
        self._loaded = True
        return True

    async def _bucket(self):
        if self._kv is None:
            self._kv = await self.bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
        return self._kv
