"""Health: `/healthz` (the process answers) and `/readyz` (it can serve: the bus and its
streams there, and the site registry loaded, so a site the gateway cannot find is one that
is not configured). The ops port (shared/ops.py, started with the app) answers the same and
/metrics; `watch_ready` keeps its /readyz current."""

from __future__ import annotations

import asyncio

import nats.errors
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from shared.bus import topology_ready

router = APIRouter(tags=["health"])


async def ready(app: FastAPI) -> bool:
    try:
        return await topology_ready(app.state.bus) and await app.state.sites.loaded()
    except (nats.errors.Error, TimeoutError):
        return False


async def watch_ready(app: FastAPI, every_s: float) -> None:
    """Keep `app.state.ready` (the ops port's /readyz) current: every second until the
    gateway is first ready, then every `every_s`."""
    while True:
        app.state.ready = await ready(app)
        await asyncio.sleep(every_s if app.state.ready else min(every_s, 1.0))


@router.get("/healthz")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the bus, its streams or the site registry are not there"}})
async def readyz(request: Request):
    if await ready(request.app):
        return {"status": "ready"}
    return JSONResponse({"status": "not ready"}, status_code=503)
