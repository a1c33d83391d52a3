"""Sites as data: the write side of the `site_config` bucket (site_config.py is the read side).

Every change to a site goes through `SiteStore`, whoever asks (the operator API, the CLI,
the router's import of `sites/*.toml`):
- validated by `site_config.validate`, the check a file gets (422 / the CLI's errors list
  every field);
- written with a compare-and-set on the key's last revision: of two writers at once, the
  second reads the new config and applies its change to that, so neither change is lost;
- the registry record (`REGISTRY_KEY`, the sites the gateway waits for) kept in step:
  a new site is added after its config is written, a deleted one removed before its
  config goes, so the record never lists a site that is not there;
- audited: a `SiteChanged` event in the site's own log (session `SITE_SESSION`), naming
  who, the versions and the fields changed, never their values.
Every replica sees a change once its `SiteConfigs` copy is older than SITE_CONFIG_TTL_S.

The files stay as import and export. `SiteConfigSync` imports a file when its content
differs from what it last imported for that site (the `file.<site>` record), not merely
when the process starts: a site edited through the API keeps its edits across restarts
until its file is changed, and then the file wins (as one more version, audited). A file
removed takes its site with it only when the site was not edited since the import.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from shared import events as ev
from shared import subjects
from shared.bus import Bus
from shared.site_config import (REGISTRY_KEY, OperatorAccount, SiteConfig, SiteConfigError, content_version, parse,
                                site_of, validate)

log = logging.getLogger(__name__)

STREAM = f"KV_{subjects.SITE_CONFIG_BUCKET}"
FILE_RECORD = "file."  # + site: the version of the file last imported for the site
WRITE_ATTEMPTS = 8  # compare-and-set rounds before a write gives up (SiteConflict)
# A config is one message of the bus (its limit: 1 MiB) and every replica caches it: a site's
# own settings and texts, not a document store. Bigger: refused (422) naming the limit.
MAX_CONFIG_BYTES = 256 * 1024
KEY_PREFIX = "ck_"  # a site's operator key: ck_<site>_<secret> (services/gateway/operators.py)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SiteConfig)
_list_decoder = msgspec.json.Decoder(list[str])
_DEFAULTS = msgspec.to_builtins(SiteConfig())


class SiteNotFound(LookupError):
    pass


class SiteExists(Exception):
    pass


class SiteConflict(Exception):
    """Other writers kept changing the site while this change was tried WRITE_ATTEMPTS times."""


class Change(msgspec.Struct, frozen=True):
    """What a write did: the config now (None: deleted), and its audit event (None: the
    content was already so, nothing written)."""

    config: SiteConfig | None
    event: ev.SiteChanged | None = None


# --- the data of a config: its export, a patch applied to it ------------------------------

def as_data(config: SiteConfig) -> dict[str, Any]:
    """Every field, defaults included, as plain data (what the API shows and a form edits)."""
    data = msgspec.to_builtins(config)
    data.pop("version", None)
    return data


def exported(config: SiteConfig) -> dict[str, Any]:
    """Only what differs from the defaults (`concierge sites export`): a file that says what
    the site chose, and takes later changes of the defaults."""
    return _without_defaults(as_data(config), _DEFAULTS)


def _without_defaults(value: Any, default: Any) -> Any:
    if not isinstance(value, dict) or not isinstance(default, dict):
        return value
    return {k: _without_defaults(v, default.get(k)) for k, v in value.items() if k not in default or v != default[k]}


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`patch` applied to `base` as a JSON merge patch (RFC 7396): tables merge key by key,
    anything else (lists included) is replaced, and null puts a key back to its default."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def changed_fields(before: SiteConfig | None, after: SiteConfig | None) -> list[str]:
    """The dotted names of the fields that differ (tables by key, lists whole)."""
    return sorted(_diff(as_data(before or SiteConfig()), as_data(after or SiteConfig()), ""))


def _diff(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [name for key in {**a, **b} for name in _diff(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if a != b else []


def new_key(site: str) -> str:
    return f"{KEY_PREFIX}{site}_{secrets.token_hex(24)}"  # hex: no '_' in the secret part


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# --- the store ------------------------------------------------------------------------------

class SiteStore:
    def __init__(self, bus: Bus):
        self.bus = bus
        self._kv = None

    async def _bucket(self):
        if self._kv is None:
            self._kv = await self.bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
        return self._kv

    async def read(self, site: str) -> SiteConfig | None:
        """The site's config as the bucket has it now (no cache: what an edit starts from)."""
        return (await self._current(site))[0]

    async def _current(self, site: str) -> tuple[SiteConfig | None, int]:
        """The config and the key's last revision (a deletion's marker has one too; 0: never
        written), what a compare-and-set names."""
        try:
            msg = await self.bus.js.get_msg(STREAM, subject=f"$KV.{subjects.SITE_CONFIG_BUCKET}.{site}")
        except NotFoundError:
            return None, 0
        if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            return None, msg.seq
        return _decoder.decode(msg.data), msg.seq

    async def put(self, site: str, data: dict[str, Any], actor: str, may_create: bool = True,
                  must_create: bool = False) -> Change:
        """The site's whole config replaced by `data` (validated), or created with it when
        `may_create`. SiteNotFound / SiteExists when it is not as asked."""

        def edit(current: SiteConfig | None) -> SiteConfig:
            if current is None and not may_create:
                raise SiteNotFound(site)
            if current is not None and must_create:
                raise SiteExists(site)
            return validate(data)

        return await self._change(site, edit, actor)

    async def patch(self, site: str, patch: dict[str, Any], actor: str) -> Change:
        """`patch` applied to the site's config as a merge patch (`merged`), validated."""

        def edit(current: SiteConfig | None) -> SiteConfig:
            if current is None:
                raise SiteNotFound(site)
            try:
                return validate(merged(as_data(current), patch))
            except RecursionError:
                raise SiteConfigError("the patch is nested too deeply") from None

        return await self._change(site, edit, actor)

    async def delete(self, site: str, actor: str) -> Change:
        def edit(current: SiteConfig | None) -> None:
            if current is None:
                raise SiteNotFound(site)
            return None

        return await self._change(site, edit, actor)

    async def add_key(self, site: str, actor: str, operator: str = "") -> tuple[str, Change]:
        """A new operator key for the site: the key (shown once), its SHA-256 added to the
        config (the key itself is stored nowhere): to `operator_key_sha256`, or, for a named
        `operator`, as their account in `operators` (a new key for a known name replaces its old one)."""
        key = new_key(site)

        def edit(current: SiteConfig | None) -> SiteConfig:
            if current is None:
                raise SiteNotFound(site)
            if operator:
                others = [a for a in current.operators if a.name.casefold() != operator.casefold()]
                return msgspec.structs.replace(current, operators=[
                    *others, OperatorAccount(name=operator, key_sha256=key_sha256(key))])
            return msgspec.structs.replace(current, operator_key_sha256=[*current.operator_key_sha256,
                                                                          key_sha256(key)])

        return key, await self._change(site, edit, actor)

    async def _change(self, site: str, edit: Callable[[SiteConfig | None], SiteConfig | None], actor: str,
                      keep_version: bool = False) -> Change:
        """`edit` applied to the site's current config and written if it changed anything,
        with a compare-and-set (read again and `edit` again when another writer came first).
        `keep_version`: the version `edit` set (a file's hash), else the content's."""
        kv = await self._bucket()
        for _ in range(WRITE_ATTEMPTS):
            current, revision = await self._current(site)
            wanted = edit(current)
            if wanted is not None and not keep_version:
                wanted = msgspec.structs.replace(wanted, version=content_version(wanted))
            if wanted is not None and (size := len(_encoder.encode(wanted))) > MAX_CONFIG_BYTES:
                raise SiteConfigError(f"the config would be {size} bytes: at most {MAX_CONFIG_BYTES}")
            if wanted is None and current is None:
                return Change(None)
            if wanted is not None and current is not None and content_version(wanted) == content_version(current):
                return Change(current)
            try:
                if wanted is None:
                    await self.register(remove={site})
                    await kv.delete(site, last=revision)
                else:
                    revision = await kv.update(site, _encoder.encode(wanted), last=revision)
            except KeyWrongLastSequenceError:
                continue
            event = ev.SiteChanged(
                event_id=ev.derived_id(f"{site}:{revision}", "site-store", "deleted" if wanted is None else "written"),
                site=site, session_id=ev.SITE_SESSION, turn=0, ts=ev.now(), producer="site-store",
                change="deleted" if wanted is None else "created" if current is None else "updated",
                version=wanted.version if wanted else "", previous_version=current.version if current else "",
                fields_changed=changed_fields(current, wanted), actor=actor)
            await self.bus.publish(event)
            if current is None:
                await self.register(add={site})
            log.info("site changed", extra={"site_id": site, "change": event.change, "version": event.version,
                                            "actor": actor})
            return Change(wanted, event)
        raise SiteConflict(f"site {site} kept changing while this change was tried; try again")

    async def register(self, add: set[str] = frozenset(), remove: set[str] = frozenset()) -> None:
        """The registry record with `add` in and `remove` out (written when that changes it,
        or when it does not exist yet: then the sites are loaded)."""
        kv = await self._bucket()
        for _ in range(WRITE_ATTEMPTS):
            try:
                entry = await kv.get(REGISTRY_KEY)
                listed, revision = _list_decoder.decode(entry.value), entry.revision
            except KeyNotFoundError:
                listed, revision = None, 0
            wanted = sorted((set(listed or ()) | add) - remove)
            if listed is not None and wanted == sorted(listed):
                return
            try:
                await kv.update(REGISTRY_KEY, _encoder.encode(wanted), last=revision)
                return
            except KeyWrongLastSequenceError:
                continue
        raise SiteConflict("the site registry kept changing; try again")

    async def versions(self, site: str) -> list[dict[str, Any]]:
        """The site's configs the bucket keeps (shared/bus.py SITE_CONFIG_HISTORY), newest
        first, each with the change that made it when the site's log has it (or a deletion)."""
        made_by = {record.event.version: record.event  # the latest change that made each version
                   for record in await self.bus.read(subjects.conv(site, ev.SITE_SESSION, "site_changed"))
                   if record.event.change != "deleted"}
        out = []
        seq, subject = 1, f"$KV.{subjects.SITE_CONFIG_BUCKET}.{site}"
        while True:
            try:
                msg = await self.bus.js.get_msg(STREAM, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            seq = msg.seq + 1
            if not msg.data:  # a deletion's marker
                out.append({"revision": msg.seq, "deleted": True, "version": "", "config": None})
                continue
            config = _decoder.decode(msg.data)
            out.append({"revision": msg.seq, "deleted": False, "version": config.version, "config": as_data(config),
                        "change": _change_summary(made_by.get(config.version))})
        return out[::-1]

    # --- the files' import (SiteConfigSync) ----------------------------------------------------

    async def _file_record(self, site: str) -> str | None:
        try:
            entry = await (await self._bucket()).get(FILE_RECORD + site)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry is not None and entry.value else None

    async def import_file(self, site: str, config: SiteConfig, path: Path) -> str:
        """The file's config (parsed: its version is the file's hash) in the bucket, unless
        this content was imported already. "loaded" or "unchanged"."""
        if await self._file_record(site) == config.version:  # the site may have been edited since: the edit stays
            if await self.read(site) is None:
                return "not imported: deleted through the API since; change the file to import it again"
            return "unchanged"

        def edit(current: SiteConfig | None) -> SiteConfig:
            return current if current is not None and current.version == config.version else config

        change = await self._change(site, edit, f"file:{path}", keep_version=True)
        await (await self._bucket()).put(FILE_RECORD + site, config.version.encode())
        return "loaded" if change.event else "unchanged"

    async def forget_file(self, site: str, path: Path) -> str:
        """The site's file was removed: the site goes too, unless it was edited through the
        API since the file was imported. "removed" or "kept: …"."""
        imported = await self._file_record(site)
        await (await self._bucket()).delete(FILE_RECORD + site)
        current = await self.read(site)
        if current is not None and imported is not None and current.version != imported:
            return "kept: changed through the API since its file was imported; delete it there"
        try:
            await self.delete(site, f"file:{path}")
        except SiteNotFound:
            pass
        return "removed"


def _change_summary(event: ev.SiteChanged | None) -> dict[str, Any] | None:
    if event is None:
        return None
    return {"change": event.change, "actor": event.actor, "ts": event.ts, "fields_changed": event.fields_changed,
            "previous_version": event.previous_version}


async def register_no_sites(bus: Bus) -> None:
    """A deployment without site files: the registry is loaded (empty, unless sites were
    made through the API)."""
    await SiteStore(bus).register()


class SiteConfigSync:
    """Files → bucket (`SiteStore.import_file`). Runs at start and then every `poll_s`; only
    files whose time changed are read again, and only a content not imported before is
    written."""

    def __init__(self, bus: Bus, directory: Path, poll_s: float = 1.0):
        self.store = SiteStore(bus)
        self.directory = directory
        self.poll_s = poll_s
        self._mtimes: dict[Path, float] = {}
        self._task: asyncio.Task | None = None
        self.errors: dict[str, str] = {}  # file → last error, for tests and /readyz-style checks
        self._registered = False  # the registry record written once by this process

    async def sync_once(self) -> dict[str, str]:
        """One pass; returns {site: "loaded" | "unchanged" | "refused: …" | "removed" | "kept: …" |
        "not imported: …"}."""
        result: dict[str, str] = {}
        served: set[str] = set()
        present = set()
        for path in sorted(self.directory.glob("*.toml")):
            present.add(path)
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            if self._mtimes.get(path) == mtime:
                continue
            self._mtimes[path] = mtime
            try:
                site = site_of(path)
                config = parse(path)
            except SiteConfigError as exc:
                self.errors[str(path)] = str(exc)
                result[path.stem] = f"refused: {exc}"
                log.error("site config refused; the last good config stays active", extra={"error": str(exc)})
                if subjects.TOKEN_RE.match(path.stem) and await self.store.read(path.stem) is not None:
                    served.add(path.stem)
                continue
            self.errors.pop(str(path), None)
            result[site] = await self.store.import_file(site, config, path)
            if result[site] in ("loaded", "unchanged"):
                served.add(site)
            if result[site] == "loaded":
                log.info("site config loaded", extra={"site_id": site, "file": str(path), "version": config.version})
        for path in list(self._mtimes):
            if path not in present:
                del self._mtimes[path]
                self.errors.pop(str(path), None)
                if not subjects.TOKEN_RE.match(path.stem):
                    continue  # refused for its name: nothing of it is in the bucket
                result[path.stem] = await self.store.forget_file(path.stem, path)
                log.info("site config file removed", extra={"site_id": path.stem, "outcome": result[path.stem]})
        if served or not self._registered:  # the sites the store removed it has unregistered
            await self.store.register(add=served)
            self._registered = True
        return result

    async def start(self) -> None:
        await self.sync_once()
        self._task = asyncio.create_task(self._poll(), name="site-config-sync")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync_once()
            except Exception:  # noqa: BLE001 - a bus hiccup must not end the watch
                log.exception("site config sync failed; retrying")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
