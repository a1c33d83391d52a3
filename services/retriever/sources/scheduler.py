"""The sources' schedules: every `poll_s`, each source with `every_s` whose last run was
requested that long ago (or never) and has ended is asked for its next run (reason
`schedule`). Every retriever replica runs one; two asking for the same run make one request
(its id derives from the run: shared/sources.py `request_sync`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from shared import sources, subjects
from shared.bus import Bus

log = logging.getLogger(__name__)


async def due(bus: Bus, now: float) -> list[tuple[str, str]]:
    """(site, source) of every scheduled source whose next run is due."""
    found = []
    for (site, source), spec in (await sources.defined(bus)).items():
        if spec.every_s <= 0:
            continue
        last = await bus.last(subjects.conv(site, sources.session_of(source), "sync_requested"))
        if last is None or now - last.ts >= spec.every_s:
            found.append((site, source))
    return found


class Scheduler:
    def __init__(self, bus: Bus, poll_s: float = 60.0):
        self.bus = bus
        self.poll_s = poll_s
        self._task: asyncio.Task | None = None

    async def tick(self) -> int:
        """One look; how many runs were asked for."""
        asked = 0
        for site, source in await due(self.bus, time.time()):
            _, new = await sources.request_sync(self.bus, site, source, "schedule", actor="scheduler")
            if new:
                asked += 1
                log.info("scheduled sync requested", extra={"site_id": site, "source": source})
        return asked

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sources-scheduler")

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - a bus hiccup must not end the schedule
                log.exception("sources schedule check failed; trying again")
            await asyncio.sleep(self.poll_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
