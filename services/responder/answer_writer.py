"""answer_writer: streams the answer to an ANSWER turn.

History comes from the conversation log, so turn N sees every earlier exchange. Tokens
go to `tokens.<site>.<session>.<turn>` as they arrive; the full text is stored once,
as `ResponseCompleted`.
"""

from __future__ import annotations

from pathlib import Path

from shared import events as ev
from shared import loader
from shared.consumer import Context, Node
from shared.llm import LLMClient
from shared.state import ConversationState

NAME = "answer_writer"
PROMPT = Path(__file__).parent / "prompts" / "answer_system.md"


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
        state = await loader.load(ctx.bus, event.site, event.session_id)
        messages = build_messages(state, event.turn, template.format(site=event.site))
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
            fallback_used=any(call.fallback_used for call in calls),
        )
        return [completed]

    return Node(name=NAME, consumes=("route_decided",), handle=handle)
