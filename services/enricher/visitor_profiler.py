"""visitor_profiler: what the visitor is trying to do, from the conversation so far.

Infers `job_to_be_done` and `feature_list`, and `sector` / `sub_sector`, which count only
where enrichment says nothing of the company's (the fold decides, whichever is stored
first). The local method matches the keyword rules in `data/profiler_rules.toml`
(inference.py: no network, no model) and reads only the visitor's messages, so it runs on
the turn's request, beside enrichment: the answer's profile budget is not spent waiting for
one after the other. `PROFILER_BACKEND=llm` asks the `profiler` LLM role for structured
JSON instead, with one repair retry, and falls back to the local method if that fails; its
prompt holds the known profile, so it runs after this turn's enrichment.

The LLM gets the site's guardrails (the meta-template) and the conversation within the
role's budget, HACK turns' text withheld. This node runs beside the router, so it first
waits (up to `PROFILER_ROUTE_WAIT_S`) for this turn's route: a turn not routed by then is
not known to be safe, and its message is withheld too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from services.enricher.inference import Inferred, apply_inference, infer_locally, load_rules
from shared import history, prompts
from shared import events as ev
from shared.llm import LLMClient, LLMError, role_records
from shared.node import Context, Inputs, Needs, Node, Wait
from shared.state import ConversationState

log = logging.getLogger(__name__)

NAME = "visitor_profiler"
PROMPT = Path(__file__).parent / "prompts" / "profiler_system.md"


def withheld_turns(state: ConversationState, turn: int) -> set[int]:
    """The turns whose visitor text the LLM may not see: HACK turns, and this turn when it
    is not routed yet."""
    record = state.turns.get(turn)
    unrouted = {turn} if record is None or record.route is None else set()
    return history.hack_turns(state) | unrouted


async def infer_with_llm(llm: LLMClient, ctx: Context, state: ConversationState, turn: int, system: str) -> Inferred:
    shown = history.window(state, turn, llm.history_tokens("profiler"), withheld_turns(state, turn))
    transcript = "\n".join(f"{m.role}: {m.content}" for m in shown)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Known profile: {msgspec.json.encode(state.visitor_profile).decode()}\n\n"
                                    f"Conversation:\n{transcript}"},
    ]
    return await llm.structured("profiler", messages, ctx.record_llm, Inferred, temperature=0)


def make_node(llm: LLMClient | None = None, rules: dict | None = None, route_wait_s: float = 2.0) -> Node:
    """With an LLM, the node waits for this turn's route (at most `route_wait_s`,
    PROFILER_ROUTE_WAIT_S) and needs the site's config for the prompt; the local rules need
    the state only."""
    rules = rules or load_rules()

    async def profile(event: ev.TurnRequested | ev.EnrichmentCompleted, inputs: Inputs,
                      ctx: Context) -> list[ev.Envelope]:
        state = inputs.state
        method = "local"
        inferred = None
        if llm is not None:
            try:
                inferred = await infer_with_llm(llm, ctx, state, event.turn,
                                                prompts.compose(PROMPT, event.site, inputs.config))
                method = "llm"
            except (LLMError, msgspec.MsgspecError) as exc:
                log.warning("LLM profiling failed; local method used", extra={"error": str(exc)})
        if inferred is None:
            inferred = infer_locally([m.content for m in state.messages if m.role == "user"], rules)
        return [ctx.follow(ev.ProfileInferred, profile=apply_inference(state.visitor_profile, inferred),
                           method=method, llm_roles=roles)]

    roles = role_records(llm, ("profiler",))  # what a replay re-runs it with

    needs = (Needs(state=True) if llm is None
             else Needs(config=True, waits=(Wait(("route_decided",), route_wait_s),)))
    consumes = ("turn_requested",) if llm is None else ("enrichment_completed",)
    return Node(name=NAME, consumes=consumes, handle=profile, needs=needs)
