from __future__ import annotations

import uuid

import pytest

from shared.bus import connect
from shared.config import BusConfig
from shared import redis_client
from tests.servers import WebhookReceiver, nats_server, redis_server, scripted_llm


# `make test` runs the modules side by side (pytest-xdist, `--dist loadgroup`): each module is
# a group that one worker runs whole, so its module-scoped system starts once. The runs that
# load the machine most (two replicas of everything, killed and restarted; a bench's pairs)
# share one group, so they run one after the other rather than starving each other, and the
# longest groups are handed out first so that no worker starts one late.
HEAVY = ("test_chaos", "test_cluster_rehearsal", "test_bench")
LONGEST_FIRST = (*HEAVY, "test_e2e", "test_hostile", "test_replay", "test_turn_config", "test_loadtest", "test_state",
                 "test_k8s", "test_answer_eval")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    def module(item) -> str:
        return item.path.stem

    for item in items:
        item.add_marker(pytest.mark.xdist_group("heavy" if module(item) in HEAVY else module(item)))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(module(item), len(rank)))  # stable: each module keeps its order


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
