"""The files the gateway serves (static/), not API (none is in /openapi.json): the demo page
`/`, the widget a site's pages embed `/widget.js`, and the operator console `/admin` (its
modules and styles under `/admin/`), which signs in (console.py) and calls the operator
API (operator.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from services.gateway.errors import NotFound

STATIC = Path(__file__).parent.parent / "static"
router = APIRouter(include_in_schema=False)


@router.get("/")
async def demo_page():
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/widget.js")
async def widget():
    return FileResponse(STATIC / "widget.js", media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=300"})


@router.get("/admin")
async def admin_page():
    return FileResponse(STATIC / "admin.html", media_type="text/html",
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})


CONSOLE_FILES = {p.name: p for p in (STATIC / "admin").iterdir() if p.suffix in (".js", ".css")}
MEDIA = {".js": "text/javascript", ".css": "text/css"}


@router.get("/admin/{name}")
async def admin_module(name: str):
    """The console's modules and styles (static/admin/: main.js loads the rest); nothing else."""
    path = CONSOLE_FILES.get(name)
    if path is None:
        raise NotFound(f"no console file {name}")
    return FileResponse(path, media_type=MEDIA[path.suffix],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
