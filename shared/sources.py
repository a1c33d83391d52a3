"""A site's knowledge sources, as the operator API, the CLI and the scheduler use them:
defining a source, asking for a sync run, reading what the sources are and how their runs
went, and the object stores that hold uploaded files and a run's staged page texts.

A source's log is the session `ev.SOURCE_PREFIX + id` of the site (shared/events.py): turn 0
its definition (`SourceAdded`, `SourceRemoved`), turn N its N-th run (`SyncRequested`, then
the retriever's `SyncStarted`, `PageFetched`…, `SyncCompleted` or `SyncFailed`). Ids derive
from what they name, so the same URL added twice is one source redefined, and two requests
for the same next run are one run (JetStream drops the second as a duplicate).

    kb_staging  <site>/<source>/<run>/<URL hash>      a changed page (`StagedPage`), until its run is applied
    kb_uploads  <site>/<source>/<file name>            an uploaded file's bytes, as long as its source
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata
from urllib.parse import urlsplit

import msgspec
from nats.js.errors import NotFoundError, ObjectNotFoundError

from shared import events as ev
from shared import subjects
from shared.bus import Bus, object_store

STAGING_BUCKET = "kb_staging"
UPLOADS_BUCKET = "kb_uploads"
MAX_PAGES_LIMIT = 5000  # a run's page limit at most (its progress is folded from the log)
MIN_EVERY_S = 3600.0  # the shortest schedule: once an hour
MAX_TEXT_CHARS = 200_000
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
# One site's share of a deployment: its sources (websites, files, texts, curated answers) and
# the pages its websites may hold, their page limits summed. Past them: a 422 naming the cap.
MAX_SOURCES = 500
MAX_SITE_PAGES = 20_000
UPLOAD_SUFFIXES = (".pdf", ".docx", ".pptx", ".html", ".htm", ".md", ".markdown", ".txt")
EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


class SourceError(ValueError):
    """A source definition refused: `errors` is [{"field", "message"}], one per problem."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


class SourceInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What an operator sends to define a source: a website (`url`), or a text snippet
    (`title`, `text`). Files come as uploads."""

    url: str = ""
    every: str | float | None = None  # "24h", "30m", "2d", seconds; none: on demand only
    include: list[str] = []
    exclude: list[str] = []
    max_pages: int = 500
    title: str = ""
    text: str = ""


def every_seconds(value: str | float | None) -> float:
    """Seconds of a schedule like "24h" (s, m, h, d; a bare number is seconds); 0 for none."""
    if value in (None, "", 0):
        return 0.0
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = EVERY.match(value)
        if not match:
            raise ValueError(f"{value!r}: use a number with s, m, h or d (e.g. 24h)")
        seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if seconds < MIN_EVERY_S:
        raise ValueError(f"at least {int(MIN_EVERY_S // 60)} minutes between syncs")
    return seconds


def _id(kind: str, key: str) -> str:
    return f"{kind}-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def spec_of(given: SourceInput) -> ev.SourceSpec:
    """The source `given` defines, or SourceError naming every field that is wrong."""
    errors: list[dict[str, str]] = []

    def bad(field: str, message: str) -> None:
        errors.append({"field": field, "message": message})

    if bool(given.url) == bool(given.text):
        bad("url" if not given.text else "text", "give either a website's url or a text snippet")
    every = 0.0
    try:
        every = every_seconds(given.every)
    except ValueError as exc:
        bad("every", str(exc))
    for name, patterns in (("include", given.include), ("exclude", given.exclude)):
        for i, pattern in enumerate(patterns):
            if not pattern.startswith("/") or len(pattern) > 200:
                bad(f"{name}[{i}]", "a path pattern starting with / (e.g. /blog/*), at most 200 characters")
    if not 1 <= given.max_pages <= MAX_PAGES_LIMIT:
        bad("max_pages", f"between 1 and {MAX_PAGES_LIMIT}")
    if given.url:
        parts = urlsplit(given.url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or len(given.url) > 2000:
            bad("url", "an http or https URL of a start page or a sitemap")
        elif parts.username or parts.password:
            bad("url", "no user name or password in the URL")
    if given.text:
        if not given.title.strip() or len(given.title) > 200:
            bad("title", "a text snippet needs a title (at most 200 characters)")
        if len(given.text) > MAX_TEXT_CHARS:
            bad("text", f"at most {MAX_TEXT_CHARS} characters")
    if errors:
        raise SourceError(errors)
    if given.url:
        url = given.url.strip()
        return ev.SourceSpec(id=_id("web", url), kind="website", url=url, include=list(given.include),
                             exclude=list(given.exclude), max_pages=given.max_pages, every_s=every)
    return ev.SourceSpec(id=_id("text", given.title.strip()), kind="text", title=given.title.strip(), text=given.text,
                         every_s=every)


CURATED_PREFIX = "answer-"  # a curated answer's source id (shared/gaps.py finds them by it)
MAX_QUESTION_CHARS = 200


class CuratedInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An operator's answer to a question visitors ask (a knowledge gap's, or any turn's)."""

    question: str
    answer: str


def curated_spec(given: CuratedInput) -> ev.SourceSpec:
    """The text source a curated answer is: titled with its question, so retrieval finds it
    for that question and an answer cites it like any page (by that title, as pages with no
    web address are); the same question again redefines it (its id derives from the question)."""
    question, answer = " ".join(given.question.split()), given.answer.strip()
    errors = []
    if not 3 <= len(question) <= MAX_QUESTION_CHARS:
        errors.append({"field": "question", "message": f"the question, 3 to {MAX_QUESTION_CHARS} characters"})
    if not answer or len(answer) > MAX_TEXT_CHARS:
        errors.append({"field": "answer", "message": f"the answer, 1 to {MAX_TEXT_CHARS} characters"})
    if errors:
        raise SourceError(errors)
    return ev.SourceSpec(id=CURATED_PREFIX + _id("q", question.lower())[2:], kind="text", title=question,
                         text=answer)


def curated_answers(specs: dict[str, ev.SourceSpec]) -> list[tuple[str, str]]:
    """(what an answer citing it names as its source, question) of each curated answer among
    a site's sources (`definitions`): a page with no web address is cited by its title
    (services/retriever/sources/collector.py), a curated answer's being its question."""
    return [(spec.title, spec.title) for spec in specs.values() if spec.id.startswith(CURATED_PREFIX)]


def file_spec(name: str, size: int) -> ev.SourceSpec:
    """The source of an uploaded file (SourceError when its name or size is refused)."""
    base = posixpath.basename(name.replace("\\", "/")).strip()
    errors = []
    if not base or len(base) > 200 or base.startswith(".") or any(unicodedata.category(c) in ("Cc", "Cf") for c in base):
        errors.append({"field": "name", "message": "a file name (at most 200 characters, no control or format "
                                                   "characters)"})
    elif posixpath.splitext(base.lower())[1] not in UPLOAD_SUFFIXES:
        errors.append({"field": "name", "message": f"unsupported file type: use {', '.join(UPLOAD_SUFFIXES)}"})
    if size <= 0 or size > MAX_UPLOAD_BYTES:
        errors.append({"field": "file", "message": f"between 1 byte and {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB"})
    if errors:
        raise SourceError(errors)
    source = _id("file", base)
    return ev.SourceSpec(id=source, kind="file", name=base, size=size, title=base)


def session_of(source: str) -> str:
    return ev.SOURCE_PREFIX + source


def source_of(session: str) -> str | None:
    return session[len(ev.SOURCE_PREFIX):] if session.startswith(ev.SOURCE_PREFIX) else None


def page_url(spec: ev.SourceSpec) -> str:
    """The one page of a file or text source (what its answers cite)."""
    return f"upload://{spec.id}/{spec.name}" if spec.kind == "file" else f"text://{spec.id}"


def upload_key(site: str, source: str, name: str) -> str:
    return f"{site}/{source}/{name}"


def staged_key(site: str, source: str, run: int, url: str) -> str:
    """Where a run stages a changed page (by its URL: the run's end finds it from the URL alone)."""
    return f"{site}/{source}/{run}/" + hashlib.blake2b(url.encode(), digest_size=12).hexdigest()


class StagedPage(msgspec.Struct, kw_only=True):
    """A changed page's text and what it was fetched with, until its run's end applies it."""

    url: str
    title: str
    text: str
    content_hash: str
    etag: str = ""
    last_modified: str = ""


# --- commands ---------------------------------------------------------------------------


async def room_for(bus: Bus, site: str, spec: ev.SourceSpec) -> None:
    """SourceError when defining `spec` would take the site past MAX_SOURCES sources or
    MAX_SITE_PAGES pages (a source defined again replaces itself: it takes no more room)."""
    others = {source: s for source, s in (await definitions(bus, site)).items() if source != spec.id}
    if len(others) >= MAX_SOURCES:
        raise SourceError([{"field": "source", "message": f"the site has {len(others)} sources, at most "
                                                           f"{MAX_SOURCES}: remove one first"}])
    pages = sum(s.max_pages if s.kind == "website" else 1 for s in others.values())
    wanted = spec.max_pages if spec.kind == "website" else 1
    if pages + wanted > MAX_SITE_PAGES:
        raise SourceError([{"field": "max_pages", "message": f"the site's sources may hold {pages} pages already; "
                                                              f"with {wanted} more, past its {MAX_SITE_PAGES}"}])


async def define(bus: Bus, site: str, spec: ev.SourceSpec, actor: str) -> ev.SourceAdded:
    """Store the source's definition (an unchanged one again is the same event); SourceError
    when the site has no room for it (`room_for`)."""
    await room_for(bus, site, spec)
    digest = hashlib.blake2b(msgspec.json.encode(spec), digest_size=8).hexdigest()
    added = ev.SourceAdded(event_id=ev.derived_id(f"{site}/{spec.id}", "sources", f"added-{digest}"), site=site,
                           session_id=session_of(spec.id), turn=0, ts=ev.now(), producer="sources", source=spec,
                           actor=actor)
    await bus.publish(added)
    return added


async def remove(bus: Bus, site: str, source: str, actor: str) -> ev.SourceRemoved:
    removed = ev.SourceRemoved(event_id=ev.new_id(), site=site, session_id=session_of(source), turn=0, ts=ev.now(),
                               producer="sources", actor=actor)
    await bus.publish(removed)
    return removed


async def request_sync(bus: Bus, site: str, source: str, reason: str, actor: str = "") -> tuple[ev.SyncRequested, bool]:
    """Ask for the source's next run; (the run's request, whether it is new). A run still
    going is the answer to a request made meanwhile: no second run starts beside it."""
    session = session_of(source)
    last = await bus.last(subjects.conv(site, session, "sync_requested"))
    if last is not None and not await _ended(bus, site, session, last.turn):
        return last, False
    run = (last.turn if last is not None else 0) + 1
    request = ev.SyncRequested(event_id=ev.derived_id(f"{site}/{source}", "sources", f"run-{run}"), site=site,
                               session_id=session, turn=run, ts=ev.now(), producer="sources", reason=reason,
                               actor=actor)
    ack = await bus.publish(request)
    return request, not ack.duplicate


async def _ended(bus: Bus, site: str, session: str, run: int) -> bool:
    for kind in ("sync_completed", "sync_failed"):
        last = await bus.last(subjects.conv(site, session, kind))
        if last is not None and last.turn >= run:
            return True
    return False


# --- reading ----------------------------------------------------------------------------


async def defined(bus: Bus, site: str = "*") -> dict[tuple[str, str], ev.SourceSpec]:
    """Every source of the site (of every site: "*") by (site, id): the newest definition
    of each, those removed since left out."""
    latest: dict[tuple[str, str], ev.SourceAdded] = {}
    for record in await bus.read(subjects.conv(site, "*", "source_added")):
        latest[(record.event.site, record.event.source.id)] = record.event
    for record in await bus.read(subjects.conv(site, "*", "source_removed")):
        key = (record.event.site, source_of(record.event.session_id))
        if key in latest and latest[key].ts <= record.event.ts:
            del latest[key]
    return {key: added.source for key, added in latest.items()}


async def definitions(bus: Bus, site: str) -> dict[str, ev.SourceSpec]:
    """The site's sources by id (`defined` for one site)."""
    return {source: spec for (_, source), spec in (await defined(bus, site)).items()}


async def status(bus: Bus, site: str, spec: ev.SourceSpec, progress=None) -> dict:
    """One source as the operator sees it: its definition, its last run (requested, started,
    pages done of pages queued when `progress` (the folded `SyncProgress`) is given, how it
    ended) and the last completed run's counts."""
    session = session_of(spec.id)
    last = {kind: await bus.last(subjects.conv(site, session, kind))
            for kind in ("sync_requested", "sync_started", "sync_completed", "sync_failed")}
    requested = last["sync_requested"]
    run = requested.turn if requested else 0
    completed, failed = last["sync_completed"], last["sync_failed"]
    state = "never synced"
    if requested is not None:
        state = ("completed" if completed and completed.turn == run else "failed" if failed and failed.turn == run
                 else "running" if last["sync_started"] and last["sync_started"].turn == run else "queued")
    view = {"id": spec.id, "kind": spec.kind, "url": spec.url, "name": spec.name, "title": spec.title,
            "every_s": spec.every_s, "include": spec.include, "exclude": spec.exclude, "max_pages": spec.max_pages,
            "run": run, "state": state, "requested_at": requested.ts if requested else None,
            "last_completed": msgspec.to_builtins(completed) if completed else None,
            "last_failure": {"run": failed.turn, "reason": failed.reason, "at": failed.ts} if failed else None}
    started = last["sync_started"]
    # The site's sitemap a home page's run found (its pages joined the start page's links).
    view["sitemap"] = started.sitemap if started is not None and started.turn == run else ""
    if progress is not None and progress.run == run and run:
        done = sum(1 for outcome in progress.pages.values() if outcome)
        view["progress"] = {"pages": len(progress.pages), "done": done,
                            "failed": sum(1 for o in progress.pages.values() if o == "failed")}
    return view


# --- the object stores ------------------------------------------------------------------


class Staging:
    """Uploaded files' bytes and a run's staged page texts (object stores, so any replica
    fetches a page and any other applies it)."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self._stores: dict[str, object] = {}

    async def _store(self, bucket: str):
        if bucket not in self._stores:
            self._stores[bucket] = await object_store(self.bus, bucket)
        return self._stores[bucket]

    async def _get(self, bucket: str, key: str) -> bytes | None:
        try:
            return (await (await self._store(bucket)).get(key)).data
        except (ObjectNotFoundError, NotFoundError):
            return None

    async def _delete(self, bucket: str, key: str) -> None:
        try:
            await (await self._store(bucket)).delete(key)
        except (ObjectNotFoundError, NotFoundError):
            pass

    async def stage(self, key: str, data: bytes) -> None:
        await (await self._store(STAGING_BUCKET)).put(key, data)

    async def staged(self, key: str) -> StagedPage | None:
        data = await self._get(STAGING_BUCKET, key)
        return None if data is None else msgspec.json.decode(data, type=StagedPage)

    async def unstage(self, key: str) -> None:
        await self._delete(STAGING_BUCKET, key)

    async def upload(self, key: str, data: bytes) -> None:
        await (await self._store(UPLOADS_BUCKET)).put(key, data)

    async def uploaded(self, key: str) -> bytes | None:
        return await self._get(UPLOADS_BUCKET, key)

    async def remove_upload(self, key: str) -> None:
        await self._delete(UPLOADS_BUCKET, key)
