"""A turn's SSE frames: ids `<turn>:<n>`, the `start` frame, Last-Event-ID, keepalive comments."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from cli.harness.sse import read_stream
from services.gateway import frames
from services.gateway.schemas import RequestError


def parsed(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            out.append((lines.get("id"), json.loads(lines["data"])))
    return out


def test_frames_are_numbered_per_turn_from_the_start_frame():
    numbering = frames.Numbering(7)
    first = numbering.encode([frames.start("abc", 7, "tok")])
    rest = numbering.encode([{"type": "token", "content": "Hi\nthere"}, {"type": "complete"}])
    assert first.startswith(b"id: 7:0\ndata: ") and first.endswith(b"\n\n")
    assert parsed(first + rest) == [
        ("7:0", {"type": "start", "session_id": "abc", "turn": 7, "session_token": "tok"}),
        ("7:1", {"type": "token", "content": "Hi\nthere"}), ("7:2", {"type": "complete"})]


def test_frames_the_client_already_has_are_held_back_but_counted():
    numbering = frames.Numbering(2, after=1)
    assert numbering.encode([frames.start("abc", 2, "tok"), {"type": "token", "content": "a"}]) == b""
    assert parsed(numbering.encode([{"type": "token", "content": "b"}])) == [("2:2", {"type": "token", "content": "b"})]


@pytest.mark.parametrize("header, turn, after", [(None, 3, -1), ("", 3, -1), ("3:0", 3, 0), ("3:41", 3, 41)])
def test_last_event_id(header, turn, after):
    assert frames.last_event_id(header, turn) == after


@pytest.mark.parametrize("header", ["3", "x:1", "3:-1", "4:1", "3:1:2", "3:99999999999"])
def test_a_last_event_id_of_another_shape_or_turn_is_a_400(header):
    with pytest.raises(RequestError) as caught:
        frames.last_event_id(header, 3)
    assert caught.value.status == 400 and caught.value.field == "last-event-id"


async def test_a_waiting_stream_sends_keepalive_comments_and_no_proxy_buffering():
    async def slow(request):
        async def body():
            yield frames.Numbering(1).encode([frames.start("abc", 1, "tok")])
            await asyncio.sleep(0.35)
            yield frames.Numbering(1, first=1).encode([{"type": "complete"}])

        return frames.response(body(), {"X-Session-Id": "abc"}, keepalive_s=0.1)

    app = Starlette(routes=[Route("/", slow)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        async with client.stream("GET", "/") as response:
            assert response.headers["x-accel-buffering"] == "no" and response.headers["x-session-id"] == "abc"
            assert response.headers["content-type"].startswith("text/event-stream")
            result = await read_stream(response)
    assert result.keepalives >= 2
    assert result.start == {"type": "start", "session_id": "abc", "turn": 1, "session_token": "tok"}
    assert result.events == [{"type": "complete"}] and result.last_event_id == "1:1"
