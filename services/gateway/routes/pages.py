"""The files the gateway serves (static/), not API (none is in /openapi.json): the demo page
`/`, the widget a site's pages embed `/widget.js`, and the operator UI `/admin`, a page
that asks for the operator's token and calls the operator API with it (operator.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

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
