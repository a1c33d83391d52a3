"""What the router's nodes share in one process: the intent classifier (one embedding
model, one trained model), the signal rules, the LLM client, and the two ways a node asks
about a message: the local rules, or the classifier role's LLM with the local rules as
fallback."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from services.router.classifiers import IntentClassifier
from services.router.local_model import LocalIntentModel
from services.router.signals import SignalRules
from services.router import signals as sig
from services.router.classifiers import has_words, normalize, transcript
from services.router.settings import RouterSettings
from shared import history, prompts
from shared.embeddings import shared_embedder
from shared.llm import LLMClient, LLMError, Recorder
from shared.site_config import SiteConfig
from shared.state import ConversationState

log = logging.getLogger(__name__)


@dataclass
class RouterParts:
    classifier: IntentClassifier
    rules: SignalRules
    llm: LLMClient | None
    signals_backend: str = "local"
    skills_backend: str = "local"

    @classmethod
    def build(cls, llm: LLMClient | None, settings: RouterSettings) -> "RouterParts":
        started = time.monotonic()
        embedder = shared_embedder(settings.embeddings).load()
        model = LocalIntentModel.load_or_train(embedder)
        embedder.embed(["warm-up"])  # first inference allocates; keep it off the first turn
        parts = cls(
            classifier=IntentClassifier.configured(model, llm, settings),
            rules=SignalRules.load(),
            llm=llm,
            signals_backend=settings.signals_backend,
            skills_backend=settings.skills_backend,
        )
        log.info("router ready", extra={"classifier": parts.classifier.backend, "seconds": round(time.monotonic() - started, 2)})
        return parts


    async def local_intent_scores(self, message: str, reply: str = "") -> dict[str, float]:
        if has_words(message) and self.classifier.model is not None:
            return (await self.classifier.local(message, reply)).scores
        return {}

    async def local_signals(self, message: str, visitor_turns: int, reply: str = "") -> dict[str, bool]:
        """This message's buying signals by the local rules (`visitor_turns` counts it;
        `reply`: the assistant's message before it, which the local intent model reads with a
        short message)."""
        return sig.detect(self.rules, normalize(message), visitor_turns, await self.local_intent_scores(message, reply))

    async def ask_llm(self, backend: str, prompt: Path, site: str, config: SiteConfig, state: ConversationState,
                      turn: int, message: str, output: type, record: Recorder, context: str = "",
                      **prompt_fields: str):
        """The classifier role's structured answer about `message` (`output`), when the
        node's backend is `llm` and there is something to ask about; None otherwise, or when
        the call fails (logged): the node then uses its local rules."""
        if backend != "llm" or self.llm is None or not has_words(message):
            return None
        system = prompts.compose(prompt, site, config, **prompt_fields)
        earlier = history.before(state, turn, self.llm.history_tokens("classifier"))
        user = (f"Conversation so far:\n{transcript(earlier)}\n\n{context}"
                f"Latest visitor message:\n{normalize(message)}")
        try:
            return await self.llm.structured("classifier", [{"role": "system", "content": system},
                                                            {"role": "user", "content": user}],
                                             record, output, temperature=0.0)
        except (LLMError, msgspec.MsgspecError) as exc:
            log.warning("LLM answer unusable; using the local rules",
                        extra={"prompt": prompt.name, "error": str(exc)[:200]})
            return None

