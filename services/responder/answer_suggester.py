"""answer_suggester: answers the visitor may click, under a reply that ended with a
question (`SuggestionsRouted(kind="answers")`) → `SuggestionsGenerated`.

From the `suggestions` role (suggestions.py); without an endpoint for it, the booking
field's choices when the booking flow asked for one, yes and no after a yes/no question,
else none (local_suggestions.answer_options). A HACK turn gets none.
"""

from __future__ import annotations

from services.responder import local_suggestions, replies, suggestions
from shared.llm import LLMClient
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node
from shared.site_config import SiteConfig
from shared.state import ConversationState

NAME = "answer_suggester"
KIND = "answers"


def without_model(state: ConversationState, turn: int, config: SiteConfig) -> list[str]:
    return local_suggestions.answer_options(state, turn, suggestions.reply_of(state, turn), config,
                                            replies.visitor_language(state, turn))


def make_node(llm: LLMClient) -> Node:
    async def suggest(event: ev.SuggestionsRouted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        return [await suggestions.suggested(llm, NAME, KIND, event, inputs, ctx, without_model)]

    return Node(name=NAME, consumes=("suggestions_routed",), handle=suggest,
                needs=Needs(state=True, config=True, when=lambda event: event.kind == KIND))
