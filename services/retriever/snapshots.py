"""A site's knowledge-base snapshot on the bus: how ingestion hands a site's graph and
key-value files to every retriever replica, with no volume shared between them.

With a Qdrant server the vectors are already shared; what a replica lacks is the rest of
`KB_DIR/<site>/` (LightRAG's graph and key-value files, documents.json). With
KB_SNAPSHOTS=bus, `concierge ingest` (and `concierge docs delete`) first makes its own
`KB_DIR/<site>/` the published snapshot, changes it, then publishes the result; every
retriever replica loads each site's snapshot at start and again whenever a new version
appears (`Follower`), into a directory of its own, and swaps it in (knowledge.py `load`).

The JetStream object store bucket `kb_snapshots` holds, per site:

    <site>             the current snapshot's manifest (JSON: site, version, created_at,
                       archive, files with size and sha256)
    <site>/<version>   the archive: tar.gz of manifest.json and files/<path>; the newest
                       KB_SNAPSHOT_HISTORY archives are kept, older ones deleted

The version is a hash of the files' paths and contents, so the same files are the same
version and publishing them again writes nothing. The archive is written before the
manifest that names it: a replica never sees a version it cannot fetch. Unpacking checks
every file against the version before the snapshot is used.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import msgspec
import nats.errors
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from shared import subjects
from shared.bus import Bus, object_store

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FILES = "files/"
# Written by LightRAG and knowledge.py beside a file while replacing it; never content.
TEMPORARY_SUFFIXES = (".tmp",)


class SnapshotError(Exception):
    """A snapshot that cannot be used: damaged, or not what its manifest says."""


class FileEntry(msgspec.Struct, frozen=True):
    path: str
    size: int
    sha256: str


class Manifest(msgspec.Struct, kw_only=True, frozen=True):
    site: str
    version: str
    created_at: float
    files: list[FileEntry]

    @property
    def archive(self) -> str:
        return f"{self.site}/{self.version}"


# --- the store ----------------------------------------------------------------------------


async def open_store(bus: Bus, history: int = 3) -> "SnapshotStore":
    """The `kb_snapshots` object store, keeping the newest `history` archives per site
    (KB_SNAPSHOT_HISTORY, in `SnapshotSettings`)."""
    return SnapshotStore(await object_store(bus, subjects.KB_SNAPSHOT_BUCKET), history=history)


# --- files and archives (pure, no bus) ------------------------------------------------------


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.endswith(TEMPORARY_SUFFIXES))


def describe(site: str, directory: Path) -> Manifest:
    """The manifest of a site's files as they are now in `directory`."""
    entries, overall = [], hashlib.sha256()
    for path in _files(directory):
        data = path.read_bytes()
        entry = FileEntry(path.relative_to(directory).as_posix(), len(data), hashlib.sha256(data).hexdigest())
        entries.append(entry)
        overall.update(f"{entry.path}\0{entry.sha256}\n".encode())
    return Manifest(site=site, version=overall.hexdigest()[:20], created_at=time.time(), files=entries)


def pack(site: str, directory: Path) -> tuple[Manifest, bytes]:
    manifest = describe(site, directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        _add(tar, MANIFEST, msgspec.json.encode(manifest))
        for entry in manifest.files:
            _add(tar, FILES + entry.path, (directory / entry.path).read_bytes())
    return manifest, buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def unpack(data: bytes, directory: Path) -> Manifest:
    """Write an archive's files into `directory` (empty or missing) and check them against
    its manifest. Only regular files under files/ that stay inside `directory` are taken
    (no links, no absolute paths, no `..` out)."""
    root = directory.resolve()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            manifest = msgspec.json.decode(tar.extractfile(MANIFEST).read(), type=Manifest)
            directory.mkdir(parents=True, exist_ok=True)
            for member in tar.getmembers():
                if not (member.isfile() and member.name.startswith(FILES)):
                    continue
                target = (root / member.name[len(FILES):]).resolve()
                if not target.is_relative_to(root) or target == root:
                    raise SnapshotError(f"snapshot member {member.name!r} points outside its directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, KeyError, AttributeError, msgspec.DecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot archive: {type(exc).__name__}: {exc}") from exc
    found = describe(manifest.site, directory)
    if found.version != manifest.version or found.files != manifest.files:
        raise SnapshotError(f"snapshot {manifest.archive}: its files do not match its manifest "
                            f"(version {found.version})")
    return manifest


# --- the bucket ---------------------------------------------------------------------------


class SnapshotStore:
    def __init__(self, objects: ObjectStore, history: int = 3):
        self.objects = objects
        self.history = history

    async def current(self, site: str) -> Manifest | None:
        try:
            result = await self.objects.get(site)
        except ObjectNotFoundError:
            return None
        try:
            return msgspec.json.decode(result.data, type=Manifest)
        except msgspec.DecodeError as exc:
            raise SnapshotError(f"snapshot manifest of {site}: {exc}") from exc

    async def digests(self) -> dict[str, str]:
        """{site: digest of its manifest object}, for every site with a snapshot."""
        try:
            infos = await self.objects.list(ignore_deletes=True)
        except NotFoundError:  # an empty bucket
            return {}
        return {i.name: i.digest for i in infos if "/" not in i.name and not i.deleted}

    async def fetch(self, manifest: Manifest) -> bytes:
        try:
            return (await self.objects.get(manifest.archive)).data
        except ObjectNotFoundError as exc:
            raise SnapshotError(f"snapshot {manifest.archive} is named by its manifest but missing") from exc

    async def publish(self, site: str, directory: Path) -> tuple[Manifest, bool]:
        """Publish the site's files in `directory` as its current snapshot: (manifest,
        whether a new version was written). The same files as the current version: nothing."""
        manifest, data = await asyncio.get_running_loop().run_in_executor(None, pack, site, directory)
        current = await self.current(site)
        if current is not None and current.version == manifest.version:
            return current, False
        await self.objects.put(manifest.archive, data)
        await self.objects.put(site, msgspec.json.encode(manifest))
        await self._prune(site, keep=manifest.archive)
        return manifest, True

    async def _prune(self, site: str, keep: str) -> None:
        infos = await self.objects.list(ignore_deletes=True)
        archives = sorted((i for i in infos if i.name.startswith(f"{site}/") and i.name != keep and not i.deleted),
                          key=lambda i: i.mtime or "", reverse=True)
        for info in archives[self.history - 1:]:
            await self.objects.delete(info.name)

    async def restore(self, site: str, directory: Path) -> Manifest | None:
        """Make `directory` hold the site's current snapshot (ingestion, before it changes
        the site: its KB_DIR may be new and empty, as in a Kubernetes Job). Files already
        the current version are left as they are; with no snapshot, so is the directory."""
        manifest = await self.current(site)
        if manifest is None:
            return None
        if directory.exists() and describe(site, directory).version == manifest.version:
            return manifest
        data = await self.fetch(manifest)
        directory.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{site}-", dir=directory.parent))
        try:
            unpack(data, fresh)
        except SnapshotError:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        if directory.exists():
            old = directory.with_name(f".{site}-replaced-{manifest.version}")
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
            fresh.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            fresh.rename(directory)
        return manifest


# --- the retriever's side -----------------------------------------------------------------


class Follower:
    """Keeps a retriever's knowledge base on the published snapshots: `sync` at start, then
    every KB_SNAPSHOT_POLL_S. A poll lists the bucket's manifests (a fresh read each time,
    so a reconnect or a missed update costs at most one interval); a site whose manifest
    changed is unpacked into a directory of its own under KB_DIR/snapshots/ and swapped in
    at once when the retriever holds it open, and otherwise when it is next asked (the
    knowledge base's `defer`/`ready`: a start downloads nothing). A site whose snapshot
    cannot be loaded keeps the version it had and is tried again next poll (or next ask)."""

    def __init__(self, store: SnapshotStore, kb, poll_s: float = 5.0):
        self.store = store
        self.kb = kb
        self.poll_s = poll_s
        self.versions: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._dir = Path(kb.root) / "snapshots"
        self._task: asyncio.Task | None = None

    async def sync(self) -> None:
        digests = await self.store.digests()
        for site, digest in digests.items():
            if self._digests.get(site) == digest or not subjects.TOKEN_RE.match(site):
                continue
            if not self.kb.is_open(site):
                # Fetched when the site is next asked (KnowledgeBase.ready): a replica keeps on
                # disk and in memory only the sites it serves.
                self.kb.defer(site, lambda site=site: self._fetch_deferred(site))
                self._digests[site] = digest
                continue
            try:
                await self._follow(site)
            except (SnapshotError, OSError) as exc:
                log.error("knowledge-base snapshot not loaded", extra={"site": site, "error": str(exc)})
                continue
            self._digests[site] = digest
        for site in set(self._digests) - set(digests):
            log.info("knowledge-base snapshot withdrawn", extra={"site": site})
            await self.kb.unload(site)
            self._digests.pop(site)
            self.versions.pop(site, None)

    async def _follow(self, site: str) -> None:
        fetched = await self._fetch(site)
        if fetched is None:
            return
        directory, version = fetched
        try:
            await self.kb.load(site, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._loaded(site, version)

    async def _fetch_deferred(self, site: str) -> Path | None:
        """What the knowledge base calls when a deferred site is next used: its directory
        (loaded by the caller), None when there is nothing newer."""
        fetched = await self._fetch(site)
        if fetched is None:
            return None
        self._loaded(site, fetched[1])
        return fetched[0]

    def _loaded(self, site: str, version: str) -> None:
        self.versions[site] = version
        log.info("knowledge-base snapshot loaded", extra={"site": site, "version": version})

    async def _fetch(self, site: str) -> tuple[Path, str] | None:
        """The site's current snapshot unpacked into a directory of its own, with its
        version, or None when this replica has that version already (or the site has none)."""
        manifest = await self.store.current(site)
        if manifest is None or manifest.version == self.versions.get(site):
            return None
        data = await self.store.fetch(manifest)
        self._dir.mkdir(parents=True, exist_ok=True)
        # A directory per load: its name is also the LightRAG workspace, which LightRAG's
        # in-memory tables are keyed by, so no two loads ever share them.
        directory = Path(tempfile.mkdtemp(prefix=f"{site}@{manifest.version}-", dir=self._dir))
        try:
            await asyncio.get_running_loop().run_in_executor(None, unpack, data, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return directory, manifest.version

    async def publish(self, site: str) -> None:
        """This replica changed `site` (a knowledge source's sync run): the files it serves
        the site from become the site's snapshot, which the other replicas load; this one
        keeps serving its own (LightRAG wrote them out at the end of each insert)."""
        manifest, _ = await self.store.publish(site, self.kb.site_directory(site))
        self.versions[site] = manifest.version
        self._digests.pop(site, None)  # the next poll records the new manifest's digest

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except (nats.errors.Error, asyncio.TimeoutError, SnapshotError) as exc:
                log.warning("knowledge-base snapshots not checked; next poll retries",
                            extra={"error": f"{type(exc).__name__}: {exc}"})

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self.run(), name="kb-snapshots")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
