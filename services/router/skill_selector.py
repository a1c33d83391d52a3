"""skill_selector: which response-ending skills this turn calls for, by the LLM
(`ROUTER_SKILLS_BACKEND=llm`; with the default local backend there is no such node: the
intent router selects by skills.select where it joins the turn's analyses).

On the `TurnRequested`, in parallel with the other two analyses, the classifier role picks
intent and skills (JSON schema, one repair retry); the intent router joins its
`SkillsSelected` with them. When the model's answer is unusable, the local model's intent and
signals for the message decide by the local rules (the one case where the node estimates
them itself: it does not wait for the analyses it races).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from services.router import signals as sig
from services.router.classifiers import Intent, has_words
from services.router.runtime import RouterParts
from shared import events as ev
from shared import history
from shared import skills as sk
from shared.node import Context, Inputs, Needs, Node
from shared.site_config import SiteConfig
from shared.state import ConversationState

NAME = "skill_selector"
PROMPT = Path(__file__).parent / "prompts" / "skill_selector.md"

Skill = Literal["propose_demo", "collect_email", "ask_qualifying_question", "suggest_follow_up", "share_resource", "none"]


class SkillsOutput(msgspec.Struct, kw_only=True):
    intent: Intent
    skills: list[Skill] = []


def make_node(parts: RouterParts) -> Node:
    async def select(event: ev.TurnRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config = inputs.state, inputs.config
        score = f"Interest score so far: {state.interest.score:.2f} (threshold {config.interest.threshold:.2f})\n"
        out = await parts.ask_llm(parts.skills_backend, PROMPT, event.site, config, state, event.turn, event.message,
                                  SkillsOutput, ctx.record_llm, context=score,
                                  enabled=", ".join(config.skills.enabled) or "none")
        if out is not None:
            chosen = [s for s in out.skills if s in config.skills.enabled] or [sk.NONE]
            return [ctx.follow(ev.SkillsSelected, skills=chosen, classifier="llm", intent=out.intent)]
        chosen, intent = await select_locally(parts, state, event.turn, event.message, config)
        return [ctx.follow(ev.SkillsSelected, skills=chosen, classifier="local", intent=intent)]

    return Node(name=NAME, consumes=("turn_requested",), handle=select, needs=Needs(state=True, config=True))


async def select_locally(parts: RouterParts, state: ConversationState, turn: int, message: str,
                         config: SiteConfig) -> tuple[list[str], str]:
    reply = history.reply_before(state, turn)
    if not has_words(message):
        intent = "OFFTOPIC"
    elif parts.classifier.model is not None:
        intent = (await parts.classifier.local(message, reply)).intent
    else:
        intent = "LEARN"
    found = await parts.local_signals(message, history.visitor_turns(state, turn), reply)
    previous = state.interest.score if state.interest.turn < turn else 0.0
    score = sig.cumulative(previous, sig.turn_score(parts.rules, found))
    return sk.select(intent, found, score, state, config), intent
