"""`concierge check`: the configuration every process would start with, checked before any starts.

Each process reads its settings once at start and stops on a bad value with a line naming
it (`gateway: ADMIN_TOKEN must be ...`). Here the same settings are read, as each process
reads them, in this environment, and every problem of every process is listed at once:
what `concierge run` does before it starts anything, and what an operator can run against
a deployment's environment.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, Mapping

from shared.config import every_problem


def _gateway() -> None:
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    create_app(GatewaySettings.from_env())  # what services/gateway/main.py does before serving


def _consumer(load: Callable[[], object]) -> Callable[[], object]:
    def check() -> object:
        from shared.service import ProcessSettings

        ProcessSettings.from_env()
        return load()
    return check


def _router() -> object:
    from services.router.settings import RouterSettings

    return RouterSettings.from_env()


def _retriever() -> object:
    from services.retriever.settings import RetrieverSettings

    return RetrieverSettings.from_env()


def _enricher() -> object:
    from services.enricher.settings import EnricherSettings

    return EnricherSettings.from_env().briefs_with_llm()


def _responder() -> object:
    from services.responder.answer_writer import backend
    from services.responder.settings import ResponderSettings
    from shared.llm import LLMClient

    settings = ResponderSettings.from_env()
    return backend(LLMClient(settings.llm), settings.answer.backend)


CHECKS: dict[str, Callable[[], object]] = {
    "router": _consumer(_router),
    "retriever": _consumer(_retriever),
    "enricher": _consumer(_enricher),
    "responder": _consumer(_responder),
    "gateway": _gateway,
}


def problems(env: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of every process's settings, one line each: in `env`, the environment
    the processes will be started with, when given (this process's is put back after)."""
    if env is None:
        return every_problem(CHECKS)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return every_problem(CHECKS)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    found = problems()
    for line in found:
        print(line)
    if not found:
        print(f"configuration ok: {', '.join(CHECKS)}")
    return 1 if found else 0
