"""Router service: analyses each turn (intent, buying signals, skills) in parallel, routes
it (ANSWER / REDIRECT / BOOKING) and applies the skill rules. It also keeps the site
configs in the `site_config` bucket in step with `SITES_DIR`."""

import asyncio
import logging
from pathlib import Path

from services.router import intent_classifier, intent_router, interest_signals_detector, skill_selector
from services.router.runtime import RouterParts
from services.router.settings import RouterSettings
from shared import service
from shared.llm import LLMClient
from shared.node import Node
from shared.site_store import SiteConfigSync, register_no_sites

log = logging.getLogger(__name__)
_sync: SiteConfigSync | None = None


async def nodes(bus, settings: RouterSettings):
    global _sync
    sites = Path(settings.sites_dir)
    if sites.is_dir():
        _sync = SiteConfigSync(bus, sites, settings.sites_poll_s)
        await _sync.start()
    else:
        log.info("no SITES_DIR: every site runs on the default config", extra={"dir": str(sites)})
        await register_no_sites(bus)
    llm = LLMClient(settings.llm).prepare()
    parts = await asyncio.to_thread(RouterParts.build, llm if llm.configured("classifier") else None, settings)
    return router_nodes(parts)


def router_nodes(parts: RouterParts) -> list[Node]:
    """The router's nodes over its parts (also what a replay runs)."""
    selector = [skill_selector.make_node(parts)] if parts.skills_backend == "llm" else []  # else the router selects
    return [intent_classifier.make_node(parts), interest_signals_detector.make_node(parts), *selector,
            intent_router.make_node(parts)]


def main() -> None:
    service.main("router", RouterSettings.from_env, nodes, follow_log=True)


if __name__ == "__main__":
    main()
