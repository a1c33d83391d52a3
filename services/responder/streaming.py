"""How every response handler sends its reply: tokens to `tokens.<site>.<session>.<turn>`
as they come, then the whole text once as `ResponseCompleted`."""

from __future__ import annotations

import re
from typing import Any

from shared import events as ev
from shared.node import Context
from shared.llm import LLMClient

# A sentence with the citations after it and the space before the next, or a line.
SENTENCE_RE = re.compile(r"[^\n]*?[.!?…](?:\s*\[\d+\])*(?:\s+|$)|[^\n]+\n*|\n+")


async def stream_llm(ctx: Context, llm: LLMClient, role: str, node: str, messages: list[dict], *,
                     late_inputs: list[str] | None = None, sources: list[ev.RetrievedDocument] | None = None,
                     **params: Any) -> ev.ResponseCompleted:
    """Stream the model's answer as tokens. `sources` go out first, on the same subject, so
    the browser has them before the first token that cites one."""
    await publish_sources(ctx, sources)
    parts: list[str] = []
    calls = []

    async def record(call):
        calls.append(call)
        await ctx.record_llm(call)

    async for delta in llm.stream(role, messages, record, **params):
        await ctx.token(len(parts), delta)
        parts.append(delta)
    return ctx.follow(ev.ResponseCompleted, node=node, text="".join(parts), token_count=len(parts),
                      attempt=ctx.attempt, fallback_used=any(call.fallback_used for call in calls),
                      late_inputs=late_inputs or [], sources=[d.n for d in sources or []])


async def publish_sources(ctx: Context, sources: list[ev.RetrievedDocument] | None) -> None:
    """The sources an answer may cite, on the token subject before its first token."""
    if sources:
        await ctx.bus.publish_token(ctx.follow(ev.SourcesAttached, key=f"sources-{ctx.attempt}",
                                               sources=ev.public_sources(sources)))


async def stream_text(ctx: Context, node: str, text: str, backend: str = "template") -> ev.ResponseCompleted:
    """A reply that needs no model (fixed, localized texts; an extractive answer), streamed a
    sentence (or line) at a time: the same events as any other reply, the whole text being
    known at once; one event per word would only cost the bus and the gateway (an extractive
    answer is ~80 words)."""
    parts = [part for part in SENTENCE_RE.findall(text) if part]
    for index, part in enumerate(parts):
        await ctx.token(index, part)
    return ctx.follow(ev.ResponseCompleted, node=node, text=text, token_count=len(parts), attempt=ctx.attempt,
                      backend=backend)
