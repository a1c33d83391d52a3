"""follow_up_suggester and answer_suggester: clickable suggestions under a reply.

Each consumes `SuggestionsRouted` and acts on its own kind. They ask the `suggestions`
LLM role for a JSON list, with the site's guardrails (the meta-template) and the recent
exchanges within the role's budget; a failed or unusable answer gives an empty list with
the error recorded, never a failed turn. A HACK turn gets no model call at all: empty
suggestions, `skipped` saying why. When the role has no LLM endpoint, the suggestions come
from the knowledge base and the booking form instead (local_suggestions.py), `skipped`
saying so.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.responder import citations, local_suggestions, replies
from shared import events as ev
from shared import history, loader, prompts
from shared.node import Context, Node
from shared.llm import LLMClient, LLMError
from shared.site_config import SiteConfig, SiteConfigs
from shared.state import ConversationState

PROMPTS = Path(__file__).parent / "prompts"
HISTORY_MESSAGES = 6
MAX_SUGGESTIONS = 3
MAX_CHARS = 120
NO_MODEL = "no LLM endpoint for the suggestions role: from the knowledge base and the booking form"


class Suggestions(msgspec.Struct):
    suggestions: list[str]


def clean(raw: list[str]) -> list[str]:
    seen, out = set(), []
    for text in raw:
        text = " ".join(str(text).split())[:MAX_CHARS]
        if text and text.lower() not in seen:
            seen.add(text.lower())
            out.append(text)
    return out[:MAX_SUGGESTIONS]


def make_node(kind: str, llm: LLMClient, configs: SiteConfigs | None = None) -> Node:
    name = {"follow_up": "follow_up_suggester", "answers": "answer_suggester"}[kind]
    prompt = PROMPTS / f"{name}.md"

    async def handle(event: ev.SuggestionsRouted, ctx: Context) -> list[ev.Envelope]:
        if event.kind != kind:
            return []
        state = await loader.load(ctx.bus, event.site, event.session_id)
        if event.turn in history.hack_turns(state):
            return [ctx.follow(ev.SuggestionsGenerated, kind=kind, skipped="HACK turn: no model sees its text")]
        config = await configs.get(event.site) if configs else SiteConfig()
        if not llm.configured("suggestions"):
            return [ctx.follow(ev.SuggestionsGenerated, kind=kind, skipped=NO_MODEL,
                               suggestions=await _without_model(kind, event, ctx, state, config))]
        system = prompts.compose(prompt, event.site, config)
        recent = history.window(state, event.turn, llm.history_tokens("suggestions"))[-HISTORY_MESSAGES:]
        transcript = "\n".join(f"{m.role}: {m.content}" for m in recent)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": transcript}]
        try:
            got = await llm.structured("suggestions", messages, ctx.record_llm, Suggestions, temperature=0.4)
        except (LLMError, msgspec.MsgspecError) as exc:
            return [ctx.follow(ev.SuggestionsGenerated, kind=kind, error=str(exc)[:500])]
        return [ctx.follow(ev.SuggestionsGenerated, kind=kind, suggestions=clean(got.suggestions))]

    return Node(name=name, consumes=("suggestions_routed",), handle=handle)


async def _without_model(kind: str, event: ev.SuggestionsRouted, ctx: Context, state: ConversationState,
                         config: SiteConfig) -> list[str]:
    reply = next((m.content for m in reversed(state.messages) if m.role == "assistant" and m.turn == event.turn), "")
    lang = await replies.visitor_language(ctx, event, state)
    if kind == "answers":
        return local_suggestions.answer_options(state, event.turn, reply, config, lang)
    record = state.turns.get(event.turn)
    return clean(local_suggestions.follow_ups((record.sources if record else None) or [], state.messages, lang,
                                              cited=frozenset(citations.cited(reply))))
