"""A small client for the gateway's chat endpoint: POST, then read the SSE events.

`Conversation` is one visitor: it keeps the session id and the session token the gateway
hands out (response headers, then each `complete`) and presents them on the next turn."""

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
    session_id: str | None = None
    session_token: str | None = None

    @property
    def text(self) -> str:
        return "".join(e["content"] for e in self.events if e["type"] == "token")

    @property
    def final(self) -> dict | None:
        return self.events[-1] if self.events else None


async def chat(client: httpx.AsyncClient, base_url: str, payload: dict, on_event=None) -> ChatResult:
    started = time.perf_counter()
    async with client.stream("POST", f"{base_url}/v1/chat", json=payload) as response:
        result = ChatResult(status=response.status_code, session_id=response.headers.get("x-session-id"),
                            session_token=response.headers.get("x-session-token"))
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
            if event["type"] == "complete" and event.get("session_token"):
                result.session_id, result.session_token = event["session_id"], event["session_token"]
            if on_event is not None:
                await on_event(event)
    result.total_s = time.perf_counter() - started
    return result


class Conversation:
    """One visitor's conversation with a site, across turns."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, site: str):
        self.client, self.base_url, self.site = client, base_url, site
        self.session_id: str | None = None
        self.session_token: str | None = None

    def payload(self, message: str, **fields) -> dict:
        return {"site": self.site, "session_id": self.session_id, "session_token": self.session_token,
                "message": message, **fields}

    async def say(self, message: str, on_event=None, **fields) -> ChatResult:
        result = await chat(self.client, self.base_url, self.payload(message, **fields), on_event)
        if result.session_id and result.session_token:
            self.session_id, self.session_token = result.session_id, result.session_token
        return result
