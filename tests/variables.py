"""The environment variables the code reads, found by running the settings constructors on a
recording environment rather than listed by hand: each process's `from_env`s, with every
optional part switched on (remote enrichment sources, the LLM roles read only when their
backend is chosen, knowledge-base snapshots), and the delivery policy of each node it hosts.
What is checked against it (docs/operations.md lists every variable, the manifests set no
other: tests/test_settings.py, tests/test_k8s.py) follows the code."""

from __future__ import annotations

import importlib
import inspect
import os
import typing
from functools import lru_cache
from typing import Callable

from shared.config import ConsumerConfig, Settings

CONSUMER_SERVICES = ("router", "retriever", "enricher", "responder")
# Values that make the constructors read their optional parts too.
SWITCHED_ON = {
    "ENRICH_SESSION_PROVIDER_URL": "http://provider.invalid", "ENRICH_IP_API_URL": "http://ip-api.invalid",
    "ENRICH_PERSON_API_URL": "http://person-api.invalid",
    "PROFILER_BACKEND": "llm", "RETRIEVAL_KEYWORDS": "llm", "RETRIEVAL_EXTRACTION": "llm",
    "QDRANT_URL": "http://qdrant.invalid:6333", "KB_SNAPSHOTS": "bus",
}
# Read at start-up by logging and tracing set-up, outside the settings (test_settings.py allows them).
STARTUP = frozenset({"LOG_LEVEL", "OTEL_TRACES_EXPORTER"})


class _Anything:
    """Stands for every argument a node factory closes over: building a node only names it."""

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *args, **kwargs):
        return _Anything()


@lru_cache(maxsize=None)
def service_nodes() -> dict[str, tuple[str, ...]]:
    """Each consumer service's node names, in the order its main.py lists them: its
    `<service>_nodes(...)` (what `nodes(bus, settings)` returns, and what a replay runs)
    called with the service's default settings and stand-ins for what the nodes close over,
    without connecting to anything."""
    nodes = {}
    for service in CONSUMER_SERVICES:
        module = importlib.import_module(f"services.{service}.main")
        build = getattr(module, f"{service}_nodes")
        hints = typing.get_type_hints(build)
        arguments = [hints[name]() if isinstance(hints.get(name), type) and issubclass(hints[name], Settings)
                     else _Anything() for name in inspect.signature(build).parameters]
        nodes[service] = tuple(node.name for node in build(*arguments))
    return nodes


class _Recording(dict):
    """An environment that notes the names looked up in it."""

    def __init__(self, values: dict[str, str]):
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def read_by(load: Callable[[], object], environ: dict[str, str] | None = None) -> set[str]:
    """The names `load()` looks up in the environment, run on `environ` (default: SWITCHED_ON)."""
    recording, saved = _Recording(SWITCHED_ON if environ is None else environ), os.environ
    os.environ = recording
    try:
        load()
    finally:
        os.environ = saved
    return recording.read


def loaders() -> dict[str, Callable[[], object]]:
    """What each process reads at start, by its name (a service, or `ingest`)."""
    from services.enricher.settings import EnricherSettings
    from services.gateway.settings import GatewaySettings
    from services.responder.settings import ResponderSettings
    from services.retriever.settings import KnowledgeBaseSettings, RetrieverSettings, SnapshotSettings
    from services.router.settings import RouterSettings
    from shared.config import BusConfig
    from shared.embeddings import EmbeddingSettings
    from shared.service import ProcessSettings

    nodes = service_nodes()  # made now, not while the environment is recorded

    def consumer(settings: type) -> Callable[[], object]:
        service = settings.__module__.split(".")[1]
        return lambda: (ProcessSettings.from_env(), settings.from_env(),
                        [ConsumerConfig.from_env(node) for node in nodes[service]])

    def ingest():
        kb = KnowledgeBaseSettings.from_env()
        return kb, SnapshotSettings.from_env(server=bool(kb.qdrant_url)), BusConfig.from_env(), EmbeddingSettings.from_env()

    return {"gateway": GatewaySettings.from_env, "router": consumer(RouterSettings),
            "retriever": consumer(RetrieverSettings), "enricher": consumer(EnricherSettings),
            "responder": consumer(ResponderSettings), "ingest": ingest}


@lru_cache(maxsize=None)
def variables() -> dict[str, frozenset[str]]:
    """Each process's variables."""
    return {name: frozenset(read_by(load) | STARTUP) for name, load in loaders().items()}


def every_variable() -> frozenset[str]:
    return frozenset().union(*variables().values())
