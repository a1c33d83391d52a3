"""Intent classification behind one interface, three backends.

- local: `LocalIntentModel` (MiniLM embedding + character n-grams → logistic regression; a
  short message is read with the assistant's turn before it, `reply`);
- llm: the `classifier` LLM role answers a JSON schema (msgspec decode, one repair retry);
- cascade: local first, the LLM only when the local confidence is below the threshold, or
  when the local answer is a HACK below the strike confidence (a strike must be near-certain).

`ROUTER_CLASSIFIER` picks the deployment's backend (default `local`); a site may override
it in its config. Every result names the backend that decided. A message with no words
(empty, whitespace, emoji or punctuation only) is classified by rule, without a model, and
says so in `note`. A message with a decisive prompt-injection marker (injection.py) is HACK
by rule, confidence 1.0, before any model or LLM reads it; `markers` names the markers and
corroborating cues found (a cue makes the model's HACK a strike, routing.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Awaitable, Callable, Literal

import msgspec

from services.router import routing
from services.router.injection import InjectionMarkers
from services.router.local_model import INTENTS, LocalIntentModel, replied_to
from services.router.settings import RouterSettings
from shared import prompts
from shared.embeddings import Embedder
from shared.llm import LLMClient, LLMError
from shared.site_config import SiteConfig

log = logging.getLogger(__name__)

PROMPTS = Path(__file__).parent / "prompts"
MAX_CHARS = 2000  # longer messages are classified on their beginning
WORD_RE = re.compile(r"\w", re.UNICODE)
HISTORY_TURNS = 4
RECENT = 2048  # local results kept per process

Intent = Literal["LEARN", "CONTEXT", "SUPPORT", "OFFTOPIC", "OTHER", "BOOKING", "STOP_BOOKING", "HACK"]
Recorder = Callable[[object], Awaitable[None]]


class IntentOutput(msgspec.Struct, kw_only=True):
    intent: Intent
    confidence: float = 0.5


class IntentResult(msgspec.Struct, kw_only=True):
    intent: str
    confidence: float
    classifier: str
    scores: dict[str, float] = {}
    note: str = ""
    latency_ms: float = 0.0
    llm_calls: int = 0
    markers: list[str] = []  # injection markers (then HACK by rule) and corroborating cues found
    runner_up: str = ""  # for a HACK or OFFTOPIC: the most likely other intent (local scores), what an unsure one is routed as


def normalize(message: str) -> str:
    return " ".join(message.split())[:MAX_CHARS]


def has_words(message: str) -> bool:
    return bool(WORD_RE.search(message))


def transcript(history: list[dict], limit: int = HISTORY_TURNS * 2) -> str:
    lines = [f"{m.get('role', 'user')}: {str(m.get('content', ''))[:500]}" for m in history[-limit:]]
    return "\n".join(lines) if lines else "(no earlier messages)"


async def _no_record(call) -> None:
    return None


class IntentClassifier:
    """`backend` (ROUTER_CLASSIFIER), `threshold` (ROUTER_CASCADE_THRESHOLD), `strike_confidence`
    (ROUTER_HACK_STRIKE_CONFIDENCE) and `fast_path` (ROUTER_FAST_PATH_CONFIDENCE) come from the
    router's settings (runtime.py); the defaults are theirs."""

    def __init__(self, model: LocalIntentModel | None, llm: LLMClient | None, backend: str = "local",
                 threshold: float = 0.5, strike_confidence: float = routing.STRIKE_CONFIDENCE,
                 fast_path: float = 0.6):
        self.model = model
        self.llm = llm
        self.backend = backend
        if self.backend not in ("local", "llm", "cascade"):
            raise ValueError(f"ROUTER_CLASSIFIER={self.backend!r}: must be local, llm or cascade")
        self.threshold = threshold
        # A HACK strikes (two block the session for good) only at or above this confidence.
        self.strike_confidence = strike_confidence
        self.markers = InjectionMarkers.load()
        self._recent: dict[tuple[str, str], IntentResult] = {}
        self._pending: dict[tuple[str, str], asyncio.Future] = {}
        # The n-gram-only stage decides alone at or above this confidence (1.01: never).
        self.fast_path = fast_path

    @classmethod
    def configured(cls, model: LocalIntentModel | None, llm: LLMClient | None, settings: RouterSettings,
                   backend: str | None = None) -> "IntentClassifier":
        """The classifier as the router's settings make it (`backend`: another one, for evaluations)."""
        return cls(model, llm, backend=backend or settings.classifier, threshold=settings.cascade_threshold,
                   strike_confidence=settings.strike_confidence, fast_path=settings.fast_path_confidence)

    @property
    def embedder(self) -> Embedder | None:
        return self.model.embedder if self.model else None

    async def local(self, message: str, reply: str = "") -> IntentResult:
        """The local model's answer; `reply`: the assistant's message before this one (a short
        message is read with it). The three analysis nodes ask for the same message, so
        recent answers are kept (a copy is returned: callers annotate their result)."""
        text = normalize(message)
        key = (replied_to(text, reply), text)
        cached = self._recent.get(key)
        if cached is None:
            pending = self._pending.get(key)
            if pending is None:
                pending = asyncio.ensure_future(self._local_uncached(*key))
                self._pending[key] = pending
                pending.add_done_callback(lambda _f, k=key: self._pending.pop(k, None))
            cached = await asyncio.shield(pending)
        return msgspec.structs.replace(cached, scores=dict(cached.scores))

    async def _local_uncached(self, context: str, text: str) -> IntentResult:
        """`context`: what of the assistant's turn the model reads with `text` ("" for none)."""
        ngrams = self.model.ngrams(text)
        scores, note = {}, ""
        if not context:  # the n-gram stage reads the message alone: not for a message read with a turn
            scores = self.model.fast_probabilities(ngrams)
            note = "n-gram fast path"
        # A HACK is never decided by the n-grams alone: its strike can block the visitor, so
        # the full model (what the message means, not only how it is spelt) reads it.
        if not scores or max(scores.values()) < self.fast_path or max(scores, key=scores.get) == "HACK":
            vector = await self.model.embedder.aembed(text)
            reply_vector = await self.model.embedder.aembed(context) if context else None
            scores = self.model.probabilities(text, vector, ngrams, reply_vector)
            note = "read with the assistant's turn before it" if context else ""
        best = max(scores, key=scores.get)
        result = IntentResult(intent=best, confidence=round(scores[best], 4), classifier="local",
                              scores={k: round(v, 4) for k, v in scores.items()}, note=note,
                              runner_up=runner_up_intent(best, scores))
        self._recent[(context, text)] = result
        if len(self._recent) > RECENT:
            self._recent.pop(next(iter(self._recent)))
        return result

    async def with_llm(self, site: str, config: SiteConfig, message: str, history: list[dict],
                       record: Recorder) -> IntentResult:
        system = prompts.compose(PROMPTS / "intent_classifier.md", site, config)
        user = f"Conversation so far:\n{transcript(history)}\n\nLatest visitor message:\n{normalize(message)}"
        out = await self.llm.structured("classifier", [{"role": "system", "content": system},
                                                       {"role": "user", "content": user}], record, IntentOutput,
                                        temperature=0.0)
        return IntentResult(intent=out.intent, confidence=round(min(max(out.confidence, 0.0), 1.0), 4), classifier="llm")

    async def classify(self, site: str, config: SiteConfig, message: str,
                       history: list[dict] | Callable[[], Awaitable[list[dict]]] | None = None,
                       record: Recorder = _no_record, reply: str = "") -> IntentResult:
        """`history` may be a coroutine function: then it is only called when the LLM is.
        `reply`: the assistant's message before this one, which the local model reads with a
        short message."""
        started = time.perf_counter()
        result = await self._classify(site, config, message, history, record, reply)
        result.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        return result

    async def _classify(self, site, config, message, history, record, reply) -> IntentResult:
        if not has_words(message):
            note = "empty message" if not message.strip() else "no words (emoji or punctuation only)"
            return IntentResult(intent="OFFTOPIC", confidence=1.0, classifier="rule", note=note)
        markers = self.markers.find(message[:MAX_CHARS])  # not normalized: "i g n o r e   a l l" keeps its word gaps
        if self.markers.decisive & set(markers):
            return IntentResult(intent="HACK", confidence=1.0, classifier="rule", markers=markers,
                                note="prompt-injection markers: " + ", ".join(markers))
        result = await self._by_model(site, config, message, history, record, reply, corroborated=bool(markers))
        result.markers = markers
        return result

    async def _by_model(self, site, config, message, history, record, reply, corroborated: bool) -> IntentResult:
        backend = config.classifier.backend or self.backend
        threshold = config.classifier.cascade_threshold or self.threshold
        if backend == "llm" or self.model is None:
            return await self._llm_or(None, site, config, message, history, record, reply)
        local = await self.local(message, reply)
        # A HACK that would not strike (routing.py: unsure and no cue) is worth the LLM's opinion.
        unsure_hack = local.intent == "HACK" and local.confidence < self.strike_confidence and not corroborated
        if backend == "cascade" and (local.confidence < threshold or unsure_hack):
            return await self._llm_or(local, site, config, message, history, record, reply)
        return local

    async def _llm_or(self, fallback: IntentResult | None, site, config, message, history, record,
                      reply: str = "") -> IntentResult:
        calls = 0

        async def counting(call):
            nonlocal calls
            calls += 1
            await record(call)

        if self.llm is None:
            if fallback is not None:
                fallback.note = "no LLM configured: the local result stands"
                return fallback
            raise LLMError("the llm intent backend needs an LLM endpoint (LLM_BASE_URL)")
        try:
            if callable(history):
                history = await history()
            result = await self.with_llm(site, config, message, history or [], counting)
            if fallback is not None:
                result.scores = fallback.scores
                result.runner_up = runner_up_intent(result.intent, fallback.scores)
                below = ("HACK strike confidence" if fallback.intent == "HACK"
                         and fallback.confidence < self.strike_confidence else "threshold")
                result.note = f"local {fallback.intent} {fallback.confidence} < {below}"
            result.llm_calls = calls
            return result
        except (LLMError, msgspec.MsgspecError) as exc:
            if fallback is None and self.model is not None:
                fallback = await self.local(message, reply)
            if fallback is None:
                raise
            fallback.note = f"LLM failed ({type(exc).__name__}): the local result stands"
            fallback.llm_calls = calls
            log.warning("LLM intent classification failed; using the local model", extra={"error": str(exc)[:200]})
            return fallback


def runner_up_intent(intent: str, scores: dict[str, float]) -> str:
    """For a HACK or an OFFTOPIC, the most likely other intent (never HACK): where routing
    sends one too unsure to strike or to refuse."""
    others = {k: v for k, v in scores.items() if k not in ("HACK", intent)}
    return max(others, key=others.get) if intent in ("HACK", "OFFTOPIC") and others else ""


def known_intent(intent: str) -> bool:
    return intent in INTENTS
