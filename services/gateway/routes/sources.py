"""A site's knowledge sources, for operators (under the operator prefix: operator.py); the
runs themselves are the retriever's (services/retriever/sources), the commands and reads
shared/sources.py.

- `GET    sources`: every source, its last run's state and progress, its last completed run;
- `POST   sources` (`{"url": ..., "every": "24h", "include": [...], "exclude": [...],
  "max_pages": 500}` or `{"title": ..., "text": ...}`): defines a source and starts its
  first run, 202; a field that is wrong is a 422 naming it (the same checks as the CLI);
- `GET    sources/{source_id}`: the source, and its last run's pages (outcome, title, why a
  page failed or was skipped);
- `POST   sources/{source_id}/sync`: its next run (or the one still going), 202;
- `DELETE sources/{source_id}`: removed; its pages leave the knowledge base;
- `POST   uploads?name=FILE` (the file's bytes as the body, at most 20 MiB): a file source
  (PDF, DOCX, PPTX, HTML, Markdown, text), stored and synced, 202.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Query, Request

from shared import sources, subjects
from services.gateway.access import operator_of_site
from services.gateway.errors import NotFound
from services.gateway.openapi import SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import decode, read_body

router = APIRouter()
SourceId = Annotated[str, msgspec.Meta(pattern=r"^(web|file|text|answer)-[0-9a-f]{12}\Z")]
_decoder = msgspec.json.Decoder(sources.SourceInput)
MAX_DEFINITION_BYTES = 256 * 1024
PAGES_SHOWN = 1000


def _actor(who: Operator) -> str:
    return "admin" if who.site is None else f"key:{who.site}"


async def _view(request: Request, site: str, spec) -> dict:
    state = await request.app.state.store.state(site, sources.session_of(spec.id))
    return await sources.status(request.app.state.bus, site, spec, state.sync)


async def _spec(request: Request, site: str, source_id: str):
    spec = (await sources.definitions(request.app.state.bus, site)).get(source_id)
    if spec is None:
        raise NotFound(f"no source {source_id} in site {site}")
    return spec


@router.get("/sources")
async def list_sources(request: Request, site: SiteId):
    """The site's knowledge sources and how their runs went."""
    found = await sources.definitions(request.app.state.bus, site)
    return {"site": site, "sources": [await _view(request, site, spec) for spec in found.values()]}


@router.post("/sources", status_code=202)
async def add_source(request: Request, site: SiteId, who: Annotated[Operator, Depends(operator_of_site)]):
    """Define a website or text source and start its first run."""
    given = decode(await read_body(request, MAX_DEFINITION_BYTES), _decoder)
    spec = sources.spec_of(given)  # SourceError: a 422 naming each field (errors.py)
    bus = request.app.state.bus
    await sources.define(bus, site, spec, _actor(who))
    run, _ = await sources.request_sync(bus, site, spec.id, "added", _actor(who))
    return {"site": site, "source": spec.id, "run": run.turn}


@router.post("/uploads", status_code=202)
async def upload(request: Request, site: SiteId, who: Annotated[Operator, Depends(operator_of_site)],
                 name: Annotated[str, Query(min_length=1, max_length=200)]):
    """Store a file as a source (its bytes are the body) and sync it."""
    data = await read_body(request, sources.MAX_UPLOAD_BYTES)
    spec = sources.file_spec(name, len(data))
    spec = msgspec.structs.replace(spec, upload=sources.upload_key(site, spec.id, spec.name))
    bus = request.app.state.bus
    await sources.room_for(bus, site, spec)  # before the bytes are stored
    await sources.Staging(bus).upload(spec.upload, data)
    await sources.define(bus, site, spec, _actor(who))
    run, _ = await sources.request_sync(bus, site, spec.id, "added", _actor(who))
    return {"site": site, "source": spec.id, "run": run.turn, "name": spec.name, "bytes": len(data)}


@router.get("/sources/{source_id}")
async def show_source(request: Request, site: SiteId, source_id: SourceId):
    """The source, and its last run's pages."""
    spec = await _spec(request, site, source_id)
    view = await _view(request, site, spec)
    records = await request.app.state.bus.read(subjects.conv(site, sources.session_of(source_id), "page_fetched"))
    pages = [r.event for r in records if r.event.turn == view["run"]]
    view["pages"] = [{"url": p.url, "outcome": p.outcome, "title": p.title, "status": p.status, "reason": p.reason,
                      "chars": p.chars} for p in pages[:PAGES_SHOWN]]
    return {"site": site, "source": view}


@router.post("/sources/{source_id}/sync", status_code=202)
async def sync_source(request: Request, site: SiteId, source_id: SourceId,
                      who: Annotated[Operator, Depends(operator_of_site)]):
    """The source's next run (or the one still going)."""
    await _spec(request, site, source_id)
    run, new = await sources.request_sync(request.app.state.bus, site, source_id, "operator", _actor(who))
    return {"site": site, "source": source_id, "run": run.turn, "new": new}


@router.delete("/sources/{source_id}")
async def remove_source(request: Request, site: SiteId, source_id: SourceId,
                        who: Annotated[Operator, Depends(operator_of_site)]):
    """Remove the source: its pages leave the knowledge base."""
    await _spec(request, site, source_id)
    await sources.remove(request.app.state.bus, site, source_id, _actor(who))
    return {"site": site, "source": source_id, "removed": True}
