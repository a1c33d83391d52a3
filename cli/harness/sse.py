"""A small client for the gateway's chat endpoint: POST, then read the SSE events; and for
the resume endpoint (`resume`), which sends a turn's frames again after a `Last-Event-ID`.

`Conversation` is one visitor: it keeps the session id and the session token the gateway
hands out (response headers, then each `complete`) and presents them on the next turn."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class ChatResult:
    status: int = 0  # 0: no response (yet)
    events: list[dict] = field(default_factory=list)  # every frame after `start`
    first_token_s: float | None = None
    total_s: float = 0.0
    body: dict | None = None  # the JSON error body of a non-200 answer
    session_id: str | None = None
    session_token: str | None = None
    start: dict | None = None  # the `start` frame: the conversation and turn to resume
    last_event_id: str | None = None  # the `id:` of the last frame read (`<turn>:<n>`)
    keepalives: int = 0  # comment frames read

    @property
    def text(self) -> str:
        """The answer as shown: a `restart` frame replaces the text before it."""
        text = ""
        for e in self.events:
            if e["type"] == "restart":
                text = ""
            elif e["type"] == "token":
                text += e["content"]
        return text

    @property
    def final(self) -> dict | None:
        return self.events[-1] if self.events else None


async def chat(client: httpx.AsyncClient, base_url: str, payload: dict, on_event=None,
               into: ChatResult | None = None) -> ChatResult:
    started = time.perf_counter()
    async with client.stream("POST", f"{base_url}/v1/chat", json=payload) as response:
        return await read_stream(response, on_event, started, into)


async def resume(client: httpx.AsyncClient, base_url: str, site: str, session_id: str, turn: int, session_token: str,
                 last_event_id: str | None = None, on_event=None, into: ChatResult | None = None) -> ChatResult:
    """A turn's stream again, after the frame `last_event_id` (from the start without it)."""
    headers = {"X-Session-Token": session_token, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    url = f"{base_url}/v1/sites/{site}/conversations/{session_id}/turns/{turn}/stream"
    started = time.perf_counter()
    async with client.stream("GET", url, headers=headers) as response:
        return await read_stream(response, on_event, started, into)


async def read_stream(response: httpx.Response, on_event=None, started: float | None = None,
                      into: ChatResult | None = None) -> ChatResult:
    """Read the SSE frames (`id:` and `data:` lines; comments are keepalives) to the end, into
    `into` as they come when given (a caller whose connection breaks keeps what was read)."""
    started = time.perf_counter() if started is None else started
    result = into if into is not None else ChatResult(status=0)
    result.status = response.status_code
    result.session_id = response.headers.get("x-session-id")
    result.session_token = response.headers.get("x-session-token")
    if response.status_code != 200:
        result.body = json.loads(await response.aread())
        return result
    frame_id = data = None
    async for line in response.aiter_lines():
        if line.startswith(":"):
            result.keepalives += 1
        elif line.startswith("id: "):
            frame_id = line[len("id: "):]
        elif line.startswith("data: "):
            data = line[len("data: "):]
        elif not line and data is not None:
            event = json.loads(data)
            result.last_event_id, frame_id, data = frame_id, None, None
            if event["type"] == "start":
                result.start = event
                continue
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
