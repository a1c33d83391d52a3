"""How every response handler sends its reply: tokens to `tokens.<site>.<session>.<turn>`
as they come, then the whole text once as `ResponseCompleted`.

A model's deltas go out batched (`TokenBatcher`): the first at once (the time to first
token is untouched), then whatever the model streams within `batch_s` of the last send
as one `TokenChunk`. A model streams a word every few tens of milliseconds; one event per
word would make each word cost a publish, a store in TOKENS, the gateway's decode and an
SSE frame. A reader sees text arrive at most `batch_s` later than it would have, in fewer,
larger pieces: at the default 0.1 s, ten updates a second (0.05 s would send twice the
events, each with those costs)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

from shared import citations
from shared import events as ev
from shared.node import Context
from shared.llm import LLMClient

# A sentence with the citations after it and the space before the next, or a line.
SENTENCE_RE = re.compile(rf"[^\n]*?[.!?…](?:\s*{citations.CITATION.pattern})*(?:\s+|$)|[^\n]+\n*|\n+")


TOKEN_BATCH_S = 0.1


class TokenBatcher:
    """A model's deltas → the turn's `TokenChunk`s, numbered 0..n-1: the first delta at
    once, later ones gathered until `batch_s` after the last send (a timer sends what a
    pausing model left waiting). `batch_s` 0: one chunk per delta."""

    def __init__(self, ctx: Context, batch_s: float = TOKEN_BATCH_S):
        self.ctx, self.batch_s = ctx, batch_s
        self.sent = 0  # chunks sent: the next one's index
        self._pending: list[str] = []
        self._sent_at = float("-inf")
        self._timer: asyncio.Task | None = None  # waiting to send: may be cancelled
        self._sending: asyncio.Task | None = None  # the timer once it sends: waited for, never cut

    async def add(self, delta: str) -> None:
        self._pending.append(delta)
        if self._timer is not None:
            return  # the timer sends it with the rest
        wait = self._sent_at + self.batch_s - time.monotonic()
        if wait <= 0:
            await self._send()
        else:
            self._timer = self._sending = asyncio.create_task(self._send_after(wait))

    async def _send_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self._timer = None  # from here it publishes: `cancel` waits for it rather than cut it
        await self._send()

    async def _send(self) -> None:
        if not self._pending:
            return
        # Taken and numbered before the publish yields: chunks go out in index order.
        content, index = "".join(self._pending), self.sent
        self._pending.clear()
        self.sent += 1
        self._sent_at = time.monotonic()
        await self.ctx.token(index, content)

    async def close(self) -> None:
        """Send what is waiting (the stream ended), after what the timer is sending."""
        await self.cancel()
        await self._send()

    async def cancel(self) -> None:
        """Stop a timer still waiting, and let one already sending finish: whatever comes
        after (the rest, the turn's end, its failure) goes out after that chunk, never
        before it nor without it."""
        if self._timer is not None:
            timer, self._timer = self._timer, None
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        if self._sending is not None:
            sending, self._sending = self._sending, None
            with contextlib.suppress(asyncio.CancelledError):
                await sending


async def stream_llm(ctx: Context, llm: LLMClient, role: str, node: str, messages: list[dict], *,
                     late_inputs: list[str] | None = None, sources: list[ev.RetrievedDocument] | None = None,
                     batch_s: float = TOKEN_BATCH_S, llm_roles: dict[str, ev.LLMRole] | None = None,
                     **params: Any) -> ev.ResponseCompleted:
    """Stream the model's answer as tokens, batched (`TokenBatcher`). `sources` go out
    first, on the same subject, so the browser has them before the first token that cites one.
    `llm_roles`: the node's LLM roles, recorded on the reply for a replay."""
    await publish_sources(ctx, sources)
    parts: list[str] = []
    calls = []

    async def record(call):
        calls.append(call)
        await ctx.record_llm(call)

    tokens = TokenBatcher(ctx, batch_s)
    try:
        async for delta in llm.stream(role, messages, record, **params):
            parts.append(delta)
            await tokens.add(delta)
    except Exception:
        # What the model did say goes out before the failure, as it did unbatched.
        with contextlib.suppress(Exception):
            await tokens.close()
        raise
    finally:
        await tokens.cancel()
    await tokens.close()
    return ctx.follow(ev.ResponseCompleted, node=node, text="".join(parts), token_count=tokens.sent,
                      attempt=ctx.attempt, first_token_ts=ctx.first_token_ts,
                      fallback_used=any(call.fallback_used for call in calls), late_inputs=late_inputs or [],
                      sources=[d.n for d in sources or []], llm_roles=llm_roles or {})


async def publish_sources(ctx: Context, sources: list[ev.RetrievedDocument] | None) -> None:
    """The sources an answer may cite, on the token subject before its first token."""
    if sources:
        await ctx.stream(ctx.follow(ev.SourcesAttached, key=f"sources-{ctx.attempt}",
                                    sources=ev.public_sources(sources)))


async def stream_text(ctx: Context, node: str, text: str, backend: str = "template",
                      llm_roles: dict[str, ev.LLMRole] | None = None) -> ev.ResponseCompleted:
    """A reply that needs no model (fixed, localized texts; an extractive answer), streamed a
    sentence (or line) at a time: the same events as any other reply, the whole text being
    known at once; one event per word would only cost the bus and the gateway (an extractive
    answer is ~80 words)."""
    parts = [part for part in SENTENCE_RE.findall(text) if part]
    for index, part in enumerate(parts):
        await ctx.token(index, part)
    return ctx.follow(ev.ResponseCompleted, node=node, text=text, token_count=len(parts), attempt=ctx.attempt,
                      first_token_ts=ctx.first_token_ts, backend=backend, llm_roles=llm_roles or {})
