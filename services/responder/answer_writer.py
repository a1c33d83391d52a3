"""answer_writer: streams the answer to an ANSWER turn.

History comes from the conversation log, so turn N sees every earlier exchange. Before
answering it can wait, up to `ANSWER_WAIT_S`, for the turn's background results (the
visitor's enrichment and profile); what is not there is left out of the prompt and named in
`ResponseCompleted.late_inputs`, it never blocks the answer. Tokens go to
`tokens.<site>.<session>.<turn>` as they arrive; the full text is stored once, as
`ResponseCompleted`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from shared import awaiter
from shared import events as ev
from shared.config import env_float
from shared.consumer import Context, Node
from shared.llm import LLMClient
from shared.state import ConversationState

NAME = "answer_writer"
PROMPT = Path(__file__).parent / "prompts" / "answer_system.md"
# Off by default: waiting for the profile (two hops after the turn starts) costs ~8-10 ms of
# time to first token at p50 under `make bench`; a deployment that wants the profile in every
# first answer sets it (e.g. 0.3). Late inputs are named in ResponseCompleted either way.
WAIT_S = env_float("ANSWER_WAIT_S", 0.0)
AWAITED = ("enrichment_completed", "profile_inferred")
PROFILE_FIELDS = ("company_name", "company_description", "sector", "sub_sector", "job_to_be_done", "feature_list")


def visitor_context(state: ConversationState) -> str:
    """What we know about the visitor, for the system prompt; empty when nothing is known."""
    profile = msgspec.structs.asdict(state.visitor_profile)
    known = {k: profile[k] for k in PROFILE_FIELDS if profile[k] not in ("", ev.UNKNOWN)}
    if not known:
        return ""
    lines = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in known.items())
    return f"\n\nWhat we know about the visitor (use it to make the answer relevant; do not recite it):\n{lines}"


def build_messages(state: ConversationState, turn: int, system_prompt: str) -> list[dict]:
    """The system prompt, then every exchange before `turn`, then this turn's message."""
    messages = [{"role": "system", "content": system_prompt}]
    for message in state.messages:
        if message.turn < turn or (message.turn == turn and message.role == "user"):
            messages.append({"role": message.role, "content": message.content})
    return messages


def make_node(llm: LLMClient, system_template: str | None = None) -> Node:
    template = system_template if system_template is not None else PROMPT.read_text()

    async def handle(event: ev.RouteDecided, ctx: Context) -> list[ev.Envelope]:
        if event.route != "ANSWER":
            return []
        state = await awaiter.turn_state(ctx.bus, event.site, event.session_id, event.turn, set(AWAITED), WAIT_S)
        record_of_turn = state.turns.get(event.turn)
        late = [kind for kind in AWAITED if not record_of_turn or kind not in record_of_turn.seen]
        system = template.format(site=event.site) + visitor_context(state)
        messages = build_messages(state, event.turn, system)
        parts: list[str] = []
        calls = []

        async def record(call):
            calls.append(call)
            await ctx.record_llm(call)

        async for delta in llm.stream("answer", messages, record, temperature=0.3):
            await ctx.token(len(parts), delta)
            parts.append(delta)
        completed = ctx.follow(
            ev.ResponseCompleted, node=NAME, text="".join(parts), token_count=len(parts), attempt=ctx.attempt,
            fallback_used=any(call.fallback_used for call in calls), late_inputs=late,
        )
        return [completed]

    return Node(name=NAME, consumes=("route_decided",), handle=handle)
