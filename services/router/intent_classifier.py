"""intent_classifier: one of eight intents for the visitor's message (see classifiers.py)."""

from __future__ import annotations

from services.router.runtime import RouterParts, history_of
from shared import events as ev
from shared import loader
from shared.consumer import Context, Node

NAME = "intent_classifier"


def make_node(parts: RouterParts) -> Node:
    async def handle(event: ev.TurnRequested, ctx: Context) -> list[ev.Envelope]:
        config = await parts.configs.get(event.site)

        async def history():
            state = await loader.load(ctx.bus, event.site, event.session_id)
            return history_of(state, event.turn, parts.classifier.llm.history_tokens("classifier"))

        result = await parts.classifier.classify(event.site, config, event.message, history, ctx.record_llm)
        return [ctx.follow(ev.IntentClassified, intent=result.intent, confidence=result.confidence,
                           classifier=result.classifier, scores=result.scores, latency_ms=result.latency_ms,
                           note=result.note, markers=result.markers, runner_up=result.runner_up)]

    return Node(name=NAME, consumes=("turn_requested",), handle=handle)
