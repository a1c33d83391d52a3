"""The event contract: every fact about a conversation is one of these Structs.

One tagged union (`Event`), JSON on the wire, decoded once where a message enters a
service. Decoding is validation: anything that does not decode into the union is a
`BadEvent` and goes to the dead-letter subject instead of into a handler.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Annotated, Any, Literal, Union

import msgspec

from shared import subjects

SCHEMA_VERSION = 1

UNKNOWN = "unknown"

Route = Literal["ANSWER", "REDIRECT", "BOOKING", "HANDOFF"]


class Envelope(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=False):
    """Fields every event carries. `event_id` is the JetStream `Nats-Msg-Id`."""

    event_id: str
    site: str
    session_id: str
    turn: int
    ts: float
    causation_id: str | None = None
    producer: str = ""
    schema_version: int = SCHEMA_VERSION
    # A node's output: the conversation's last stored sequence in the state its handler was
    # given (0: none given), so a replay hands the node exactly what it saw.
    input_seq: int = 0
    # A node's output: the version of the site config its handler was given (the file's
    # content hash; empty: no config read, or the site has none), so a replay can tell
    # whether it runs under the config the conversation had.
    config_version: str = ""


class VisitorProfile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Who the visitor is. "unknown" means no source has said anything yet."""

    status: str = UNKNOWN
    tier: str = UNKNOWN
    source: str = UNKNOWN
    ip: str = UNKNOWN
    company_name: str = UNKNOWN
    company_description: str = UNKNOWN
    company_domain: str = UNKNOWN
    sector: str = UNKNOWN
    sub_sector: str = UNKNOWN
    email: str = UNKNOWN
    job_to_be_done: str = UNKNOWN
    feature_list: str = UNKNOWN
    intent: str = UNKNOWN
    sector_confidence_level: str = UNKNOWN
    # How many people the company employs, as a range ("51-200", "1000+": shared/segments.py
    # reads it) and where it is (ISO 3166 alpha-2 when a provider says so, else its name).
    company_size: str = UNKNOWN
    country: str = UNKNOWN
    # How sure the source is that this company is the visitor's (high | medium | low), when
    # a provider says (services/enricher/sources.py: Snitcher's `fuzzy`, PDL's `likelihood`).
    match_confidence: str = UNKNOWN


class TurnRequested(Envelope, tag="turn_requested"):
    """The visitor sent a message; this starts turn `turn`."""

    message: str
    visitor: dict[str, Any] | None = None
    ip_hash: str | None = None  # never the raw IP: see shared/privacy.py
    client_message_id: str | None = None  # the client's id of the message, the same when it sends it again
    # The visitor's message before this one as the log held it when the turn started
    # (shared/history.previous_message: "" when none, or a HACK turn's): what a follow-up
    # is searched with, so retrieval reads no log before its search. None: stored before
    # the gateway said (searched alone).
    previous: str | None = None


class TurnBlocked(Envelope, tag="turn_blocked"):
    """The abuse gate refused this turn before any LLM call; `reply` is what the visitor read."""

    reason: str  # hack | spam | length
    reply: str
    message_chars: int
    language: str = "en"
    client_message_id: str | None = None  # as on TurnRequested


class LLMRole(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An LLM role as the process of the node that recorded it had it: the model, and the
    settings that shape its prompts. A replay re-runs the node with the same (an empty
    `model`: the role had no endpoint, so the node took its path without a model)."""

    model: str = ""
    history_tokens: int = 8000
    json_mode: str = "json_schema"


class IntentClassified(Envelope, tag="intent_classified"):
    intent: str
    confidence: float
    classifier: str  # the backend that decided: local | llm (cascade records which one answered)
    scores: dict[str, float] = {}  # the local model's class probabilities, when it ran
    latency_ms: float = 0.0
    note: str = ""  # e.g. why an input was classified without a model (empty, emoji only)
    markers: list[str] = []  # injection markers (then HACK by rule, confidence 1.0) and corroborating cues found
    runner_up: str = ""  # for a HACK or OFFTOPIC: the most likely other intent, what routing sends an unsure one as
    # The local model the classifier had (its training data's hash) and the embedding model
    # under it (name@version); empty when it has none (the llm backend alone).
    classifier_version: str = ""
    embedding_version: str = ""
    # The `classifier` role as the router had it ({}: recorded before the field existed).
    llm_roles: dict[str, LLMRole] = {}


class InterestSignalsDetected(Envelope, tag="interest_signals_detected"):
    signals: dict[str, bool] = {}
    score: float = 0.0  # cumulative across the conversation, 0..1
    turn_score: float = 0.0  # this turn's contribution
    classifier: str = "local"


class SkillsSelected(Envelope, tag="skills_selected"):
    """How the response should end, as proposed from intent, signals and history."""

    skills: list[str] = []
    classifier: str = "local"
    intent: str = UNKNOWN  # the intent the selection was made with (its own estimate)


class SkillsApplied(Envelope, tag="skills_applied"):
    """The skills the response handler must apply, after the deterministic rules."""

    skills: list[str] = []
    rules: list[str] = []  # which rules changed the selection, in order
    qualification_question: str | None = None  # post-conversion: the question to ask now


class RouteDecided(Envelope, tag="route_decided"):
    route: Route
    reason: str
    intent: str = UNKNOWN
    hack_increment: int = 0
    # A HACK below ROUTER_HACK_STRIKE_CONFIDENCE: no strike, routed as its runner-up (`intent`).
    suspicious: bool = False
    # Which rule decided: DEFAULT, DEMO_REQUESTED, INTEREST_THRESHOLD, PAUSE / EXIT / STAY
    # (mid-booking), STOP (STOP_BOOKING ends the flow), POST_CONVERSION, REDIRECT_<INTENT>.
    branch: str = ""


class BookingProgressed(Envelope, tag="booking_progressed"):
    """The booking flow asked for `pending_field` (None: nothing left to ask)."""

    pending_field: str | None = None
    collected: dict[str, str] = {}
    done: bool = False


class LeadCaptured(Envelope, tag="lead_captured"):
    """The first e-mail address of the conversation was captured."""

    email: str
    capture_context: str = "in_chat_booking"


class EnrichmentCompleted(Envelope, tag="enrichment_completed"):
    """`sources` says what each source did, in priority order: hit, miss, skipped: …,
    failed: …, timeout, circuit open, cancelled."""

    profile: VisitorProfile
    sources: dict[str, str] = {}
    ran: bool = True  # False: this turn needed no new enrichment (the state keeps the last profile)
    cancelled: bool = False
    # Why it fell short for infrastructure reasons (Redis unreachable, the raw IP missing,
    # a source failed or timed out): the next turn runs it again. Empty: nothing to retry.
    trouble: list[str] = []


class ProfileInferred(Envelope, tag="profile_inferred"):
    profile: VisitorProfile
    method: str = "local"  # local | llm
    llm_roles: dict[str, LLMRole] = {}  # the `profiler` role as the enricher had it ({}: not recorded)


class RetrievedDocument(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One retrieved piece of the site's knowledge base, numbered so the answer can cite
    `[n]` and the browser can link it."""

    n: int
    document_type: str  # chunk | entity | relationship
    title: str
    source: str  # the document's URL, or its file when it has none
    snippet: str  # a short excerpt for the browser
    content: str  # what the answer's prompt gets
    doc_id: str = ""
    rerank_score: float | None = None


def public_sources(documents: list[RetrievedDocument]) -> list[dict[str, Any]]:
    """What the browser gets of the sources: enough to show and link them, not their text."""
    return [{"n": d.n, "title": d.title, "url": d.source, "snippet": d.snippet, "document_type": d.document_type,
             **({"rerank_score": d.rerank_score} if d.rerank_score is not None else {})} for d in documents]


class SourcesAttached(Envelope, tag="sources_attached"):
    """The sources an answer may cite, sent on the turn's token subject before its first
    token (the browser shows them as numbered links). Not in the conversation log: the
    log has `RetrievalCompleted` and `ResponseCompleted.sources`."""

    sources: list[dict[str, Any]] = []


class RetrievalCompleted(Envelope, tag="retrieval_completed"):
    """What the retriever found for this turn. Always emitted (empty, cancelled or failed
    included), so whoever waits for it never waits in vain."""

    documents: list[RetrievedDocument] = []
    mode: str = "mix"
    query: str = ""  # the text searched (the message, with history for follow-ups)
    keywords: dict[str, list[str]] = {}  # high_level / low_level, and who extracted them
    found: dict[str, int] = {}  # per document type, before reranking or limiting
    selection: str = "all"  # rerank:<provider> | limiter | all
    fallback: str | None = None  # why the reranker was not used although enabled
    cancelled: bool = False
    error: str | None = None
    latency_ms: float = 0.0
    embedding_version: str = ""  # the embedding model the query was embedded with (name@version)
    # Names an English message asks about ("Salesforce", "SLA") that the site's knowledge
    # never mentions, anywhere: what it holds is about something else, however close.
    unknown_names: list[str] = []
    # The site's contact page among its synced pages ('' when none): named by a reply that
    # cannot help when the site's config gives no support page.
    contact_page: str = ""


class DialogStateExtracted(Envelope, tag="dialog_state_extracted"):
    """Flags seen in this turn (emoji markers, captured email, ...)."""

    flags: dict[str, bool] = {}


class FormFieldsExtracted(Envelope, tag="form_fields_extracted"):
    values: dict[str, str] = {}


class SuggestionsRouted(Envelope, tag="suggestions_routed"):
    """Which suggester should run: `follow_up` (questions the visitor may ask next) or
    `answers` (options for answering the question the reply just asked)."""

    kind: str


class SuggestionsGenerated(Envelope, tag="suggestions_generated"):
    kind: str  # follow_up | answers | none
    suggestions: list[str] = []
    error: str | None = None
    skipped: str = ""  # why no model was asked (a HACK turn), empty when one was


class WebhookRecorded(Envelope, tag="webhook_recorded"):
    """A webhook's outcome, whatever it was: a captured lead's (`hook` lead, caused by the
    LeadCaptured) or a handoff request's (`hook` handoff, caused by the HandoffRequested)."""

    target: str  # the URL (no secret in it)
    ok: bool
    status: int | None = None
    attempts: int = 0
    error: str | None = None
    skipped: bool = False  # nothing sent: no webhook configured, or a duplicate
    duplicate_of: str | None = None  # the LeadCaptured that owns this conversation's lead
    hook: str = "lead"  # lead | handoff; events stored before handoff webhooks have none: lead
    # Attempts whose fate is unknown (no answer read, or a sender that died before recording
    # its outcome): how many copies beyond one the receiver may have got, same webhook-id.
    uncertain: int = 0


class AnalyticsRecorded(Envelope, tag="analytics_recorded"):
    """An analytics event: sent to a PostHog-compatible capture API when one is
    configured, recorded here either way."""

    event_name: str
    properties: dict[str, Any] = {}
    sent: bool = False
    ok: bool = False
    error: str | None = None


class LLMCall(msgspec.Struct, kw_only=True):
    """One call to an LLM, complete enough to replay it without the provider: the request
    (`model` as asked for, `messages`, `params`: temperature, response format, ... as the
    node passed them) and what answered it (`served_model`, `system_fingerprint`: the
    provider's own names for the model snapshot and its backend, empty when it sent none)."""

    role: str
    model: str
    base_url: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = {}
    response_text: str = ""
    usage: dict[str, int] = {}
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    attempts: int = 0
    error: str | None = None
    fallback_used: bool = False  # answered (or last tried) by the role's fallback endpoint
    truncated: int = 0  # characters cut from messages and response to fit the bus (0: recorded whole)
    served_model: str = ""
    system_fingerprint: str = ""


class LLMCallRecorded(Envelope, tag="llm_call_recorded"):
    node: str
    call: LLMCall


TRUNCATED = "…[truncated {n} chars]"


def fit_llm_call(event: LLMCallRecorded, max_bytes: int) -> LLMCallRecorded:
    """The record as it can be stored: whole when it encodes to `max_bytes` or less;
    otherwise every message content and the response cut to the longest common length that
    fits, each cut visible (`TRUNCATED`) and counted in `call.truncated`. A record that
    cannot fit even so keeps a note of its messages instead of them. A call is never lost
    (and a turn never fails) because its record was too big for the bus."""
    if len(encode(event)) <= max_bytes:
        return event
    call = event.call

    def cut(text: str, cap: int) -> tuple[str, int]:
        return (text, 0) if len(text) <= cap else (text[:cap] + TRUNCATED.format(n=len(text) - cap), len(text) - cap)

    def capped(cap: int) -> LLMCallRecorded:
        messages, total = [], 0
        for message in call.messages:
            content = message.get("content")
            if isinstance(content, str):
                content, n = cut(content, cap)
                total += n
                message = {**message, "content": content}
            messages.append(message)
        response, n = cut(call.response_text, cap)
        shrunk = msgspec.structs.replace(call, messages=messages, response_text=response, truncated=total + n)
        return msgspec.structs.replace(event, call=shrunk)

    longest = max([len(call.response_text)] + [len(m["content"]) for m in call.messages
                                               if isinstance(m.get("content"), str)])
    low, high = 0, longest
    while low < high:  # the longest cap that fits
        mid = (low + high + 1) // 2
        if len(encode(capped(mid))) <= max_bytes:
            low = mid
        else:
            high = mid - 1
    best = capped(low)
    if len(encode(best)) <= max_bytes:
        return best
    chars = sum(len(m["content"]) for m in call.messages if isinstance(m.get("content"), str))
    note = {"role": "system", "content": TRUNCATED.format(n=chars) + f" ({len(call.messages)} messages)"}
    response, n = cut(call.response_text, 0)
    shrunk = msgspec.structs.replace(call, messages=[note], response_text=response, params={}, truncated=chars + n,
                                     error=call.error[:1000] if call.error else call.error)
    return msgspec.structs.replace(event, call=shrunk)


class TokenChunk(Envelope, tag="token_chunk"):
    """A piece of a streamed answer. Lives on `tokens.*`, not in the conversation log."""

    index: int
    content: str
    attempt: int = 1


class ResponseCompleted(Envelope, tag="response_completed"):
    node: str
    text: str
    token_count: int
    attempt: int = 1
    fallback_used: bool = False
    late_inputs: list[str] = []  # background results the answer went without (past their deadline)
    sources: list[int] = []  # the numbers of the retrieved documents the answer was given to cite
    backend: str = "llm"  # what wrote an answer: llm | extractive (sentences of the sources, no model)
    # The citation audit (services/responder/answer_audit.py), never blocking: sources were
    # given and none was cited; figures that no source, visitor message or site word holds.
    uncited: bool = False
    unsupported_numbers: list[str] = []
    embedding_version: str = ""  # extractive: the embedding model that chose the sentences (name@version)
    # The responder's roles (answer, redirect, suggestions) as it had them ({}: not recorded).
    llm_roles: dict[str, LLMRole] = {}
    # When its first token went out to the visitor (the responder's clock; 0: none sent, or
    # stored before it was recorded): the time to first token is this less the turn's request.
    first_token_ts: float = 0.0
    # The site's audience segments the visitor's profile matched (shared/segments.py): their
    # example, offer and call to action shaped the answer.
    segments: list[str] = []


class TurnCompleted(Envelope, tag="turn_completed"):
    metadata: dict[str, Any] = {}


class TurnFailed(Envelope, tag="turn_failed"):
    """A node gave up on this turn after its last attempt. The gateway ends the SSE stream."""

    node: str
    reason: str
    attempts: int
    failed_event_id: str | None = None


# --- lead briefs (services/enricher/briefs) -----------------------------------------------
# A captured lead becomes a work item (BriefRequested, on the BRIEFS work-queue stream); the
# steps that follow are stored in the lead's conversation like every other fact about it.

BriefStage = Literal["exploring", "evaluating", "ready_to_buy", "support_only", "not_a_fit"]
TriageClass = Literal["call_first", "nurture", "disqualify"]
Verdict = Literal["pass", "marginal", "fail"]
BRIEF_STAGES: tuple[str, ...] = BriefStage.__args__
TRIAGE_CLASSES: tuple[str, ...] = TriageClass.__args__
# A site's triage lives in a log of its own: this session id (a valid subject token that no
# widget session can have: the gateway makes session ids without a leading underscore).
TRIAGE_SESSION = "_triage"


# Stored in a lead's log, but about the lead, not a step of its turn (a replay leaves them out).
LEAD_BRIEF_EVENTS = ("brief_gathered", "brief_drafted", "brief_evaluated", "brief_completed", "brief_failed",
                     "triage_completed")


class BriefMetadata(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The brief's machine-readable line; decoding it is its validation."""

    priority: Annotated[int, msgspec.Meta(ge=1, le=10)]
    stage: BriefStage
    estimated_seats: Annotated[int, msgspec.Meta(ge=0)]
    confidence: Annotated[int, msgspec.Meta(ge=0, le=100)]


class BriefMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str
    turn: int


class BriefSource(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A knowledge-base section the conversation retrieved, numbered for citing as [n]."""

    number: int
    title: str = ""
    url: str = ""
    text: str = ""


class SimilarLead(msgspec.Struct, kw_only=True):
    session_id: str
    stage: str
    priority: int
    summary: str


class BriefInputs(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Everything a brief may say, gathered once (BriefGathered): what the writer is given,
    and what the numeric audit checks the brief against."""

    site_name: str = ""
    email: str = ""
    capture_context: str = ""
    language: str = ""
    transcript: list[BriefMessage] = []
    profile: VisitorProfile = msgspec.field(default_factory=VisitorProfile)
    interest_signals: dict[str, bool] = {}
    interest_score: float = 0.0
    form_fields: dict[str, str] = {}
    sources: list[BriefSource] = []
    similar_leads: list[SimilarLead] = []


class BriefRequested(Envelope, tag="brief_requested", kw_only=True):
    """A work item: write this lead's brief. On `briefs.<site>.<session>.brief_requested`
    (the BRIEFS work queue: each item handled once, by any replica)."""

    reason: str = "lead_captured"  # lead_captured | booking_completed | operator
    request_id: str = ""


class BriefGathered(Envelope, tag="brief_gathered", kw_only=True):
    request_id: str = ""
    inputs: BriefInputs


class BriefDrafted(Envelope, tag="brief_drafted", kw_only=True):
    """One draft after its checks: sections still missing after the focused re-prompt (and
    which it added), the metadata and how it was obtained, numbers found in no input."""

    attempt: int
    text: str
    repaired_sections: list[str] = []
    missing_sections: list[str] = []
    metadata: BriefMetadata | None = None
    metadata_method: str = "line"  # line | structured | none
    metadata_error: str = ""
    ungrounded_numbers: list[str] = []


class BriefEvaluated(Envelope, tag="brief_evaluated", kw_only=True):
    attempt: int
    verdict: Verdict
    issues: list[str] = []


class BriefCompleted(Envelope, tag="brief_completed", kw_only=True):
    request_id: str = ""
    backend: str = "llm"  # llm | data (built from the gathered data only, no model)
    brief: str
    metadata: BriefMetadata
    call_script: str
    summary: str  # one line, what a triage is given
    verdict: str = ""  # the evaluator's last verdict ("": not evaluated, the data backend)
    issues: list[str] = []
    ungrounded_numbers: list[str] = []
    missing_sections: list[str] = []
    attempts: int = 1  # drafts written (2: the evaluator failed the first)
    duration_s: float = 0.0


class BriefFailed(Envelope, tag="brief_failed", kw_only=True):
    """A brief step gave up (its last attempt failed, or a model never gave valid metadata)."""

    node: str
    reason: str
    attempts: int = 1
    request_id: str = ""
    failed_event_id: str | None = None


class TriageRequested(Envelope, tag="triage_requested", kw_only=True):
    """A work item: rank the site's open leads. Session `TRIAGE_SESSION`."""

    request_id: str = ""




class TriageItem(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    classification: TriageClass
    reason: str


class TriageCompleted(Envelope, tag="triage_completed", kw_only=True):
    request_id: str = ""
    backend: str = "llm"  # llm | data (the rule over each brief's metadata)
    items: list[TriageItem] = []
    leads: int = 0
    # Why a model's triage was not used (invalid after its repair round): the rule ranked them.
    model_error: str = ""


# --- knowledge sources (services/retriever/sources) ------------------------------------
# A site's knowledge source (a website, an uploaded file, a text snippet) has a log of its
# own: session `<SOURCE_PREFIX><source id>`, turn 0 its definition, turn N its N-th sync run.
# A run's pages are work items on the BRIEFS work queue (each fetched once, by any replica);
# what each fetch found and how the run ended are stored in the source's log.

SOURCE_PREFIX = "_src-"
SourceKind = Literal["website", "file", "text"]
PageOutcome = Literal["changed", "unchanged", "gone", "failed", "skipped"]


class SourceSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a source is. A website: `url` (a start page or a sitemap), same-site only, the
    paths `include`d (none: all) and not `exclude`d (fnmatch patterns on the URL's path), at
    most `max_pages` pages; a file: `name` and the uploads object it is stored under; a text
    snippet: `title` and `text`. `every_s`: re-synced that often (0: on demand only)."""

    id: str
    kind: SourceKind
    url: str = ""
    include: list[str] = []
    exclude: list[str] = []
    max_pages: int = 500
    every_s: float = 0.0
    name: str = ""
    upload: str = ""  # the uploads object store key of a file's bytes
    size: int = 0
    title: str = ""
    text: str = ""


class SourceAdded(Envelope, tag="source_added", kw_only=True):
    """A source defined (or redefined: the newest counts). Turn 0 of the source's log."""

    source: SourceSpec
    actor: str = ""


class SourceRemoved(Envelope, tag="source_removed", kw_only=True):
    """The source is gone: its pages leave the knowledge base, no run starts again."""

    actor: str = ""


class SourceForgotten(Envelope, tag="source_forgotten", kw_only=True):
    """A removed source's pages have left the knowledge base (the sync collector's answer to
    `SourceRemoved`): what answers know changed."""

    documents: int = 0


class SyncRequested(Envelope, tag="sync_requested", kw_only=True):
    """Run N of the source (turn N): on demand, on its schedule, or when it was added."""

    reason: str = "operator"  # operator | schedule | added
    actor: str = ""


class PageTarget(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A page a run fetches, with what the knowledge base holds of it (for a conditional
    request, and to tell an unchanged page by its text's hash)."""

    url: str
    etag: str = ""
    last_modified: str = ""
    content_hash: str = ""


class SyncStarted(Envelope, tag="sync_started", kw_only=True):
    """The run's plan: the source as it was, the pages known at the start (a sitemap's, or
    the start page and, for a home page, its site's sitemap's), whether links found on pages are followed, and robots.txt's text."""

    source: SourceSpec
    pages: list[PageTarget] = []
    discover: bool = False
    robots: str = ""
    user_agent: str = ""
    sitemap: str = ""  # a home page's source: the site's sitemap whose pages were added


class PageFetchRequested(Envelope, tag="page_fetch_requested", kw_only=True):
    """A work item: fetch one page of run `turn` (on `briefs.<site>.<session>.page_fetch_requested`)."""

    page: PageTarget


class PageFetched(Envelope, tag="page_fetched", kw_only=True):
    """What fetching one page found. `changed`: its text is staged under `staged` for the
    run's end; `gone`: the site says it no longer exists (404, 410); `failed`: it could not
    be read this time (the knowledge base keeps what it had); `skipped`: not a page to keep
    (robots.txt, not HTML or a document, out of scope after a redirect). `links`: the pages
    in scope it links to (followed when the run discovers)."""

    url: str
    outcome: PageOutcome
    status: int = 0
    title: str = ""
    reason: str = ""
    content_hash: str = ""
    etag: str = ""
    last_modified: str = ""
    staged: str = ""
    chars: int = 0
    links: list[str] = []


class SyncCompleted(Envelope, tag="sync_completed", kw_only=True):
    """The run's pages applied to the knowledge base."""

    pages: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    skipped: int = 0
    chunks: int = 0
    seconds: float = 0.0
    failed_pages: list[str] = []  # the first few (their reasons: their PageFetched)


class SyncFailed(Envelope, tag="sync_failed", kw_only=True):
    """The run ended without changing the knowledge base: what serves stays as it was."""

    reason: str
    node: str = ""
    attempts: int = 1
    failed_event_id: str | None = None


SOURCE_EVENTS = ("source_added", "source_removed", "sync_requested", "sync_started", "page_fetched",
                 "sync_completed", "sync_failed")


def is_conversation(session_id: str) -> bool:
    """Whether a session is a visitor's conversation, not one of a site's own logs (its
    triage, its config's changes, a knowledge source's runs), which are named with a
    leading underscore: a name the gateway never gives a conversation."""
    return not session_id.startswith("_")



# --- sites (shared/site_store.py) -----------------------------------------------------------
# A site's own log: the changes to its config, in this session (a subject token no widget
# session has, as TRIAGE_SESSION), turn 0.
SITE_SESSION = "_site"


class SiteChanged(Envelope, tag="site_changed", kw_only=True):
    """A site's config was created, changed or deleted: by whom (`actor`: `admin`,
    `key:<site>:<hash prefix>`, `cli:<user>`, `file:<path>`), between which versions, and
    the names of the fields that changed. Names only, never values: a key's hash, the
    instructions or a webhook's variable reach no one who reads the log."""

    change: Literal["created", "updated", "deleted"]
    version: str  # "" when deleted
    previous_version: str = ""  # "" when created
    fields_changed: list[str] = []
    actor: str


# --- a site's own test cases (shared/eval_cases.py) ----------------------------------------
# Each case has a log of its own: session `<EVAL_CASE_PREFIX><case id>`, turn N its version N.
EVAL_CASE_PREFIX = "_case-"


class HistoryMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: str  # user | assistant
    content: str


class Expect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What should have happened (shared/eval_cases.py says what each means)."""

    intent: str = ""
    route: str = ""
    facts: list[list[str]] = []  # each fact, in any of its spellings
    forbidden: list[str] = []
    pages: list[str] = []
    decline: bool = False


class EvalCase(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A visitor's message, the conversation before it, and what should have happened."""

    id: str
    message: str
    history: list[HistoryMessage] = []
    lang: str = ""
    expect: Expect = msgspec.field(default_factory=Expect)
    note: str = ""
    from_session: str = ""  # the conversation it was made from (erase-visitor finds it by this)
    from_turn: int = 0


class EvalCaseSaved(Envelope, tag="eval_case_saved", kw_only=True):
    """A version of one of the site's test cases (turn N: version N), by whom."""

    case: EvalCase
    actor: str = ""


class EvalCaseRetired(Envelope, tag="eval_case_retired", kw_only=True):
    """The case is withdrawn from the site's runs (a later version brings it back)."""

    actor: str = ""


# A run of a site's cases (shared/eval_runs.py): its own log, session `<EVAL_RUN_PREFIX><run
# id>`, holds the request, a result per case and the end. Each case is asked in a session of
# its own (`<EVAL_TRY_PREFIX><run>-<case>`) through the real nodes: never a visitor's
# conversation, so no listing, insight figure or webhook counts it (`is_conversation`).
EVAL_RUN_PREFIX = "_run-"
EVAL_TRY_PREFIX = "_try-"


class EvalRunRequested(Envelope, tag="eval_run_requested", kw_only=True):
    """Run the site's current cases against the system as it is now."""

    reason: str  # operator | sync | config
    actor: str = ""
    cause: str = ""  # what brought it: the sync's source and run, the config's version


class EvalCaseResult(Envelope, tag="eval_case_result", kw_only=True):
    """One case asked in a run: what happened, and each expectation it missed."""

    case_id: str
    version: int
    passed: bool
    failures: list[str] = []  # e.g. "intent SUPPORT, expected LEARN", "missing fact: 14 days"
    message: str = ""
    intent: str = ""
    route: str = ""
    answer: str = ""
    cited: list[str] = []  # the addresses of the sources the answer cites
    seconds: float = 0.0


class EvalRunCompleted(Envelope, tag="eval_run_completed", kw_only=True):
    """A run's end: how many cases passed, which failed, which failed first this time."""

    cases: int
    passed: int
    failed: list[str] = []
    newly_failing: list[str] = []  # failed now and passed in the site's previous completed run
    previous_run: str = ""
    seconds: float = 0.0
    error: str = ""  # the run could not finish: its cases left unjudged


# --- account data (shared/accounts.py) ------------------------------------------------------


DealOutcome = Literal["won", "lost", "churned", "expanded"]


class Metric(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One usage figure of an account: where it stands against its plan's limit (None: none)."""

    metric: str
    current: float
    limit: float | None = None
    unit: str = ""


class Account(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    name: str
    domain: str = ""
    tier: str = ""
    arr: float = 0.0
    currency: str = "USD"
    renewal_date: str = ""  # YYYY-MM-DD; "" unknown
    owner: str = ""  # the account manager
    industry: str = ""
    employees: int | None = None
    notes: str = ""
    usage: list[Metric] = []


class Deal(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A past deal of the site's: what a report's evidence is matched from (tier, outcome)."""

    id: str
    account: str  # the customer's name
    tier: str = ""
    outcome: DealOutcome
    value: float = 0.0
    currency: str = "USD"
    date: str = ""  # YYYY-MM-DD
    summary: str = ""
    lessons: str = ""


class AccountsImported(Envelope, tag="accounts_imported", kw_only=True):
    """Accounts and deals were imported into the site's `accounts` bucket (session
    `_accounts`, turn 0): by whom (`actor`, as in SiteChanged), from where (`source`: cli,
    api, pull, sample) and how many records were added, changed or left as they were, by
    kind (`accounts`, `deals`). Counts only: the records are in the bucket."""

    actor: str
    source: str
    added: dict[str, int]
    changed: dict[str, int]
    unchanged: dict[str, int]


# --- account reports (services/enricher/reports) --------------------------------------------
# An operator asks for reports on accounts: one work item per account (AccountReportRequested,
# on the BRIEFS work queue); its steps are stored in the account's own log, session
# `ACCOUNT_PREFIX + <account id>` (shared/account_reports.py `session_of`), turn 0: no
# visitor's conversation is touched, and every report is kept (the newest is the latest).
ACCOUNT_PREFIX = "_acct-"
Proposition = Literal["upsell", "negotiation", "churn", "healthy"]
PROPOSITIONS: tuple[str, ...] = Proposition.__args__
ACCOUNT_REPORT_EVENTS = ("account_report_gathered", "account_report_drafted", "account_report_evaluated",
                         "account_report_completed", "account_report_failed", "account_report_edit_requested",
                         "account_report_revised", "account_report_edit_failed", "opportunities_completed",
                         "opportunities_failed")
# The site's log of opportunity searches across its accounts (a name no widget session has).
OPPORTUNITIES_SESSION = "_opportunities"
# How a report's version came to be: written by the pipeline, a section edited by hand, or a
# change asked for in words (an "update_report" instruction).
Revision = Literal["generated", "hand", "asked"]


class ReportMetadata(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The report's machine-readable line; decoding it is its validation."""

    proposition: Proposition
    success_percent: Annotated[int, msgspec.Meta(ge=0, le=100)]
    priority: Annotated[int, msgspec.Meta(ge=1, le=10)]


REPORT_SECTIONS = ("Executive Summary", "Situation", "Complication", "Resolution", "Key Metrics", "Evidence",
                   "Risks", "Next Steps", "Key Questions")


class ReportSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One of a report's nine sections (its `## ` heading's name) and its text."""

    name: str
    text: str


class MatchedDeal(msgspec.Struct, kw_only=True):
    """A historical deal picked as evidence for a report, with its score (reports/deals.py)."""

    deal: Deal
    score: int
    why: list[str] = []


class ReportInputs(msgspec.Struct, kw_only=True):
    """Everything a report may say, gathered once (AccountReportGathered): the account as
    stored when gathered, the deals matched for it, and the day the report is written for
    (renewal distances are counted from it)."""

    site_name: str = ""
    account: Account
    deals: list[MatchedDeal] = []
    today: str = ""  # YYYY-MM-DD
    # The sections the account manager wrote by hand in the account's previous report: a new
    # report keeps them as written (reports/edits.py `keep`).
    kept_sections: list[ReportSection] = []


class AccountReportRequested(Envelope, tag="account_report_requested", kw_only=True):
    """A work item: write this account's report. On `briefs.<site>.<session>.account_report_requested`.
    `account`: the account itself, for one pasted into the demo (stored nowhere else); None:
    the site's stored account `account_id`."""

    account_id: str
    request_id: str = ""
    account: Account | None = None


class AccountReportGathered(Envelope, tag="account_report_gathered", kw_only=True):
    request_id: str = ""
    inputs: ReportInputs


class AccountReportDrafted(Envelope, tag="account_report_drafted", kw_only=True):
    """One draft after its checks: sections still missing after the focused re-prompt (and
    which it added), the metadata and how it was obtained, the input figures it leaves out
    (`numbers_warning`: more than half of them)."""

    attempt: int
    text: str
    repaired_sections: list[str] = []
    missing_sections: list[str] = []
    metadata: ReportMetadata | None = None
    metadata_method: str = "line"  # line | structured | none
    metadata_error: str = ""
    missing_numbers: list[str] = []
    numbers_warning: bool = False


class AccountReportEvaluated(Envelope, tag="account_report_evaluated", kw_only=True):
    attempt: int
    verdict: Verdict
    issues: list[str] = []


class AccountReportCompleted(Envelope, tag="account_report_completed", kw_only=True):
    request_id: str = ""
    account_id: str
    backend: str = "llm"  # llm | data (built from the figures only, no model)
    report: str
    metadata: ReportMetadata
    sales_script: str
    deals: list[str] = []  # the matched deals' ids, in the order the writer was given them
    verdict: str = ""  # the evaluator's last verdict ("": not evaluated, the data backend)
    issues: list[str] = []
    missing_numbers: list[str] = []
    numbers_warning: bool = False
    missing_sections: list[str] = []
    attempts: int = 1
    duration_s: float = 0.0
    hand_edited: list[str] = []  # sections kept from the previous report's hand edits
    # The report split: the text before its first section (a label, a title), and its
    # sections in canonical order: what a version's edits apply to (shared/account_reports.py).
    preamble: str = ""
    sections: list[ReportSection] = []


class AccountReportEditRequested(Envelope, tag="account_report_edit_requested", kw_only=True):
    """A work item: change report `request_id` of account `account_id`. By hand (`section`,
    `text`: that section's new text, written on `base_version`) or asked in words
    (`instruction`: only what it asks for changes, hand edits are kept). On the BRIEFS work
    queue, in the account's session; its outcome (a revision or a failure) names `edit_id`."""

    account_id: str
    request_id: str  # the report's (its AccountReportCompleted's request_id)
    edit_id: str
    how: Literal["hand", "asked"]
    actor: str
    section: str = ""
    text: str = ""
    base_version: int = 0  # hand: the version the text was written on (0: the latest)
    instruction: str = ""


class AccountReportRevised(Envelope, tag="account_report_revised", kw_only=True):
    """A new version of a report (version 1 is the AccountReportCompleted): the sections
    changed (`changes`: their text after), who and how, and which sections are hand edits
    now. Every version is kept; the newest is the report's current text."""

    account_id: str
    request_id: str
    edit_id: str
    version: int
    how: Literal["hand", "asked"]
    actor: str
    instruction: str = ""
    backend: str = ""  # asked: llm | data (the rule editor)
    changes: list[ReportSection]
    hand_edited: list[str] = []
    ignored: list[str] = []  # asked: hand-edited sections the change would have touched, kept


class AccountReportEditFailed(Envelope, tag="account_report_edit_failed", kw_only=True):
    """An edit that could not be made, and why (the report is unchanged)."""

    account_id: str
    request_id: str
    edit_id: str
    node: str
    reason: str
    attempts: int = 1
    failed_event_id: str | None = None


class Opportunity(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One account's call in an opportunity search: what to propose (healthy: nothing now) and why."""

    account_id: str
    proposition: Proposition
    reason: str


class OpportunitiesRequested(Envelope, tag="opportunities_requested", kw_only=True):
    """A work item: rank these accounts (none named: all of the site's) by opportunity and
    pre-select the best `select` for reports. Session `OPPORTUNITIES_SESSION`."""

    request_id: str = ""
    accounts: list[str] = []
    select: int = 3


class OpportunitiesCompleted(Envelope, tag="opportunities_completed", kw_only=True):
    """The accounts ranked, best opportunity first (one validated model call over all of
    them, or the rule: reports/opportunities.py), and the ones pre-selected for reports."""

    request_id: str = ""
    backend: str = "llm"  # llm | data (the rule over each account's figures)
    items: list[Opportunity] = []
    selected: list[str] = []
    accounts: int = 0
    model_error: str = ""  # why the model's ranking was not used (the rule ranked them)


class OpportunitiesFailed(Envelope, tag="opportunities_failed", kw_only=True):
    node: str
    reason: str
    request_id: str = ""
    attempts: int = 1
    failed_event_id: str | None = None


class AccountReportFailed(Envelope, tag="account_report_failed", kw_only=True):
    node: str
    reason: str
    account_id: str = ""
    attempts: int = 1
    request_id: str = ""
    failed_event_id: str | None = None


# What goes on the BRIEFS work queue, not in a log (the queue's name is older than its pages).
WORK_ITEMS = (BriefRequested, TriageRequested, PageFetchRequested, AccountReportRequested,
              AccountReportEditRequested, OpportunitiesRequested)


# --- visitor feedback (services/gateway/routes/feedback.py) ---------------------------------
FEEDBACK_REASON_CHARS = 500
Rating = Literal["up", "down"]


class FeedbackGiven(Envelope, tag="feedback_given", kw_only=True):
    """The visitor rated the answer of turn `turn` (the widget's thumbs), with what they
    wrote, if anything (at most FEEDBACK_REASON_CHARS; redacted by an erase). A turn's
    latest vote counts: a second vote replaces the first."""

    rating: Rating
    reason: str = ""


# --- human handoff (services/responder/handoff_handler.py, services/gateway/routes/handoffs.py) ---
# A HANDOFF turn asks for a person (`HandoffRequested`, a step of its turn); what operators do
# then happens between turns (turn = the conversation's latest turn when it happened).
HandoffReason = Literal["visitor_asked", "lead_score", "not_found", "operator"]
HandoffOutcome = Literal["released", "closed", "out_of_hours", "no_answer"]
UNANSWERED = ("out_of_hours", "no_answer")  # the outcomes that offer an e-mail follow-up


class HandoffRequested(Envelope, tag="handoff_requested", kw_only=True):
    """The conversation waits for a person of the site's team: why (`reason`), in words
    (`detail`)."""

    reason: HandoffReason
    detail: str = ""


class OperatorJoined(Envelope, tag="operator_joined", kw_only=True):
    """An operator took the conversation (the first claim wins): the AI stops answering."""

    operator: str


class OperatorMessage(Envelope, tag="operator_message", kw_only=True):
    """What the operator holding the conversation wrote to the visitor."""

    operator: str
    text: str


class OperatorLeft(Envelope, tag="operator_left", kw_only=True):
    operator: str


class HandoffEnded(Envelope, tag="handoff_ended", kw_only=True):
    """The handoff is over: back to the AI (`released`), the conversation closed, or nobody
    could take it (by "system"): asked outside the team's hours (`out_of_hours`) or nobody
    joined within the site's maximum wait (`no_answer`). Those two offer the visitor an
    e-mail follow-up: `message`, the words the visitor is shown (in their language)."""

    by: str  # an operator's name, or "system"
    outcome: HandoffOutcome
    message: str = ""


HANDOFF_EVENTS = ("operator_joined", "operator_message", "operator_left", "handoff_ended")


class ProjectionFailed(Envelope, tag="projection_failed", kw_only=True):
    """The insight projector gave up on this conversation's event after its last attempt:
    the conversation's insight record lags its log until the next of its turns ends or
    `concierge insight rebuild` runs. The event is also in the node's dead letters."""

    node: str
    reason: str
    attempts: int
    failed_event_id: str


# Stored in a log, but no step of a turn: written after it or beside it by what a replay does
# not run (cli/replay/diff.py leaves them out of a turn's outcome).
OUTSIDE_TURNS = (*LEAD_BRIEF_EVENTS, "site_changed", "feedback_given", "projection_failed", *HANDOFF_EVENTS,
                 "accounts_imported", *ACCOUNT_REPORT_EVENTS)


Event = Union[
    TurnRequested,
    TurnBlocked,
    IntentClassified,
    InterestSignalsDetected,
    SkillsSelected,
    SkillsApplied,
    RouteDecided,
    BookingProgressed,
    LeadCaptured,
    WebhookRecorded,
    AnalyticsRecorded,
    EnrichmentCompleted,
    ProfileInferred,
    RetrievalCompleted,
    SourcesAttached,
    DialogStateExtracted,
    FormFieldsExtracted,
    SuggestionsRouted,
    SuggestionsGenerated,
    LLMCallRecorded,
    TokenChunk,
    ResponseCompleted,
    TurnCompleted,
    TurnFailed,
    BriefRequested,
    BriefGathered,
    BriefDrafted,
    BriefEvaluated,
    BriefCompleted,
    BriefFailed,
    TriageRequested,
    TriageCompleted,
    SourceAdded,
    SourceRemoved,
    SourceForgotten,
    SyncRequested,
    SyncStarted,
    PageFetchRequested,
    PageFetched,
    SyncCompleted,
    SyncFailed,
    SiteChanged,
    AccountsImported,
    AccountReportRequested,
    AccountReportGathered,
    AccountReportDrafted,
    AccountReportEvaluated,
    AccountReportCompleted,
    AccountReportFailed,
    AccountReportEditRequested,
    AccountReportRevised,
    AccountReportEditFailed,
    OpportunitiesRequested,
    OpportunitiesCompleted,
    OpportunitiesFailed,
    FeedbackGiven,
    ProjectionFailed,
    HandoffRequested,
    OperatorJoined,
    OperatorMessage,
    OperatorLeft,
    HandoffEnded,
    EvalCaseSaved,
    EvalCaseRetired,
    EvalRunRequested,
    EvalCaseResult,
    EvalRunCompleted,
]

EVENT_TYPES: dict[str, type[Envelope]] = {cls.__struct_config__.tag: cls for cls in Event.__args__}

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


class BadEvent(Exception):
    """A payload that is not a valid event. Carries why, for the dead-letter headers."""


def encode(event: Envelope) -> bytes:
    return _encoder.encode(event)


def decode(payload: bytes) -> Event:
    try:
        return _decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise BadEvent(f"invalid event: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BadEvent(f"malformed payload: {exc}") from exc


def event_type(event: Envelope) -> str:
    return event.__struct_config__.tag


def subject_mismatch(event: Envelope, subject: str) -> str | None:
    """Why `event` does not belong on `subject` (None: it does). Readers check this before
    trusting an event's site and session: see `subjects.envelope_mismatch`."""
    return subjects.envelope_mismatch(subject, event.site, event.session_id, event_type(event), event.turn)


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(cause_id: str, producer: str, key: str) -> str:
    """A stable id for the `key`-th output of `producer` handling `cause_id`.

    A redelivered input makes the same ids again, so JetStream's dedupe window drops
    the repeats: handling an event twice gives one outcome.
    """
    digest = hashlib.blake2b(f"{cause_id}|{producer}|{key}".encode(), digest_size=16)
    return digest.hexdigest()


def now() -> float:
    return time.time()


def follow(cause: Envelope, cls: type[Envelope], producer: str, key: str | None = None, *, ts: float | None = None,
           **fields: Any) -> Any:
    """Build an event caused by `cause`: same conversation and turn, a derived id, stamped
    `ts` (default: now)."""
    return cls(
        event_id=derived_id(cause.event_id, producer, key or cls.__struct_config__.tag),
        site=cause.site,
        session_id=cause.session_id,
        turn=cause.turn,
        ts=now() if ts is None else ts,
        causation_id=cause.event_id,
        producer=producer,
        **fields,
    )


def to_builtins(event: Envelope) -> dict[str, Any]:
    return msgspec.to_builtins(event)
