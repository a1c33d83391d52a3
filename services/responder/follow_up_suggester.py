"""follow_up_suggester: questions the visitor may click next, under a reply that asked
them nothing (`SuggestionsRouted(kind="follow_up")`) → `SuggestionsGenerated`.

From the `suggestions` role (suggestions.py); without an endpoint for it, from this turn's
retrieved knowledge base: the sections the conversation has not covered, less those the
answer cited (local_suggestions.follow_ups). A HACK turn gets none.
"""

from __future__ import annotations

from services.responder import local_suggestions, replies, suggestions
from shared import citations
from shared.llm import LLMClient
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node
from shared.site_config import SiteConfig
from shared.state import ConversationState

NAME = "follow_up_suggester"
KIND = "follow_up"


def without_model(state: ConversationState, turn: int, config: SiteConfig) -> list[str]:
    record = state.turns.get(turn)
    cited = frozenset(citations.cited(suggestions.reply_of(state, turn)))
    return suggestions.clean(local_suggestions.follow_ups((record.sources if record else None) or [], state.messages,
                                                          replies.visitor_language(state, turn), cited=cited))


def make_node(llm: LLMClient) -> Node:
    async def suggest(event: ev.SuggestionsRouted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        return [await suggestions.suggested(llm, NAME, KIND, event, inputs, ctx, without_model)]

    return Node(name=NAME, consumes=("suggestions_routed",), handle=suggest,
                needs=Needs(state=True, config=True, when=lambda event: event.kind == KIND))
