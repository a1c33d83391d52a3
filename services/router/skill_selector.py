"""skill_selector: which response-ending skills this turn calls for.

Local backend: the selection rules of skills.select on the local intent estimate and the
local signals (computed again here: the three analysis nodes run in parallel, and the
embedding is shared in-process, so this costs well under a millisecond). LLM backend
(`ROUTER_SKILLS_BACKEND=llm`): the classifier role picks intent and skills (JSON schema,
one repair retry), the local selection when it fails.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import msgspec

from services.router import signals as sig
from shared import skills as sk
from services.router.classifiers import Intent, has_words, normalize, transcript
from services.router.interest_signals_detector import local_signals
from services.router.runtime import RouterParts, history_of
from shared import events as ev
from shared import loader, prompts
from shared.consumer import Context, Node
from shared.llm import LLMError

log = logging.getLogger(__name__)

NAME = "skill_selector"
PROMPT = Path(__file__).parent / "prompts" / "skill_selector.md"

Skill = Literal["propose_demo", "collect_email", "ask_qualifying_question", "suggest_follow_up", "share_resource", "none"]


class SkillsOutput(msgspec.Struct, kw_only=True):
    intent: Intent
    skills: list[Skill] = []


def make_node(parts: RouterParts) -> Node:
    async def handle(event: ev.TurnRequested, ctx: Context) -> list[ev.Envelope]:
        config = await parts.configs.get(event.site)
        state = await loader.load(ctx.bus, event.site, event.session_id)
        if parts.skills_backend == "llm" and parts.llm is not None and has_words(event.message):
            enabled = ", ".join(config.skills.enabled) or "none"
            system = prompts.compose(PROMPT, event.site, config, enabled=enabled)
            earlier = history_of(state, event.turn, parts.llm.history_tokens("classifier"))
            user = (f"Conversation so far:\n{transcript(earlier)}\n\n"
                    f"Interest score so far: {state.interest.score:.2f} (threshold {config.interest.threshold:.2f})\n"
                    f"Latest visitor message:\n{normalize(event.message)}")
            try:
                out = await parts.llm.structured("classifier", [{"role": "system", "content": system},
                                                                {"role": "user", "content": user}],
                                                 ctx.record_llm, SkillsOutput, temperature=0.0)
                chosen = [s for s in out.skills if s in config.skills.enabled] or [sk.NONE]
                return [ctx.follow(ev.SkillsSelected, skills=chosen, classifier="llm", intent=out.intent)]
            except (LLMError, msgspec.MsgspecError) as exc:
                log.warning("LLM skill selection failed; using the local rules", extra={"error": str(exc)[:200]})
        chosen, intent = await select_locally(parts, state, event.turn, event.message, config)
        return [ctx.follow(ev.SkillsSelected, skills=chosen, classifier="local", intent=intent)]

    return Node(name=NAME, consumes=("turn_requested",), handle=handle)


async def select_locally(parts: RouterParts, state, turn: int, message: str, config) -> tuple[list[str], str]:
    if not has_words(message):
        intent = "OFFTOPIC"
    elif parts.classifier.model is not None:
        intent = (await parts.classifier.local(message)).intent
    else:
        intent = "LEARN"
    visitor_messages = sum(1 for m in state.messages if m.role == "user" and m.turn <= turn)
    found = await local_signals(parts, message, max(visitor_messages, 1))
    previous = state.interest.score if state.interest.turn < turn else 0.0
    score = sig.cumulative(previous, sig.turn_score(parts.rules, found))
    return sk.select(intent, found, score, state, config), intent
