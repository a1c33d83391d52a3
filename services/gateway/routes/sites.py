"""The site itself, for operators (under the operator prefix: operator.py): its config, made,
changed and deleted through shared/site_store.py (checked as a file is, versioned in the
`site_config` bucket, audited as a `SiteChanged` in the site's log).

- `GET    /v1/admin/sites/{site}`: the config (every field), its version, the embed snippet;
- `PUT    /v1/admin/sites/{site}`: the whole config (the file's keys, as JSON): creates the
  site (201; ADMIN_TOKEN only, a site key gets 403) or replaces its config (200);
- `PATCH  /v1/admin/sites/{site}`: a JSON merge patch (tables merge, lists are replaced, null
  puts a key back to its default);
- `DELETE /v1/admin/sites/{site}`: ADMIN_TOKEN only (403 for a site key);
- `GET    versions`: the configs the bucket keeps, newest first, with who made each;
- `POST   install-check` (`{"url": PAGE}`): whether that page of the site embeds its widget,
  from an origin the site allows (install_check.py);
- `POST   keys`: a new operator key for the site, in the answer only; its SHA-256 joins
  `operator_key_sha256`, or, with `{"operator": NAME}`, is that named operator's account
  (`operators`).

A config that does not validate is a 422 listing every field's problem (errors.py); a site
key sees only its own site (404 for any other, as for everything under the prefix).
"""

from __future__ import annotations

import html
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from services.gateway import install_check
from services.gateway.access import operator_of_site
from services.gateway.errors import Conflict, NotFound, RateLimited
from services.gateway.openapi import SITE_OPENAPI, SITE_PATCH_OPENAPI, SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import RequestError, decode, read_body
from shared.site_config import OPERATOR_NAME_RE, SiteConfig
from shared.site_store import SiteConflict, SiteNotFound, SiteStore, as_data, key_sha256

router = APIRouter()
Who = Annotated[Operator, Depends(operator_of_site)]
_object = msgspec.json.Decoder(dict[str, Any])
NO_STORE = {"Cache-Control": "no-store"}


def snippet(request: Request, site: str) -> str:
    """What a page embeds to show the site's widget (as the demo page does)."""
    base = str(request.base_url).rstrip("/")
    return f'<script src="{html.escape(base)}/widget.js" data-site="{html.escape(site)}"></script>'


def shown(request: Request, site: str, config: SiteConfig) -> dict[str, Any]:
    return {"site": site, "version": config.version, "config": as_data(config), "snippet": snippet(request, site),
            "widget_settings_url": f"{str(request.base_url).rstrip('/')}/v1/sites/{site}/widget"}


def _store(request: Request) -> SiteStore:
    return SiteStore(request.app.state.bus)


def _changed(request: Request, site: str) -> None:
    """This gateway reads its own change at once (its cached copy dropped)."""
    request.app.state.sites.forget(site)


async def _body(request: Request) -> dict[str, Any]:
    return decode(await read_body(request, request.app.state.settings.max_body_bytes), _object)


def _admin_only(who: Operator, what: str) -> None:
    if who.site is not None:
        raise RequestError(None, f"{what} needs the deployment's ADMIN_TOKEN, not a site key", status=403)


def _not_named(who: Operator, what: str) -> None:
    """A named operator's key answers handoffs; the site's settings (its keys among them) are for
    the site's shared key and ADMIN_TOKEN."""
    if who.name:
        raise RequestError(None, f"{what} needs the site's key or ADMIN_TOKEN, not {who.name}'s own key", status=403)


@router.get("")
async def show_site(request: Request, site: SiteId):
    """The site's config (every field, defaults included), its version and its embed snippet."""
    config = await _store(request).read(site)
    if config is None:
        raise NotFound(f"no site {site}")
    return JSONResponse(shown(request, site, config), headers=NO_STORE)


@router.put("", openapi_extra=SITE_OPENAPI, responses={201: {"description": "the site was created"}})
async def put_site(request: Request, site: SiteId, who: Who):
    """Create the site with this config (ADMIN_TOKEN), or replace its config."""
    _not_named(who, "changing the site")
    data = await _body(request)
    try:
        change = await _store(request).put(site, data, who.actor, may_create=who.site is None)
        _changed(request, site)
    except SiteNotFound:  # a site key's site, deleted since the key was checked
        raise RequestError(None, "creating a site needs the deployment's ADMIN_TOKEN, not a site key",
                           status=403) from None
    except SiteConflict as exc:
        raise Conflict(str(exc)) from None
    created = change.event is not None and change.event.change == "created"
    return JSONResponse(shown(request, site, change.config), status_code=201 if created else 200, headers=NO_STORE)


@router.patch("", openapi_extra=SITE_PATCH_OPENAPI)
async def patch_site(request: Request, site: SiteId, who: Who):
    """Change some of the site's settings: a JSON merge patch, e.g. `{"widget": {"primary_color": "#0a7"}}`."""
    _not_named(who, "changing the site")
    patch = await _body(request)
    try:
        change = await _store(request).patch(site, patch, who.actor)
        _changed(request, site)
    except SiteNotFound:
        raise NotFound(f"no site {site}") from None
    except SiteConflict as exc:
        raise Conflict(str(exc)) from None
    return JSONResponse(shown(request, site, change.config), headers=NO_STORE)


@router.delete("")
async def delete_site(request: Request, site: SiteId, who: Who):
    """Delete the site (ADMIN_TOKEN): the gateway stops serving it once the replicas' copies
    expire; its log and its earlier configs stay."""
    _admin_only(who, "deleting a site")
    try:
        change = await _store(request).delete(site, who.actor)
        _changed(request, site)
    except SiteNotFound:
        raise NotFound(f"no site {site}") from None
    except SiteConflict as exc:
        raise Conflict(str(exc)) from None
    return {"site": site, "deleted": change.event.previous_version}


@router.get("/versions")
async def site_versions(request: Request, site: SiteId):
    """The site's configs the bucket keeps (the last 64), newest first, each with the change
    that made it (who, when, which fields) when the site's log has it."""
    versions = await _store(request).versions(site)
    if not versions:
        raise NotFound(f"no site {site}")
    return JSONResponse({"site": site, "versions": versions}, headers=NO_STORE)


class KeyFor(msgspec.Struct, forbid_unknown_fields=True):
    operator: Annotated[str, msgspec.Meta(pattern=OPERATOR_NAME_RE.pattern)] = ""


_key_for = msgspec.json.Decoder(KeyFor)


@router.post("/keys", status_code=201)
async def make_key(request: Request, site: SiteId, who: Who):
    """A new operator key for the site, returned once: only its SHA-256 is stored (added to
    `operator_key_sha256`; remove an entry with PATCH to retire a key). With a body
    `{"operator": NAME}`, a named operator's key instead (their account in `operators`,
    replacing an older key of the same name): what they do in a handoff is theirs. A key
    works at once on the gateway that made it, on the other replicas once their copies of the
    config expire (SITE_CONFIG_TTL_S)."""
    _not_named(who, "making a key")
    raw = await read_body(request, 1024)
    body = decode(raw, _key_for) if raw.strip() else KeyFor()
    try:
        key, change = await _store(request).add_key(site, who.actor, body.operator)
        _changed(request, site)
    except SiteNotFound:
        raise NotFound(f"no site {site}") from None
    except SiteConflict as exc:
        raise Conflict(str(exc)) from None
    digest = key_sha256(key)
    return JSONResponse({"site": site, "key": key, "sha256": digest, "operator": body.operator,
                         "version": change.config.version}, status_code=201, headers=NO_STORE)


class InstallCheck(msgspec.Struct, forbid_unknown_fields=True):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]


_install_check = msgspec.json.Decoder(InstallCheck)


@router.post("/install-check")
async def check_install(request: Request, site: SiteId):
    """Fetch a page of the site (`{"url": ...}`) and say whether it embeds this site's widget
    and whether its origin is one the site allows: `ok`, and each problem in words."""
    config = await _store(request).read(site)
    if config is None:
        raise NotFound(f"no site {site}")
    wait = await request.app.state.install_check_limiter.retry_after(site, None)
    if wait is not None:
        raise RateLimited(wait)
    body = decode(await read_body(request, 4096), _install_check)
    parts = urlsplit(body.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RequestError("url", "an http or https URL of a page of the site")
    result = await install_check.check(request.app.state.web, body.url, site, config, request.headers.get("host"))
    return JSONResponse({"site": site, **result}, headers=NO_STORE)
