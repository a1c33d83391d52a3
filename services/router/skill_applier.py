"""skill_applier: the deterministic rules that turn the selected skills into the ones the
response handler applies (demo forcing, e-mail already known, CTA timing by turn number
with the site's first turn and cooldown, current-turn signal overrides, post-conversion
qualification questions). See skills.apply."""

from __future__ import annotations

from shared import events as ev
from shared import skills as sk
from shared.node import Context, Inputs, Needs, Node

NAME = "skill_applier"


async def apply_skills(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    applied, rules, question = sk.apply_for_turn(inputs.state, event, inputs.config)
    return [ctx.follow(ev.SkillsApplied, skills=applied, rules=rules, qualification_question=question)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("route_decided",), handle=apply_skills, needs=Needs(state=True, config=True))
