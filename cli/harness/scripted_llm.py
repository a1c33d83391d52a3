"""A scripted OpenAI-compatible chat server: the only stand-in the tests and `make bench` use.

It is a real HTTP server that streams `chat.completion.chunk` SSE like the real API.
The answer is derived from the request, so tests can see what the model was sent:

    "You said: <last user message>. I have <N> earlier messages of context. ..."

(a system prompt asking for "exactly these sections" gets each of its `## ` headings, each
followed by "You said: ...").

Like OpenAI's, every answer names the model and a `system_fingerprint`, and a stream asked
for `stream_options.include_usage` ends with a chunk of token usage (no choices).
A request with a JSON-schema `response_format` (OpenAI's `json_schema`, or llama-cpp-python's
`json_object` with a `schema`) gets a small object that satisfies it.

Faults are scripted through `POST /_faults` with a list of objects consumed one per
request, in order: `{"status": 503}` answers with that HTTP status; `{"break_after": 3}`
drops the connection after 3 chunks; `{"delay_s": 2}` waits before answering;
`{"inter_token_ms": 200}` streams that one answer slowly; `{"reply": "..."}` answers
that exact text.
`GET /_requests` lists the requests received (newest last); `DELETE /_requests` clears
them and any faults still queued.

Recorded replies (`--recorded FILE`) stand in for a real model's answers to known requests:
a JSON file `{"replies": [{"when": ["substring", ...], "reply": "text"}, ...]}`. A request
gets the reply of the first entry all of whose substrings occur in its messages' contents;
that wins over the JSON-schema object and the echo, and a queued fault's `reply` wins over it.
A request no entry matches is answered as above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FINGERPRINT = "fp_scripted"
BREAK_AFTER_LAST_CHUNK_S = 0.3  # a `break_after` fault: how long after its last chunk the connection drops (a loaded test machine may take 50 ms to read them)


class Recorded(msgspec.Struct):
    """One recorded reply: sent to a request whose messages contain every `when` substring."""

    when: list[str]
    reply: str


class Recording(msgspec.Struct):
    replies: list[Recorded]


def read_recording(path: str | Path) -> list[Recorded]:
    return msgspec.json.decode(Path(path).read_bytes(), type=Recording).replies


class Script:
    def __init__(self, ttft_ms: float = 0.0, inter_token_ms: float = 0.0, extra_words: int = 8,
                 recorded: Iterable[Recorded] = ()):
        self.ttft_s = ttft_ms / 1000
        self.inter_token_s = inter_token_ms / 1000
        self.extra_words = extra_words
        self.recorded = list(recorded)
        self.faults: list[dict] = []
        self.requests: list[dict] = []

    def recorded_reply(self, messages: list[dict]) -> str | None:
        sent = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        return next((r.reply for r in self.recorded if all(w in sent for w in r.when)), None)

    def answer(self, messages: list[dict]) -> str:
        users = [m for m in messages if m.get("role") == "user"]
        last = users[-1]["content"] if users else ""
        if headings := asked_sections(messages):
            said = " ".join(last.split())[:160]
            return "\n\n".join(f"{heading}\nYou said: {said}" for heading in headings)
        earlier = len([m for m in messages if m.get("role") in ("user", "assistant")]) - 1
        filler = " ".join(f"word{i}" for i in range(self.extra_words))
        return f"You said: {last}. I have {max(earlier, 0)} earlier messages of context. {filler}".strip()


def asked_sections(messages: list[dict]) -> list[str]:
    """The `## ` headings a system prompt asks for after "exactly these sections" (a lead
    brief, a call script): a model following the format writes them."""
    system = "\n".join(m.get("content") or "" for m in messages if m.get("role") == "system")
    _, found, rest = system.partition("exactly these sections")
    return [line.strip() for line in rest.splitlines() if line.startswith("## ")] if found else []


def conforming(schema: dict) -> dict:
    """A small object that satisfies a (flat) JSON schema: what a model following it returns."""
    out = {}
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type")
        items = prop.get("items") or {}
        if "enum" in prop:
            out[name] = prop["enum"][0]
        elif kind == "array" and "enum" in items:
            out[name] = items["enum"][:1]
        elif kind == "array":
            out[name] = [f"Scripted {name} {i}" for i in (1, 2)]
        elif kind in ("number", "integer"):
            out[name] = prop.get("minimum", 0)
        elif kind == "boolean":
            out[name] = False
        else:
            out[name] = "unknown"
    return out


def tokens_of(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def create_app(script: Script) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        fault = script.faults.pop(0) if script.faults else {}
        if fault.get("delay_s"):
            await asyncio.sleep(float(fault["delay_s"]))
        if fault.get("status"):
            return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}},
                                status_code=int(fault["status"]))
        model = body.get("model", "scripted")
        if "reply" in fault:
            text = fault["reply"]
        elif (recorded := script.recorded_reply(body.get("messages", []))) is not None:
            text = recorded
        elif (body.get("response_format") or {}).get("type") == "json_schema":
            text = json.dumps(conforming(body["response_format"]["json_schema"]["schema"]))
        elif (body.get("response_format") or {}).get("type") == "json_object" and "schema" in body["response_format"]:
            text = json.dumps(conforming(body["response_format"]["schema"]))  # llama-cpp-python's form
        else:
            text = script.answer(body.get("messages", []))
        parts = tokens_of(text)
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        if not body.get("stream"):
            return JSONResponse({
                "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": len(parts), "total_tokens": 10 + len(parts)},
            })
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        break_after = fault.get("break_after")
        inter_token_s = float(fault["inter_token_ms"]) / 1000 if "inter_token_ms" in fault else script.inter_token_s

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            payload = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                       "model": model, "system_fingerprint": FINGERPRINT,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(payload)}\n\n".encode()

        async def stream():
            await asyncio.sleep(script.ttft_s)
            yield chunk({"role": "assistant", "content": ""})
            for i, part in enumerate(parts):
                if break_after is not None and i >= int(break_after):
                    # The connection drops a moment after the last chunk, as a provider's does
                    # between chunks: a reset in the same read as the chunks before it makes
                    # aiohttp (the LLM clients' transport) raise before handing them over.
                    await asyncio.sleep(max(inter_token_s, BREAK_AFTER_LAST_CHUNK_S))
                    raise ConnectionResetError("scripted break")
                if i:
                    await asyncio.sleep(inter_token_s)
                yield chunk({"content": part})
            yield chunk({}, "stop")
            if include_usage:
                usage = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                         "model": model, "system_fingerprint": FINGERPRINT, "choices": [],
                         "usage": {"prompt_tokens": 10, "completion_tokens": len(parts), "total_tokens": 10 + len(parts)}}
                yield f"data: {json.dumps(usage)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def faults(request: Request) -> Response:
        script.faults.extend(await request.json())
        return JSONResponse({"queued": len(script.faults)})

    async def requests(request: Request) -> Response:
        if request.method == "DELETE":
            script.requests.clear()
            script.faults.clear()
            return JSONResponse({"cleared": True})
        return JSONResponse(script.requests)

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/_faults", faults, methods=["POST"]),
        Route("/_requests", requests, methods=["GET", "DELETE"]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge scripted-llm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first chunk")
    parser.add_argument("--inter-token-ms", type=float, default=0.0, help="delay between chunks")
    parser.add_argument("--extra-words", type=int, default=8, help="filler words appended to every answer")
    parser.add_argument("--recorded", metavar="FILE",
                        help='recorded replies: {"replies": [{"when": [...], "reply": "..."}]}')
    args = parser.parse_args(argv)
    script = Script(args.ttft_ms, args.inter_token_ms, args.extra_words,
                    recorded=read_recording(args.recorded) if args.recorded else ())
    uvicorn.run(create_app(script), host=args.host, port=args.port, log_level="warning")
    return 0
