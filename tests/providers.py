"""A local HTTP server that plays the enrichment providers (a real server on loopback).

Behaviour per path: /fast answers a profile, /slow answers after 2 s, /fail answers 500,
/malformed answers text that is not JSON, /notfound answers 404. Every hit is counted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from cli.harness.supervisor import free_port

PROFILE = {"company_name": "Hooli", "company_domain": "hooli.example", "sector": "Software", "tier": "enterprise"}


class Providers:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.hits: Counter = Counter()
        self.seen: list[dict] = []


def create_app(state: Providers) -> Starlette:
    async def handle(request: Request) -> Response:
        mode = request.path_params["mode"]
        state.hits[mode] += 1
        state.seen.append({"mode": mode, "query": dict(request.query_params),
                           "body": (await request.body()).decode(), "auth": request.headers.get("authorization")})
        if mode == "fast":
            return JSONResponse(PROFILE)
        if mode == "slow":
            await asyncio.sleep(2)
            return JSONResponse(PROFILE)
        if mode == "fail":
            return JSONResponse({"error": "boom"}, status_code=500)
        if mode == "malformed":
            return PlainTextResponse("<html>not json</html>")
        if mode == "badvalues":
            return JSONResponse({"company_name": 42})
        return JSONResponse({"error": "unknown"}, status_code=404)

    return Starlette(routes=[Route("/{mode}", handle, methods=["GET", "POST"])])


@contextmanager
def provider_server() -> Iterator[Providers]:
    port = free_port()
    state = Providers(port)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(5)
