"""What follow_up_suggester and answer_suggester share: the `suggestions` role's call and
the cleaning of what it gives.

The role is asked for a JSON list, with the site's guardrails (the meta-template) and the
recent exchanges within the role's budget; a failed or unusable answer gives an empty list
with the error recorded, never a failed turn. A HACK turn gets no model call at all: empty
suggestions, `skipped` saying why (`HACK_TURN`). Without an endpoint for the role, each
suggester makes its own from the knowledge base or the booking form (local_suggestions.py),
`skipped` saying so (`NO_MODEL`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import msgspec

from shared import events as ev
from shared import history, prompts
from shared.llm import LLMClient, LLMError
from shared.node import Context, Inputs
from shared.site_config import SiteConfig
from shared.state import ConversationState

HISTORY_MESSAGES = 6
MAX_SUGGESTIONS = 3
MAX_CHARS = 120
HACK_TURN = "HACK turn: no model sees its text"
NO_MODEL = "no LLM endpoint for the suggestions role: from the knowledge base and the booking form"


class Suggestions(msgspec.Struct):
    suggestions: list[str]


PROMPTS = Path(__file__).parent / "prompts"


def clean(raw: list[str]) -> list[str]:
    seen, out = set(), []
    for text in raw:
        text = " ".join(str(text).split())[:MAX_CHARS]
        if text and text.lower() not in seen:
            seen.add(text.lower())
            out.append(text)
    return out[:MAX_SUGGESTIONS]


def reply_of(state: ConversationState, turn: int) -> str:
    """The assistant's reply to `turn` ("" when there is none)."""
    return next((m.content for m in reversed(state.messages) if m.role == "assistant" and m.turn == turn), "")


async def from_model(ctx: Context, llm: LLMClient, prompt: Path, kind: str, event: ev.SuggestionsRouted,
                     state: ConversationState, config: SiteConfig) -> ev.SuggestionsGenerated:
    """The `suggestions` role's suggestions for this turn, from the recent exchanges."""
    system = prompts.compose(prompt, event.site, config)
    recent = history.window(state, event.turn, llm.history_tokens("suggestions"))[-HISTORY_MESSAGES:]
    transcript = "\n".join(f"{m.role}: {m.content}" for m in recent)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": transcript}]
    try:
        got = await llm.structured("suggestions", messages, ctx.record_llm, Suggestions, temperature=0.4)
    except (LLMError, msgspec.MsgspecError) as exc:
        return ctx.follow(ev.SuggestionsGenerated, kind=kind, error=str(exc)[:500])
    return ctx.follow(ev.SuggestionsGenerated, kind=kind, suggestions=clean(got.suggestions))


async def suggested(llm: LLMClient, name: str, kind: str, event: ev.SuggestionsRouted, inputs: Inputs, ctx: Context,
                    without_model: Callable[[ConversationState, int, SiteConfig], list[str]]) -> ev.SuggestionsGenerated:
    """One kind of suggestions (a suggester node's decision): none on a HACK turn (no model
    sees its text), `without_model` when the suggestions role has no endpoint, else the
    model's, with the node's prompt (prompts/<name>.md)."""
    state = inputs.state
    if event.turn in history.hack_turns(state):
        return ctx.follow(ev.SuggestionsGenerated, kind=kind, skipped=HACK_TURN)
    if not llm.configured("suggestions"):
        return ctx.follow(ev.SuggestionsGenerated, kind=kind, skipped=NO_MODEL,
                          suggestions=without_model(state, event.turn, inputs.config))
    return await from_model(ctx, llm, PROMPTS / f"{name}.md", kind, event, state, inputs.config)
