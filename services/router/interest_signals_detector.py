"""interest_signals_detector: this turn's buying signals and the cumulative interest score."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from services.router import signals as sig
from services.router.classifiers import has_words, normalize, transcript
from services.router.runtime import RouterParts, history_of
from shared import events as ev
from shared import loader, prompts
from shared.consumer import Context, Node
from shared.llm import LLMError

log = logging.getLogger(__name__)

NAME = "interest_signals_detector"
PROMPT = Path(__file__).parent / "prompts" / "interest_signals.md"


async def local_intent_scores(parts: RouterParts, message: str) -> dict[str, float]:
    if has_words(message) and parts.classifier.model is not None:
        return (await parts.classifier.local(message)).scores
    return {}


async def local_signals(parts: RouterParts, message: str, visitor_messages: int,
                        scores: dict[str, float] | None = None) -> dict[str, bool]:
    if scores is None:
        scores = await local_intent_scores(parts, message)
    return sig.detect(parts.rules, normalize(message), visitor_messages, scores)


def make_node(parts: RouterParts) -> Node:
    async def handle(event: ev.TurnRequested, ctx: Context) -> list[ev.Envelope]:
        state = await loader.load(ctx.bus, event.site, event.session_id)
        visitor_messages = sum(1 for m in state.messages if m.role == "user" and m.turn <= event.turn)
        previous = state.interest.score if state.interest.turn < event.turn else 0.0
        classifier = "local"
        found = None
        if parts.signals_backend == "llm" and parts.llm is not None and has_words(event.message):
            config = await parts.configs.get(event.site)
            system = prompts.compose(PROMPT, event.site, config)
            earlier = history_of(state, event.turn, parts.llm.history_tokens("classifier"))
            user = (f"Conversation so far:\n{transcript(earlier)}\n\n"
                    f"Latest visitor message:\n{normalize(event.message)}")
            try:
                out = await parts.llm.structured("classifier", [{"role": "system", "content": system},
                                                                {"role": "user", "content": user}],
                                                 ctx.record_llm, sig.SignalsOutput, temperature=0.0)
                found = msgspec.structs.asdict(out)
                classifier = "llm"
            except (LLMError, msgspec.MsgspecError) as exc:
                log.warning("LLM signal detection failed; using the local rules", extra={"error": str(exc)[:200]})
        if found is None:
            found = await local_signals(parts, event.message, max(visitor_messages, 1))
        this_turn = sig.turn_score(parts.rules, found)
        return [ctx.follow(ev.InterestSignalsDetected, signals=found, turn_score=this_turn,
                           score=sig.cumulative(previous, this_turn), classifier=classifier)]

    return Node(name=NAME, consumes=("turn_requested",), handle=handle)
