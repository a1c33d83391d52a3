"""The operations port of a consumer process: `/healthz`, `/readyz`, `/metrics`.

A few lines of asyncio rather than a web framework: three GET paths, each answered from
memory, so a probe never waits on NATS (readiness is the last result of the runners'
periodic check, shared/service.py) and a slow scrape never holds a handler up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from shared import metrics

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0
MAX_HEADER_BYTES = 16 * 1024


class OpsServer:
    """`ready()` says whether this process can do its work now (/readyz: 200 or 503);
    /healthz answers 200 whenever the event loop runs."""

    def __init__(self, ready: Callable[[], bool]):
        self.ready = ready
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (useful with port 0 in tests)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            return (200, "text/plain", b"ready\n") if self.ready() else (503, "text/plain", b"not ready\n")
        if path == "/metrics":
            body, content_type = metrics.exposition()
            return 200, content_type, body
        return 404, "text/plain", b"not found\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, content_type, body = self.respond(method, path)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            status, content_type, body, method = 400, "text/plain", b"bad request\n", "GET"
        except Exception:
            log.exception("ops request failed")
            status, content_type, body, method = 500, "text/plain", b"internal error\n", "GET"
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  500: "Internal Server Error", 503: "Service Unavailable"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        try:
            await writer.drain()
        except ConnectionError:
            pass  # the prober went away; nothing to tell it
        finally:
            writer.close()
