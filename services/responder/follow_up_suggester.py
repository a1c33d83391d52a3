"""follow_up_suggester: questions the visitor may click next, under a reply that asked
them nothing (`SuggestionsRouted(kind="follow_up")`) → `SuggestionsGenerated`.

From the `suggestions` role (suggestions.py); without an endpoint for it, from this turn's
retrieved knowledge base: the sections the conversation has not covered, less those the
answer cited (local_suggestions.follow_ups). A HACK turn gets none.
"""

from __future__ import annotations

from pathlib import Path

from services.responder import citations, local_suggestions, replies, suggestions
from shared import events as ev
from shared import history
from shared.llm import LLMClient
from shared.node import Context, Inputs, Needs, Node
from shared.state import ConversationState

NAME = "follow_up_suggester"
KIND = "follow_up"
PROMPT = Path(__file__).parent / "prompts" / f"{NAME}.md"


def without_model(state: ConversationState, turn: int) -> list[str]:
    record = state.turns.get(turn)
    cited = frozenset(citations.cited(suggestions.reply_of(state, turn)))
    return suggestions.clean(local_suggestions.follow_ups((record.sources if record else None) or [], state.messages,
                                                          replies.visitor_language(state, turn), cited=cited))


def make_node(llm: LLMClient) -> Node:
    async def suggest(event: ev.SuggestionsRouted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state = inputs.state
        if event.turn in history.hack_turns(state):
            return [ctx.follow(ev.SuggestionsGenerated, kind=KIND, skipped=suggestions.HACK_TURN)]
        if not llm.configured("suggestions"):
            return [ctx.follow(ev.SuggestionsGenerated, kind=KIND, skipped=suggestions.NO_MODEL,
                               suggestions=without_model(state, event.turn))]
        return [await suggestions.from_model(ctx, llm, PROMPT, KIND, event, state, inputs.config)]

    return Node(name=NAME, consumes=("suggestions_routed",), handle=suggest,
                needs=Needs(state=True, config=True, when=lambda event: event.kind == KIND))
