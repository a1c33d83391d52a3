"""`concierge ingest --site SITE PATH...` and `concierge docs list|delete --site SITE`.

Ingest reads Markdown, text, HTML and PDF files (a directory: every such file under it),
chunks them, extracts entities and relationships offline and stores them in the site's
knowledge base (KB_DIR, Qdrant local mode or QDRANT_URL), all files in one batch
(`KnowledgeBase.ingest_many`: one embedding pass, one write). An unchanged file adds nothing;
a changed one replaces its earlier content. A file that cannot be read is reported by name
and skipped; the others are still ingested (exit status 1 if any was skipped).

With KB_SNAPSHOTS=bus (the default with QDRANT_URL), the site's files in KB_DIR are first
made the snapshot published on the bus, and after the run (and after `docs delete`) they
are published as the site's new snapshot, which every retriever replica loads
(services/retriever/snapshots.py); the same files publish no new version.

Then, when a NATS server answers (NATS_URL), the vectors of every sentence and title the
site's knowledge base can hand an extractive answer are embedded and stored in the
`kb_vectors` bucket (shared/kb_vectors.py); those already there are not
embedded again, only written again (their time to live starts over). The first visitors'
answers then embed only their question. With no server it says so and
goes on (answers embed what they need on first use and store it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

from shared import logs
from shared.config import ConfigError


def _open_kb():
    from services.retriever.knowledge import KnowledgeBase, KnowledgeBaseLocked
    from services.retriever.settings import KnowledgeBaseSettings
    from shared.embeddings import shared_embedder

    try:
        return KnowledgeBase.configured(KnowledgeBaseSettings.from_env(), shared_embedder()).open()
    except KnowledgeBaseLocked as exc:
        print(f"concierge: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


@contextlib.asynccontextmanager
async def _snapshots(site: str, kb):
    """With KB_SNAPSHOTS=bus: the site's published snapshot restored into KB_DIR before the
    body, and `publish()`, to call once the body has changed the site, returning its
    version and whether it was new. Otherwise `publish` is None."""
    from services.retriever import snapshots
    from services.retriever.settings import SnapshotSettings

    try:
        settings = SnapshotSettings.from_env(server=bool(kb.qdrant_url))
    except ConfigError as exc:
        print(f"concierge: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not settings.enabled:
        yield None
        return
    from shared.bus import connect
    from shared.config import BusConfig

    bus = await connect(BusConfig.from_env(), name="ingest")
    try:
        store = await snapshots.open_store(bus, settings.history)
        directory = kb.root / site
        await store.restore(site, directory)

        async def publish() -> tuple[str, bool]:
            await kb.close()  # LightRAG writes its files out when its storages are finalized (closing again is a no-op)
            manifest, new = await store.publish(site, directory)
            return manifest.version, new

        yield publish
    finally:
        await bus.close()


async def ingest(site: str, paths: list[Path], quiet: bool = False) -> dict[str, int]:
    from services.retriever import documents

    missing = [p for p in paths if not p.exists()]
    files = documents.collect([p for p in paths if p.exists()])
    counts = {"added": 0, "replaced": 0, "unchanged": 0, "skipped": len(missing), "chunks": 0}
    for path in missing:
        print(f"skipped {path}: no such file or directory", file=sys.stderr)
    kb = _open_kb()
    started = time.monotonic()
    try:
        async with _snapshots(site, kb) as publish:
            await _ingest_files(kb, site, files, paths, counts, quiet)
            counts["vectors"] = await _prepare_vectors(kb, site)
            if publish is not None:
                counts["snapshot"], counts["published"] = await publish()
    finally:
        await kb.close()
    seconds = time.monotonic() - started
    counts["seconds"] = round(seconds, 2)
    counts["chunks_per_s"] = round(counts["chunks"] / seconds, 1) if seconds > 0 else 0.0
    return counts


async def _ingest_files(kb, site: str, files: list[Path], paths: list[Path], counts: dict, quiet: bool) -> None:
    """Every file read, then all of them ingested together (`KnowledgeBase.ingest_many`)."""
    from tqdm import tqdm

    from services.retriever import documents

    docs = []
    bar = tqdm(files, unit="file", desc=f"read {site}", disable=quiet or len(files) < 2, file=sys.stderr)
    for path in bar:
        try:
            docs.append(documents.read(site, path, _name(path, paths)))
        except documents.UnreadableDocument as exc:
            counts["skipped"] += 1
            bar.write(f"skipped {exc}", file=sys.stderr)
    if not quiet and len(docs) > 1:
        print(f"ingest {site}: {len(docs)} documents", file=sys.stderr, flush=True)
    outcomes = await kb.ingest_many(site, docs)
    registry = kb.registry(site)
    for doc_id, outcome in outcomes.items():
        counts[outcome] += 1
        if outcome != "unchanged":
            record = registry[doc_id]
            counts["chunks"] += record.get("chunk_count", len(record["chunks"]))


VECTORS_CONNECT_S = 5.0  # how long ingest waits for a NATS server before leaving the vectors to the answers


async def _prepare_vectors(kb, site: str) -> dict[str, int] | str:
    """The site's knowledge-base texts' vectors stored in the `kb_vectors` bucket; counts,
    or why not. Only that bucket is touched (made when missing), never the bus's other
    streams and buckets; anything that goes wrong here leaves the ingest as it was."""
    import os

    from shared import kb_vectors
    from services.retriever import search
    from shared import subjects
    from shared.bus import connect, opened_bucket
    from shared.config import BusConfig
    from shared.site_config import SiteConfigError, SiteConfigs, parse

    config = BusConfig.from_env()
    if not any(_listening(server) for server in config.servers()):
        return f"not prepared: no NATS server at {config.url}"
    try:
        bus = await asyncio.wait_for(connect(config, name="ingest", topology=False), VECTORS_CONNECT_S)
    except Exception as exc:  # noqa: BLE001 - no server (or not ours): the answers embed on first use
        return f"not prepared: no NATS server at {config.url} ({type(exc).__name__})"
    try:
        try:
            found = await SiteConfigs(bus).find(site)
        except Exception:  # noqa: BLE001 - no site_config bucket yet (no service has started): the file
            found = None
        path = Path(os.environ.get("SITES_DIR", "sites")) / f"{site}.toml"
        if found is None and path.exists():
            try:
                found = parse(path)
            except SiteConfigError:
                found = None
        name = (found.name if found else "") or site  # as answer_writer masks it
        kv = await opened_bucket(bus, subjects.KB_VECTORS_BUCKET, config.kb_vectors_ttl_s or None)
        return await kb_vectors.warm(kv, kb.embedder, site, await search.answerable_texts(kb, site, name))
    except Exception as exc:  # noqa: BLE001 - a cache: the answers embed what is missing on first use
        return f"not prepared: {type(exc).__name__}: {exc}"
    finally:
        await bus.close()


def _listening(server: str) -> bool:
    """Whether something accepts connections at the server's address (a quick look before
    the client, which would keep retrying)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(server if "://" in server else f"nats://{server}")
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 4222), timeout=1.0):
            return True
    except OSError:
        return False


def _name(path: Path, roots: list[Path]) -> str:
    """How a document is known: its path relative to the directory given, else as given."""
    for root in roots:
        if root.is_dir():
            try:
                return str(path.relative_to(root.parent))
            except ValueError:
                continue
    return str(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", required=True)
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logs.setup("ingest")
    counts = asyncio.run(ingest(args.site, args.paths, args.quiet))
    print(f"{args.site}: {counts['added']} added, {counts['replaced']} replaced, {counts['unchanged']} unchanged, "
          f"{counts['skipped']} skipped; {counts['chunks']} chunks in {counts['seconds']} s "
          f"({counts['chunks_per_s']} chunks/s)")
    vectors = counts["vectors"]
    print(f"{args.site}: knowledge vectors " + (vectors if isinstance(vectors, str) else
                                                 f"{vectors['stored']} stored, {vectors['texts'] - vectors['stored']} "
                                                 f"already stored"))
    if "snapshot" in counts:
        print(f"{args.site}: snapshot {counts['snapshot']} "
              f"{'published' if counts['published'] else 'unchanged (already published)'}")
    return 1 if counts["skipped"] else 0


def docs_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge docs", description="list or delete a site's documents")
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list")
    listing.add_argument("--site", required=True)
    delete = sub.add_parser("delete")
    delete.add_argument("--site", required=True)
    delete.add_argument("documents", nargs="+", help="document ids or paths, as `docs list` shows them")
    prune = sub.add_parser("prune", help="delete the documents no knowledge source owns (`concierge ingest`'s), "
                                         "once the same files are the site's sources")
    prune.add_argument("--site", required=True)
    args = parser.parse_args(argv)
    logs.setup("docs")
    return asyncio.run(_docs(args))


async def _docs(args) -> int:
    kb = _open_kb()
    async with _snapshots(args.site, kb) as publish:
        status = await _docs_on(kb, args)
        if publish is not None and args.action in ("delete", "prune"):
            version, new = await publish()
            print(f"{args.site}: snapshot {version} {'published' if new else 'unchanged (already published)'}")
    return status


async def _docs_on(kb, args) -> int:
    try:
        records = kb.documents(args.site)
        if args.action == "list":
            for r in records:
                chunks = r.get("chunk_count", len(r["chunks"]))
                print(f"{r['doc_id']}  {chunks:>4} chunks  {r['path']}  ({r['title']}; {r['source']}; extraction {r.get('extraction', 1)})")
            print(f"{len(records)} documents")
            return 0
        if args.action == "prune":
            unowned = [r for r in records if not (r.get("meta") or {}).get("source")]
            for r in unowned:
                await kb.delete(args.site, r["doc_id"])
                print(f"deleted {r['path']} ({r['doc_id']})")
            print(f"{args.site}: {len(unowned)} documents no source owns deleted, {len(records) - len(unowned)} kept")
            return 0
        status = 0
        for wanted in args.documents:
            match = next((r for r in records if wanted in (r["doc_id"], r["path"])), None)
            if match is None or not await kb.delete(args.site, match["doc_id"]):
                print(f"no document {wanted!r} on site {args.site}", file=sys.stderr)
                status = 1
            else:
                print(f"deleted {match['path']} ({match['doc_id']})")
        return status
    finally:
        await kb.close()
