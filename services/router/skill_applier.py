"""skill_applier: the deterministic rules that turn the selected skills into the ones the
response handler applies (demo forcing, e-mail already known, CTA timing by turn number
with the site's first turn and cooldown, current-turn signal overrides, post-conversion
qualification questions). See skills.apply."""

from __future__ import annotations

from shared import skills as sk
from services.router.runtime import RouterParts
from shared import events as ev
from shared import loader
from shared.consumer import Context, Node

NAME = "skill_applier"


def make_node(parts: RouterParts) -> Node:
    async def handle(event: ev.RouteDecided, ctx: Context) -> list[ev.Envelope]:
        state = await loader.load(ctx.bus, event.site, event.session_id)
        config = await parts.configs.get(event.site)
        applied, rules, question = sk.apply_for_turn(state, event, config)
        return [ctx.follow(ev.SkillsApplied, skills=applied, rules=rules, qualification_question=question)]

    return Node(name=NAME, consumes=("route_decided",), handle=handle)
