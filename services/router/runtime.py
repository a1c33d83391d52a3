"""What the router's nodes share in one process: the site configs, the intent classifier
(one embedding model, one trained model), the signal rules and the LLM client."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from services.router.classifiers import IntentClassifier
from services.router.local_model import LocalIntentModel
from services.router.signals import SignalRules
from shared import history
from shared.bus import Bus
from shared.config import env_str
from shared.embeddings import shared_embedder
from shared.llm import LLMClient
from shared.site_config import SiteConfigs
from shared.state import ConversationState

log = logging.getLogger(__name__)


@dataclass
class RouterParts:
    configs: SiteConfigs
    classifier: IntentClassifier
    rules: SignalRules
    llm: LLMClient | None
    signals_backend: str = "local"
    skills_backend: str = "local"

    @classmethod
    def build(cls, bus: Bus, llm: LLMClient | None = None) -> "RouterParts":
        started = time.monotonic()
        embedder = shared_embedder().load()
        model = LocalIntentModel.load_or_train(embedder)
        embedder.embed(["warm-up"])  # first inference allocates; keep it off the first turn
        parts = cls(
            configs=SiteConfigs(bus),
            classifier=IntentClassifier(model, llm),
            rules=SignalRules.load(),
            llm=llm,
            signals_backend=_backend("ROUTER_SIGNALS_BACKEND"),
            skills_backend=_backend("ROUTER_SKILLS_BACKEND"),
        )
        log.info("router ready", extra={"classifier": parts.classifier.backend, "seconds": round(time.monotonic() - started, 2)})
        return parts


def _backend(name: str) -> str:
    value = env_str(name, "local")
    if value not in ("local", "llm"):
        raise ValueError(f"{name}={value!r}: must be local or llm")
    return value


def history_of(state: ConversationState, turn: int, budget_tokens: int) -> list[dict]:
    """The turns before `turn` for an LLM prompt: HACK text withheld, within the budget
    (which the current message counts against; it goes into the prompt on its own)."""
    return [{"role": m.role, "content": m.content} for m in history.window(state, turn, budget_tokens) if m.turn < turn]


def visitor_message(state: ConversationState, turn: int) -> str:
    for m in reversed(state.messages):
        if m.turn == turn and m.role == "user":
            return m.content
    return ""
