from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest


def _cache_bytecode() -> None:
    """With PYTHONDONTWRITEBYTECODE set (as on the CI machine), nothing is ever compiled once:
    every process the tests start (each service of each system, every CLI command, the xdist
    workers) compiled torch, transformers, FastAPI, ... from source again, about a third of a
    system's start-up CPU. Their bytecode goes to a cache outside the tree instead
    (PYTHONPYCACHEPREFIX), so the tree stays as clean as the setting keeps it; Python checks
    each cached file against its source, and writes it atomically."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / f"concierge-pycache-{os.getuid()}")
        # This process too, for what it imports from now on (the test modules and the code under test).
        sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False


_cache_bytecode()  # at import: before xdist starts its workers, which inherit the environment

from shared.bus import connect
from shared.config import BusConfig
from shared import redis_client
from tests.servers import WebhookReceiver, nats_server, redis_server, scripted_llm


# `make test` runs the modules side by side (pytest-xdist, `-n`): a worker runs a module
# whole, so its module-scoped system starts once (the scheduler below). The runs that load
# the machine most (two replicas of everything, killed and restarted; a bench's pairs) are
# one unit, run one after the other rather than starving each other; the longest units are
# handed out first so that no worker starts one late. The modules that take tests/e2e.py's
# shared system are one unit too, so that it starts once.
HEAVY = ("test_chaos", "test_cluster_rehearsal", "test_bench")
SHARED_SYSTEM = ("test_e2e_http", "test_e2e_briefs", "test_eval_runs")
LONGEST_FIRST = (*HEAVY, "test_hostile", "test_replay", "test_turn_config", "test_loadtest", "test_state",
                 "test_resilience", "test_browser", *SHARED_SYSTEM, "test_k8s", "test_answer_eval", "test_eval_console")


def _module(nodeid: str) -> str:
    return Path(nodeid.split("::", 1)[0]).stem


def _unit(nodeid: str) -> str:
    """The unit a test is handed out with: its module, or the heavy runs, or the modules that
    share a system."""
    module = _module(nodeid)
    if module in HEAVY:
        return "heavy"
    return "shared-system" if module in SHARED_SYSTEM else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        """xdist's scope scheduling, a scope being a unit (`_unit`), handed out in collection
        order (LONGEST_FIRST)."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # the order below, not by how many tests a unit has
    return ModuleUnits(config, log)


# Under xdist, the terminal summary says when each worker finished and what took it longest:
# the workers should finish together (LONGEST_FIRST is the lever).
_SESSION_START = time.time()
_SPANS: dict[str, dict[str, list[float]]] = {}  # worker -> unit -> [first start, last stop]


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # on the controller, the worker that ran the test
    if node is None or not report.start:
        return
    span = _SPANS.setdefault(node.gateway.id, {}).setdefault(_unit(report.nodeid), [report.start, report.stop])
    span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)


def pytest_terminal_summary(terminalreporter):
    from cli.measure import machine

    # Beside the suite's time, how fast this machine is (higher is slower): another machine's
    # times compare through it (docs/benchmarks.md).
    terminalreporter.write_line(f"machine gauge: {machine.gauge_ms()} ms (cli/measure/machine.py), "
                                f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for worker, units in sorted(_SPANS.items()):
        done = max(stop for _, stop in units.values()) - _SESSION_START
        longest = sorted(units.items(), key=lambda u: u[1][0] - u[1][1])[:4]
        terminalreporter.write_line(f"{worker} done after {done:.0f} s ({len(units)} units; longest: " + ", ".join(
            f"{Path(unit).stem} {stop - start:.0f} s" for unit, (start, stop) in longest) + ")")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item.nodeid), len(rank)))  # stable: modules keep their order


@pytest.fixture(scope="session")
def nats_url():
    with nats_server() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture
async def redis(redis_url):
    r = redis_client.connect(redis_url)
    yield r
    await r.aclose()


@pytest.fixture(scope="session")
def llm():
    with scripted_llm() as server:
        yield server


@pytest.fixture(scope="session")
def suggestions_llm():
    """The provider behind the `suggestions` role, apart so tests can script its JSON."""
    with scripted_llm() as server:
        yield server


@pytest.fixture(scope="session")
def fallback_llm():
    """A second scripted provider, configured as the fallback endpoint."""
    with scripted_llm() as server:
        yield server


@pytest.fixture(scope="module")
def webhook():
    """A local receiver for lead webhooks, one per test module."""
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


# Session-scoped, so defined once, here: a session fixture each module registered for itself
# would be started once per module. The modules take them through tests/e2e.py.
@pytest.fixture(scope="session")
def e2e_shared_webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def providers():
    """The enrichment vendors' stand-ins (tests/providers.py), a server per module."""
    from tests.providers import provider_server

    with provider_server() as p:
        yield p


@pytest.fixture(scope="session")
def e2e_shared_providers():
    """The enrichment vendors' stand-ins (tests/providers.py) the shared system's sites may use."""
    from tests.providers import provider_server

    with provider_server() as providers:
        yield providers


@pytest.fixture(scope="session")
def e2e_shared_system(llm, fallback_llm, suggestions_llm, e2e_shared_webhook, e2e_shared_providers):
    from tests.e2e import running_system

    with running_system(llm, fallback_llm, suggestions_llm, e2e_shared_webhook,
                        providers=e2e_shared_providers) as system:
        yield system


@pytest.fixture
async def bus(nats_url):
    b = await connect(BusConfig(url=nats_url, dedupe_window_s=120), name="test")
    yield b
    await b.close()


@pytest.fixture
async def work_bus():
    """A bus on a nats-server of its own: a work-queue stream allows one consumer per subject
    filter, and the system tests' enricher consumes the BRIEFS work queue's subjects."""
    with nats_server() as url:
        b = await connect(BusConfig(url=url, dedupe_window_s=120), name="test-work-queue")
        yield b
        await b.close()


@pytest.fixture
def site():
    """A site of its own per test, so tests never read each other's conversations."""
    return f"t{uuid.uuid4().hex[:10]}"
