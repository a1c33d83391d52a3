"""Per-site configuration: what a site is (`SiteConfig`), how it is checked (`validate`), and
the read side of the `site_config` KV bucket that every service uses (`SiteConfigs`).

A config comes from the operator API or the CLI, or from a `sites/<site>.toml` file
(`SiteConfigSync`); all are written by `shared/site_store.py` after the same check: its
types against `SiteConfig` (unknown keys and wrong types are errors), then its values
(`problems`), each problem naming its field. An invalid file is refused with a message
naming the file and the field, and the last good config of that site stays in the bucket.
`SiteConfigs` is a small cache in front of the bucket. Inside the pipeline a site without a
config gets the defaults below; the gateway serves only sites that have one
(`SiteConfigs.find`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import tomllib
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import nats.errors
from nats.js import api as js_api
from nats.js.errors import KeyNotFoundError, NotFoundError

from shared import business_hours, subjects
from shared.company_size import employees
from shared.bus import Bus

log = logging.getLogger(__name__)

RETRIEVAL_MODES = ("global", "local", "hybrid", "mix", "naive")
RERANK_PROVIDERS = ("cohere", "jina")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SKILLS = ("propose_demo", "collect_email", "ask_qualifying_question", "suggest_follow_up", "share_resource")
# The enricher's remote sources (services/enricher), in their default order: a person the site
# knows names their employer; a session provider resolves the browser; an IP, only its network.
ENRICHMENT_SOURCES = ("person_api", "session_provider", "ip_api")
# A site's provider keys live in variables named so (the enricher keeps only those): a site's
# config cannot have another of the deployment's secrets sent to a provider.
ENRICH_KEY_PREFIX = "ENRICH_KEY_"
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
# A site's account pull connector's key lives in a variable named so (the gateway keeps only
# those), for the same reason.
ACCOUNTS_KEY_PREFIX = "ACCOUNTS_KEY_"
MIN_PULL_TTL_S = 60.0
MAX_PULL_TTL_S = 7 * 86_400.0


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


WIDGET_POSITIONS = ("left", "right")
MAX_STARTER_QUESTIONS = 6
MAX_WAIT_S = 86_400  # a handoff's longest wait for an operator: a day
MAX_STARTER_CHARS = 120
MAX_BUDGET_MS = 5_000  # the longest an answer may wait for the visitor's profile
MAX_SEGMENT_TEXT = 500
MAX_SEGMENTS = 50
MAX_SEGMENT_SECTORS = 20
SEGMENT_NAME_RE = re.compile(r"^[\w.-]{1,64}\Z")
WIDGET_TEXT_LIMITS = {"title": 80, "greeting": 500, "launcher_text": 40}


class Widget(Strict):
    """How the chat widget looks on the site's pages (served by `GET /v1/sites/{site}/widget`,
    applied by widget.js when it loads): everything here is public."""

    primary_color: str = "#0b5cad"  # the launcher, the header, the visitor's messages, links
    background_color: str = "#ffffff"
    text_color: str = "#1b1f24"
    title: str = "Ask us anything"
    greeting: str = ""  # the first message shown in a new conversation; empty: none
    launcher_text: str = "Chat with us"
    position: str = "right"  # left | right
    avatar_url: str = ""  # a logo in the header, https only
    starter_questions: list[str] = []  # offered as buttons in a new conversation
    show_sources: bool = True  # the links to the pages an answer cites


class Handoff(Strict):
    """When the conversation goes to a person of the site's team (services/router/routing.py)."""

    enabled: bool = False  # off: a visitor asking for a person is answered as any other message
    lead_score: float = 0.0  # a cumulative interest score at which a qualified lead is handed off (0: never)
    # Where each handoff request is POSTed (signed with the site's lead webhook secret), for
    # the team's own chat tool; empty: `lead.webhook_url`, then LEAD_WEBHOOK_URL.
    webhook_url: str = ""
    # Answers in a row that found nothing in the knowledge base or were rated down, after
    # which the next question goes to the team (0: never).
    not_found_turns: int = 0
    # When the team takes handoffs (shared/business_hours.py): "always", or entries such as
    # "mon-fri 09:00-17:30", in `timezone`. Outside them the visitor is offered an e-mail follow-up.
    hours: str | list[str] = "always"
    timezone: str = "UTC"
    # How long a visitor waits for an operator to join before being offered the e-mail follow-up.
    max_wait_s: int = 300


class Segment(Strict):
    """An audience of the site (shared/segments.py): visitors whose profile names one of
    `sectors` and/or whose company has `employees` in range get its words in their answers."""

    name: str
    sectors: list[str] = []  # e.g. ["HVAC", "Construction"]; matched with the profile's sector or sub-sector
    employees: str = ""  # a range: "1-50", "51-200", "1000+"; matched with the profile's company size
    example: str = ""  # a sentence of the site's about this audience, said once in the conversation
    offer: str = ""  # the plan for this audience, in the site's words, said once
    cta_label: str = ""  # the call to action for this audience, with its booking link
    cta_url: str = ""  # that audience's booking page: the booking flow adds the visitor's answers to it
    tone: str = ""  # the persona's tone for this audience (a model's answers)


class Enrichment(Strict):
    """Who the visitor is, before the answer (services/enricher): which of the deployment's
    providers (ENRICH_<SOURCE>_URL) look the site's visitors up, in which order, with whose
    keys (no key, no call), and how long the answer waits for what they find."""

    # How long an answer may wait, after its route, for the visitor's profile (the company and
    # what the conversation says): within it the answer uses the profile, past it the answer
    # goes without and says so (`late_inputs`). None: the deployment's ANSWER_WAIT_S.
    budget_ms: int | None = None
    # The remote sources in the order asked (names: ENRICHMENT_SOURCES); None: that default
    # order; [] none (the browser's reveal and the offline IP data only).
    sources: list[str] | None = None
    # The environment variables holding this site's own keys (never a key itself: these files
    # live in git), each named ENRICH_KEY_…; empty: the deployment's ENRICH_<SOURCE>_KEY.
    session_provider_key_env: str = ""
    person_api_key_env: str = ""
    ip_api_key_env: str = ""
    # The site's account id where the vendor wants one (Snitcher: the Radar tracking script of
    # the site's pages); empty: the deployment's ENRICH_SESSION_PROVIDER_ACCOUNT.
    session_provider_account: str = ""


class Accounts(Strict):
    """Where the site's accounts come from besides imports (shared/accounts.py): an HTTP
    endpoint of its CRM or data warehouse answering the import's JSON, fetched when the
    operator API reads the accounts and the last fetch is older than `pull_ttl_s`."""

    pull_url: str = ""  # empty: imports only
    # The environment variable holding the endpoint's bearer key, ACCOUNTS_KEY_… (never the
    # key itself: these files live in git); empty: no Authorization header.
    pull_key_env: str = ""
    pull_ttl_s: float = 3600.0


class OperatorAccount(Strict):
    """A named person of the site's team: their own key (its SHA-256 here), so what they do in
    a conversation is theirs (services/gateway/operators.py). `concierge sites key --operator`."""

    name: str
    key_sha256: str


class SiteConfig(Strict):
    name: str = ""
    # Browser origins (scheme://host[:port]) whose pages may call this site's visitor
    # endpoints (CORS); the gateway's own origin always may. "*" allows any (not advised).
    allowed_origins: list[str] = []
    # SHA-256 (hex) of this site's operator API keys (`concierge sites key`): the keys
    # themselves are never in the file. Several entries let a key be rotated without a gap.
    operator_key_sha256: list[str] = []
    # The team's named accounts, each with its own key: the handoff API takes the operator's
    # name from the key (a shared key above names nobody: the request does).
    operators: list[OperatorAccount] = []
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
    widget: Widget = msgspec.field(default_factory=Widget)
    handoff: Handoff = msgspec.field(default_factory=Handoff)
    enrichment: Enrichment = msgspec.field(default_factory=Enrichment)
    accounts: Accounts = msgspec.field(default_factory=Accounts)
    segments: list[Segment] = []
    # Set when stored: a file's content hash (the sync), or the config's (`content_version`:
    # the API and the CLI). What a turn records as its `config_version`.
    version: str = ""


class FieldError(msgspec.Struct):
    """One problem with a config: the field (dotted, `booking.fields[1].kind`; None: the
    whole text) and what is wrong with it."""

    field: str | None
    message: str


class SiteConfigError(ValueError):
    """A config refused; `errors` names each field (the API's 422 lists them)."""

    def __init__(self, message: str, errors: list[FieldError] | None = None):
        super().__init__(message)
        self.errors = errors if errors is not None else [FieldError(None, message)]


# Who the visitor sees and the log records as the team's person (the handoff API's `operator`).
OPERATOR_NAME_RE = re.compile(r"^[\w.-]([\w .-]{0,62}[\w.-])?\Z")
_ORIGIN_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?\Z")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
_COLOR_RE = re.compile(r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})\Z")
_LANGUAGE_RE = re.compile(r"^[a-z]{2,3}(?:-[A-Za-z0-9]{2,8})*\Z")
# What a browser is handed as an attribute or a link: no spaces, quotes or angle brackets.
_URL_CHARS_RE = re.compile(r"^[^\s\"'<>\\]{1,2048}\Z")


def _url(value: str, schemes: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(value)
        return bool(_URL_CHARS_RE.match(value)) and parts.scheme in schemes and bool(parts.hostname)
    except ValueError:  # e.g. an unclosed "[" of an IPv6 host
        return False


def problems(config: SiteConfig) -> list[FieldError]:
    """Everything wrong with a config its types allow (msgspec checked those): every field's
    problem, not only the first, so a form can show them all at once."""
    out: list[FieldError] = []

    def bad(field: str, message: str) -> None:
        out.append(FieldError(field, message))

    for i, origin in enumerate(config.allowed_origins):
        if origin != "*" and not _ORIGIN_RE.match(origin):
            bad(f"allowed_origins[{i}]", f"{origin!r} is not an origin (scheme://host[:port], no path, "
                                         "no trailing slash) or \"*\"")
    for i, digest in enumerate(config.operator_key_sha256):
        if not _SHA256_RE.match(digest):
            bad(f"operator_key_sha256[{i}]", "each entry is a key's SHA-256 in lowercase hex "
                                             "(`concierge sites key --site SITE` prints one)")
    names: set[str] = set()
    for i, account in enumerate(config.operators):
        if not OPERATOR_NAME_RE.match(account.name):
            bad(f"operators[{i}].name", "1-64 letters, digits, spaces, '.', '_' or '-', no space at either end")
        elif account.name.casefold() in names:
            bad(f"operators[{i}].name", f"{account.name!r} is named twice")
        names.add(account.name.casefold())
        if not _SHA256_RE.match(account.key_sha256):
            bad(f"operators[{i}].key_sha256", "a key's SHA-256 in lowercase hex "
                                              "(`concierge sites key --site SITE --operator NAME` prints one)")
    for i, language in enumerate(config.languages):
        if not _LANGUAGE_RE.match(language):
            bad(f"languages[{i}]", f"{language!r} is not a language tag (e.g. en, fr, pt-BR)")
    if not 0.0 <= config.interest.threshold <= 1.0:
        bad("interest.threshold", "must be between 0 and 1")
    if not 0.0 <= config.handoff.lead_score <= 1.0:
        bad("handoff.lead_score", "must be between 0 and 1 (0: never)")
    if not 0 <= config.handoff.not_found_turns <= 20:
        bad("handoff.not_found_turns", "must be between 0 and 20 (0: never)")
    if not 1 <= config.handoff.max_wait_s <= MAX_WAIT_S:
        bad("handoff.max_wait_s", f"must be between 1 and {MAX_WAIT_S} seconds: nobody waits for ever")
    try:
        business_hours.zone(config.handoff.timezone)
    except business_hours.HoursError as exc:
        bad("handoff.timezone", str(exc))
    hours = config.handoff.hours
    if isinstance(hours, list) and hours:
        for i, entry in enumerate(hours):
            try:
                business_hours.window(entry)
            except business_hours.HoursError as exc:
                bad(f"handoff.hours[{i}]", str(exc))
    elif hours != business_hours.ALWAYS or not isinstance(hours, str):
        bad("handoff.hours", f"{business_hours.ALWAYS!r} or a list such as [\"mon-fri 09:00-17:30\"] "
                             "(an empty list would never open)")
    if not 0.0 <= config.persona.weight <= 1.0:
        bad("persona.weight", "must be between 0 and 1")
    unknown = [s for s in config.skills.enabled if s not in SKILLS]
    if unknown:
        bad("skills.enabled", f"unknown skill {unknown[0]!r} (known: {', '.join(SKILLS)})")
    if config.classifier.backend not in ("", "local", "llm", "cascade"):
        bad("classifier.backend", "must be local, llm or cascade")
    if config.cta.first_turn < 1:
        bad("cta.first_turn", "must be ≥ 1")
    if config.cta.cooldown_turns < 0:
        bad("cta.cooldown_turns", "must be ≥ 0")
    for key in ("url", "booking_url"):  # links the widget shows: a `javascript:` URL would run there
        value = getattr(config.cta, key)
        if value and not _url(value, ("https", "http")):
            bad(f"cta.{key}", "must be an http(s) URL")
    r = config.retrieval
    if r.mode is not None and r.mode not in RETRIEVAL_MODES:
        bad("retrieval.mode", f"must be one of {', '.join(RETRIEVAL_MODES)}")
    if r.rerank_provider is not None and r.rerank_provider not in RERANK_PROVIDERS:
        bad("retrieval.rerank_provider", f"must be one of {', '.join(RERANK_PROVIDERS)}")
    for key in ("rerank_top_k", "graph_top_k", "chunk_top_k"):
        if getattr(r, key) is not None and getattr(r, key) < 1:
            bad(f"retrieval.{key}", "must be ≥ 1")
    for field, value in (("lead.webhook_url", config.lead.webhook_url),
                         ("handoff.webhook_url", config.handoff.webhook_url)):  # where the responder POSTs
        if value and not _url(value, ("https", "http")):
            bad(field, "must be an http(s) URL")
    if config.lead.webhook_secret_env and not ENV_NAME_RE.match(config.lead.webhook_secret_env):
        bad("lead.webhook_secret_env", "must name an environment variable (A-Z, 0-9, _), not hold the secret")
    out.extend(_enrichment_problems(config.enrichment))
    a = config.accounts
    if a.pull_url and not _url(a.pull_url, ("https", "http")):
        bad("accounts.pull_url", "must be an http(s) URL")
    elif a.pull_url and (urlsplit(a.pull_url).username or urlsplit(a.pull_url).password):
        bad("accounts.pull_url", "no user name or password in the URL: name a key variable in pull_key_env")
    if a.pull_key_env and not (ENV_NAME_RE.match(a.pull_key_env) and a.pull_key_env.startswith(ACCOUNTS_KEY_PREFIX)):
        bad("accounts.pull_key_env", f"must name an environment variable {ACCOUNTS_KEY_PREFIX}… (A-Z, 0-9, _), "
                                     "not hold the key")
    if not MIN_PULL_TTL_S <= a.pull_ttl_s <= MAX_PULL_TTL_S:
        bad("accounts.pull_ttl_s", f"between {MIN_PULL_TTL_S:.0f} and {MAX_PULL_TTL_S:.0f} seconds")
    names = [f.name for f in config.booking.fields]
    if len(set(names)) != len(names):
        bad("booking.fields", "two fields share a name")
    for i, f in enumerate(config.booking.fields):
        if f.kind not in ("text", "email", "phone", "choice"):
            bad(f"booking.fields[{i}].kind", "must be text, email, phone or choice")
    if config.enrichment.budget_ms is not None and not 0 <= config.enrichment.budget_ms <= MAX_BUDGET_MS:
        bad("enrichment.budget_ms", f"must be between 0 and {MAX_BUDGET_MS} ms: every answer may wait that long")
    out.extend(_segment_problems(config.segments))
    out.extend(_widget_problems(config.widget))
    return out


def _enrichment_problems(e: Enrichment) -> list[FieldError]:
    out = []
    for i, name in enumerate(e.sources or ()):
        if name not in ENRICHMENT_SOURCES:
            out.append(FieldError(f"enrichment.sources[{i}]", f"unknown source {name!r} (known: "
                                                              f"{', '.join(ENRICHMENT_SOURCES)})"))
        elif e.sources.index(name) != i:
            out.append(FieldError(f"enrichment.sources[{i}]", f"{name!r} is named twice"))
    for source in ENRICHMENT_SOURCES:
        value = getattr(e, f"{source}_key_env")
        if value and not (ENV_NAME_RE.match(value) and value.startswith(ENRICH_KEY_PREFIX)):
            out.append(FieldError(f"enrichment.{source}_key_env", f"must name an environment variable "
                                  f"{ENRICH_KEY_PREFIX}… (A-Z, 0-9, _), not hold the key"))
    if e.session_provider_account and not _ACCOUNT_RE.match(e.session_provider_account):
        out.append(FieldError("enrichment.session_provider_account",
                              "1-128 letters, digits, '_' or '-' (it goes into the vendor's URL)"))
    return out


def _segment_problems(segments: list[Segment]) -> list[FieldError]:
    out: list[FieldError] = []
    if len(segments) > MAX_SEGMENTS:
        return [FieldError("segments", f"at most {MAX_SEGMENTS} segments")]
    names: set[str] = set()
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        if len(segment.sectors) > MAX_SEGMENT_SECTORS or any(len(s) > 100 for s in segment.sectors):
            out.append(FieldError(f"{where}.sectors", f"at most {MAX_SEGMENT_SECTORS} sectors of 100 characters"))
        if not SEGMENT_NAME_RE.match(segment.name):
            out.append(FieldError(f"{where}.name", "1-64 letters, digits, '.', '_' or '-'"))
        elif segment.name in names:
            out.append(FieldError(f"{where}.name", f"{segment.name!r} is named twice"))
        names.add(segment.name)
        if not segment.sectors and not segment.employees:
            out.append(FieldError(where, "name `sectors` or `employees` (or both): a segment naming neither "
                                         "matches no visitor"))
        if segment.employees and employees(segment.employees) is None:
            out.append(FieldError(f"{where}.employees", "a range of employees such as \"1-50\", \"51-200\" or "
                                                        "\"1000+\""))
        for key in ("example", "offer", "cta_label", "tone"):
            if len(getattr(segment, key)) > MAX_SEGMENT_TEXT:
                out.append(FieldError(f"{where}.{key}", f"at most {MAX_SEGMENT_TEXT} characters"))
        if segment.cta_url and not _url(segment.cta_url, ("https", "http")):
            out.append(FieldError(f"{where}.cta_url", "must be an http(s) URL"))
        if segment.cta_label and not segment.cta_url:
            out.append(FieldError(f"{where}.cta_label", "goes with a `cta_url` (the site's own CTA has its label)"))
    return out


def _widget_problems(w: Widget) -> list[FieldError]:
    out = []
    for key in ("primary_color", "background_color", "text_color"):
        if not _COLOR_RE.match(getattr(w, key)):
            out.append(FieldError(f"widget.{key}", "must be a hex colour, #rgb or #rrggbb"))
    for key, limit in WIDGET_TEXT_LIMITS.items():
        value = getattr(w, key)
        if len(value) > limit:
            out.append(FieldError(f"widget.{key}", f"at most {limit} characters"))
        elif key in ("title", "launcher_text") and not value.strip():
            out.append(FieldError(f"widget.{key}", "must not be empty"))
    if w.position not in WIDGET_POSITIONS:
        out.append(FieldError("widget.position", "must be left or right"))
    if w.avatar_url and not _url(w.avatar_url, ("https",)):
        out.append(FieldError("widget.avatar_url", "must be an https:// URL"))
    if len(w.starter_questions) > MAX_STARTER_QUESTIONS:
        out.append(FieldError("widget.starter_questions", f"at most {MAX_STARTER_QUESTIONS} questions"))
    for i, question in enumerate(w.starter_questions):
        if not question.strip() or len(question) > MAX_STARTER_CHARS:
            out.append(FieldError(f"widget.starter_questions[{i}]", f"1 to {MAX_STARTER_CHARS} characters"))
    return out


_AT_RE = re.compile(r" - at `\$\.?([^`]*)`\Z")
_NAMED_RE = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def _type_error(exc: msgspec.ValidationError) -> FieldError:
    """msgspec's "Expected `float`, got `str` - at `$.interest.threshold`" as a field and a
    message; an unknown or missing key is named with its table."""
    text = str(exc)
    at = _AT_RE.search(text)
    path = at.group(1) if at else ""
    message = text[:at.start()] if at else text
    named = _NAMED_RE.search(message)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return FieldError(path or None, message)


def validate(data: Any) -> SiteConfig:
    """A config from plain data (a TOML file's tables, an API body): its types, then its
    values, as one check for files, the API and the CLI. Raises SiteConfigError naming each
    field."""
    try:
        config = msgspec.convert(data, SiteConfig)
    except msgspec.ValidationError as exc:
        raise SiteConfigError(str(exc), [_type_error(exc)]) from None
    errors = problems(config)
    if errors:
        raise SiteConfigError("; ".join(f"{e.field}: {e.message}" for e in errors), errors)
    return config


def parse(path: Path) -> SiteConfig:
    """Read and validate one file; errors name the file and the field."""
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SiteConfigError(f"{path}: {exc}") from None
    try:
        config = validate(data)
    except SiteConfigError as exc:
        raise SiteConfigError(f"{path}: {exc}", exc.errors) from None
    config.version = hashlib.sha256(raw).hexdigest()[:16]
    return config


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SiteConfig)


def content_version(config: SiteConfig) -> str:
    """The version of a config written through the API or the CLI: its content's hash (a
    file's is the file's bytes' hash), so the same content is the same version."""
    return hashlib.sha256(_encoder.encode(msgspec.structs.replace(config, version=""))).hexdigest()[:16]


def site_of(path: Path) -> str:
    site = path.stem
    if not subjects.TOKEN_RE.match(site):
        raise SiteConfigError(f"{path}: the file name must be a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    return site


_registry_decoder = msgspec.json.Decoder(list[str])

# The registry's own record in the bucket: the sites the router has loaded, written after
# their configs. Until it exists nobody knows which sites there are, so the gateway is not
# ready (a site it cannot find then may only not be loaded yet). A site id has no '.'.
REGISTRY_KEY = "registry.sites"


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


MAX_CACHED_SITES = 4096  # configs kept, least recently used dropped first
MAX_CACHED_ABSENT = 1024  # names found not to be sites, kept apart: made-up names push out no config


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
        self._cache: OrderedDict[str, tuple[float, SiteConfig]] = OrderedDict()
        self._absent: OrderedDict[str, float] = OrderedDict()  # name → when it was found not to be a site
        self._sites: tuple[float, list[str]] | None = None
        self._kv = None
        self._refreshing: dict[str, asyncio.Task] = {}
        self._loaded = False

    def forget(self, site: str) -> None:
        """Drop this process's copy of `site`'s config (and of the site list): a change this
        process wrote is read at its next use, not a TTL later (a key just made, a pull URL
        just set); other processes' copies expire as usual."""
        self._cache.pop(site, None)
        self._absent.pop(site, None)
        self._sites = None

    async def get(self, site: str) -> SiteConfig:
        """The site's config, or the defaults when it has none."""
        return await self.find(site) or SiteConfig()

    async def find(self, site: str) -> SiteConfig | None:
        """The site's config, or None when the site is not configured."""
        hit = self._hit(site)
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

    def _hit(self, site: str) -> tuple[float, SiteConfig | None] | None:
        hit = self._cache.get(site)
        if hit is not None:
            self._cache.move_to_end(site)
            return hit
        at = self._absent.get(site)
        return None if at is None else (at, None)

    async def _refresh(self, site: str) -> None:
        hit = self._hit(site)
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
        # Both bounded whatever the number of sites and of names asked for.
        if config is None:
            self._cache.pop(site, None)
            self._absent[site] = now
            self._absent.move_to_end(site)
            while len(self._absent) > MAX_CACHED_ABSENT:
                self._absent.popitem(last=False)
        else:
            self._absent.pop(site, None)
            self._cache[site] = (now, config)
            self._cache.move_to_end(site)
            while len(self._cache) > MAX_CACHED_SITES:
                self._cache.popitem(last=False)
        return config

    async def configured(self) -> list[str]:
        """Every site the bucket has a key for (a deleted one too: `find` says None), cached
        like the configs. Read from the stream's own count of its subjects: nats-py's
        `KeyValue.keys()` (a watcher) may end before its first key arrives when the server has
        sent them all and none is handled yet, and then lists no site at all."""
        now = time.monotonic()
        if self._sites is not None and now - self._sites[0] < self.ttl_s:
            return self._sites[1]
        await self._bucket()
        prefix = f"$KV.{subjects.SITE_CONFIG_BUCKET}."
        info = await self.bus.js.stream_info(f"KV_{subjects.SITE_CONFIG_BUCKET}", subjects_filter=prefix + ">")
        names = [subject[len(prefix):] for subject in (info.state.subjects or {})]
        # A site id has no '.': the registry's record and the sync's file records have one.
        self._sites = (now, sorted(name for name in names if "." not in name))
        return self._sites[1]

    async def every(self) -> dict[str, SiteConfig]:
        """Every configured site's config, in one pass over the bucket's stream (an ordered
        consumer delivering each key's last value), for what needs all of them at once (the
        CORS origins' union): thousands of sites are one read, and the per-site cache, which
        keeps the sites used last, is left as it is."""
        if not await self.configured():
            return {}
        await self._bucket()
        prefix = f"$KV.{subjects.SITE_CONFIG_BUCKET}."
        sub = await self.bus.js.subscribe(prefix + "*", ordered_consumer=True,
                                          deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT)
        found: dict[str, SiteConfig] = {}
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=5)
                except nats.errors.TimeoutError:  # no key left to deliver (every one purged meanwhile)
                    return found
                if msg.data:  # not a deletion's marker
                    found[msg.subject[len(prefix):]] = _decoder.decode(msg.data)
                if msg.metadata.num_pending == 0:
                    return found
        finally:
            await sub.unsubscribe()

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
