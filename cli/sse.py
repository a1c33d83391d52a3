"""A small client for the gateway's chat endpoint: POST, then read the SSE events."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class ChatResult:
    status: int
    events: list[dict] = field(default_factory=list)
    first_token_s: float | None = None
    total_s: float = 0.0
    body: dict | None = None  # the JSON error body of a non-200 answer

    @property
    def text(self) -> str:
        return "".join(e["content"] for e in self.events if e["type"] == "token")

    @property
    def final(self) -> dict | None:
        return self.events[-1] if self.events else None


async def chat(client: httpx.AsyncClient, base_url: str, payload: dict, on_event=None) -> ChatResult:
    started = time.perf_counter()
    async with client.stream("POST", f"{base_url}/v1/chat", json=payload) as response:
        result = ChatResult(status=response.status_code)
        if response.status_code != 200:
            result.body = json.loads(await response.aread())
            return result
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: "):])
            if event["type"] == "token" and result.first_token_s is None:
                result.first_token_s = time.perf_counter() - started
            result.events.append(event)
            if on_event is not None:
                await on_event(event)
    result.total_s = time.perf_counter() - started
    return result
