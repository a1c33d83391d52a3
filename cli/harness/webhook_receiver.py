"""A local HTTP server playing a CRM's lead webhook, for the tests and the cluster rehearsal."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter


class WebhookReceiver:
    """Answers the first `fail_first` requests with 500, then 200, the first `slow_first` of
    those 200s only after `slow_s` (a receiver that got the request and answers too late);
    keeps every request (headers, body, when it arrived, the sender's port)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.fail_first = 0
        self.slow_first, self.slow_s = 0, 0.0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
                                          "at": time.monotonic(), "peer": self.client_address[1]})
                failing = len(receiver.requests) <= receiver.fail_first
                if not failing and len(receiver.requests) - receiver.fail_first <= receiver.slow_first:
                    time.sleep(receiver.slow_s)
                self.send_response(500 if failing else 200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # What the outbound guard must allow for webhooks to reach it (OUTBOUND_ALLOWED): this
        # address and port only, so every other loopback port stays refused.
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.address}/leads"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def deliveries(self) -> Counter:
        """Accepted deliveries per `webhook-id` (one id per lead, the same on every attempt)."""
        accepted = self.requests[self.fail_first:]
        return Counter(r["headers"].get("webhook-id", "") for r in accepted)

    def repeated(self) -> dict[str, list[float]]:
        """The accepted ids delivered more than once, each with its deliveries' arrival times
        (time.monotonic()): what to set beside the faults to see which one sent it again."""
        times: dict[str, list[float]] = {}
        for r in self.requests[self.fail_first:]:
            times.setdefault(r["headers"].get("webhook-id", ""), []).append(r["at"])
        return {key: at for key, at in times.items() if len(at) > 1}

    def reset(self, fail_first: int = 0) -> None:
        self.requests.clear()
        self.fail_first = fail_first

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # nothing listens on its port any more
