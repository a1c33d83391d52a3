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

    async def ipinfo(request: Request) -> Response:
        """IPinfo's `GET /{ip}/json`, answering as its documentation shows (a token as bearer)."""
        ip = request.path_params["ip"]
        state.hits["ipinfo"] += 1
        if request.headers.get("authorization") != "Bearer secret":
            return JSONResponse({"status": 403, "error": {"title": "Unknown token", "message": "Please ensure "
                                 "you've entered your token correctly."}}, status_code=403)
        if ip in IPINFO:
            return JSONResponse(IPINFO[ip])
        if ip == "203.0.113.99":
            return JSONResponse({"status": 429, "error": {"title": "Rate limit exceeded", "message": "Upgrade to "
                                 "increase your usage limits at https://ipinfo.io/pricing"}}, status_code=429)
        return JSONResponse({"status": 404, "error": {"title": "Wrong ip", "message": "Please provide a valid IP "
                             "address"}}, status_code=404)

    return Starlette(routes=[Route("/ipinfo/{ip}/json", ipinfo), Route("/{mode}", handle, methods=["GET", "POST"])])


# IPinfo's answers (its documented shape), by address: a business (paid plan: `company`), an
# ISP's customer, a free plan's `org` only, a private address.
IPINFO = {
    "203.0.113.10": {"ip": "203.0.113.10", "city": "Austin", "region": "Texas", "country": "US",
                     "loc": "30.2672,-97.7431", "org": "AS64500 Initech Inc.", "postal": "78701",
                     "timezone": "America/Chicago",
                     "asn": {"asn": "AS64500", "name": "Initech Inc.", "domain": "initech.example",
                             "route": "203.0.113.0/24", "type": "business"},
                     "company": {"name": "Initech", "domain": "initech.example", "type": "business"}},
    "203.0.113.20": {"ip": "203.0.113.20", "country": "DE", "org": "AS64501 Example Telecom",
                     "company": {"name": "Example Telecom", "domain": "telecom.example", "type": "isp"}},
    "198.51.100.7": {"ip": "198.51.100.7", "city": "Boston", "country": "US", "org": "AS64502 Example University"},
    "10.0.0.1": {"ip": "10.0.0.1", "bogon": True},
}


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
