"""intent_classifier: one of eight intents for the visitor's message (see classifiers.py)."""

from __future__ import annotations

from services.router.runtime import RouterParts
from shared import events as ev
from shared import history
from shared.llm import role_records
from shared.node import Context, Inputs, Needs, Node

NAME = "intent_classifier"


def make_node(parts: RouterParts) -> Node:
    async def classify(event: ev.TurnRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        async def earlier():  # only the LLM backend reads the conversation so far
            return history.before(inputs.state, event.turn, parts.classifier.llm.history_tokens("classifier"))

        result = await parts.classifier.classify(event.site, inputs.config, event.message, earlier, ctx.record_llm,
                                                 reply=history.reply_before(inputs.state, event.turn))
        return [ctx.follow(ev.IntentClassified, intent=result.intent, confidence=result.confidence,
                           classifier=result.classifier, scores=result.scores, latency_ms=result.latency_ms,
                           note=result.note, markers=result.markers, runner_up=result.runner_up, **versions,
                           llm_roles=roles)]

    model = parts.classifier.model
    versions = {"classifier_version": model.version, "embedding_version": model.embedder.version} if model else {}
    roles = role_records(parts.classifier.llm, ("classifier",))  # what a replay re-runs it with

    # The state: the local model reads a short message with the assistant's turn before it.
    needs = Needs(state=True, config=True)
    return Node(name=NAME, consumes=("turn_requested",), handle=classify, needs=needs)
