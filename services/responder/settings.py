"""The responder's settings, read once at start (main.py) and handed to its nodes."""

from __future__ import annotations

import msgspec

from shared.config import LLMRoleConfig, Settings, env_choice, env_float, env_int, env_str
from shared.embeddings import EmbeddingSettings
from shared.web import Outbound
from shared.webhook_secret import WebhookSecrets

ROLES = ("answer", "redirect", "suggestions")
ANSWER_BACKENDS = ("llm", "extractive")


class AnswerSettings(Settings):
    """answer_writer's (ANSWER_*)."""

    # How long an answer waits, after its route, for the visitor's enrichment and profile,
    # for sites that set no `enrichment.budget_ms`: enrichment and the local profiler start
    # with the turn, so a cached or quick profile is usually in before retrieval is. Late
    # inputs are named in ResponseCompleted either way.
    wait_s: float = 0.15
    # Retrieval has its own deadline: an answer without the knowledge base is a poor answer,
    # so it is worth waiting for (a search is quick next to an answer), but never for ever.
    retrieval_wait_s: float = 2.0
    max_sources: int = 10  # the first N retrieved documents go into the prompt
    # Empty: `llm` when the answer role has an endpoint (LLM_BASE_URL / LLM_ANSWER_BASE_URL),
    # else `extractive`.
    backend: str = ""
    # Extractive answers: the similarity to the question under which a sentence does not
    # answer it (none above: "not found"), and how many sentences an answer holds at most.
    extractive_threshold: float = 0.35
    extractive_max_sentences: int = 5
    # Sentences are read from the first N sources only: the retriever ranks them and the
    # right section is near the top (an entity's description, after the chunks, often holds
    # the one sentence that answers); their vectors come ready from the `kb_vectors` bucket
    # (kb_vectors.py), one missing there costs an embedding before the first token.
    extractive_documents: int = 10

    @classmethod
    def from_env(cls) -> "AnswerSettings":
        d = cls()
        return cls(
            wait_s=env_float("ANSWER_WAIT_S", d.wait_s),
            retrieval_wait_s=env_float("ANSWER_RETRIEVAL_WAIT_S", d.retrieval_wait_s),
            max_sources=env_int("ANSWER_MAX_SOURCES", d.max_sources),
            backend=env_choice("ANSWER_BACKEND", d.backend, ("", *ANSWER_BACKENDS), "use llm or extractive"),
            extractive_threshold=env_float("ANSWER_EXTRACTIVE_THRESHOLD", d.extractive_threshold),
            extractive_max_sentences=env_int("ANSWER_EXTRACTIVE_MAX_SENTENCES", d.extractive_max_sentences),
            extractive_documents=env_int("ANSWER_EXTRACTIVE_DOCUMENTS", d.extractive_documents),
        )


class LeadSettings(Settings):
    """lead_notifier's and handoff_notifier's: where webhooks go when a site names none
    (`webhook_url`: a site's `lead.webhook_url`, and for handoffs first its
    `handoff.webhook_url`, win over it), how hard to try, the signing secrets, and the
    analytics API."""

    SECRETS = ("posthog_api_key",)

    webhook_url: str = ""
    attempts: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 5.0
    secrets: WebhookSecrets = msgspec.field(default_factory=WebhookSecrets)
    outbound: Outbound = msgspec.field(default_factory=Outbound)  # which non-public addresses (shared/web.py)
    posthog_host: str = ""
    posthog_api_key: str = ""

    @classmethod
    def from_env(cls) -> "LeadSettings":
        d = cls()
        return cls(
            webhook_url=env_str("LEAD_WEBHOOK_URL", d.webhook_url),
            attempts=env_int("LEAD_WEBHOOK_ATTEMPTS", d.attempts),
            backoff_s=env_float("LEAD_WEBHOOK_BACKOFF_S", d.backoff_s),
            timeout_s=env_float("LEAD_WEBHOOK_TIMEOUT_S", d.timeout_s),
            secrets=WebhookSecrets.from_env(),
            outbound=Outbound.from_env(),
            posthog_host=env_str("POSTHOG_HOST", d.posthog_host),
            posthog_api_key=env_str("POSTHOG_API_KEY", d.posthog_api_key),
        )


class ResponderSettings(Settings):
    llm: dict[str, LLMRoleConfig] = {}  # the `answer`, `redirect` and `suggestions` roles
    embeddings: EmbeddingSettings = msgspec.field(default_factory=EmbeddingSettings)  # extractive answers
    answer: AnswerSettings = msgspec.field(default_factory=AnswerSettings)
    lead: LeadSettings = msgspec.field(default_factory=LeadSettings)
    finalize_wait_s: float = 0.5  # for each of the turn's dialog state, form fields and enrichment
    # A model's deltas sent within this long of the last token event go out as one
    # (streaming.TokenBatcher; the first at once); 0: one event per delta. 0.1 s: ten
    # updates a second, and half the token events (each a publish, a store, the gateway's
    # decode and an SSE frame) of 0.05 s, so less CPU per ANSWER turn (docs/benchmarks-history.md).
    token_batch_s: float = 0.1

    @classmethod
    def from_env(cls) -> "ResponderSettings":
        d = cls()
        return cls(
            llm={role: LLMRoleConfig.from_env(role) for role in ROLES},
            embeddings=EmbeddingSettings.from_env(),
            answer=AnswerSettings.from_env(),
            lead=LeadSettings.from_env(),
            finalize_wait_s=env_float("FINALIZE_WAIT_S", d.finalize_wait_s),
            token_batch_s=env_float("TOKEN_BATCH_S", d.token_batch_s),
        )
