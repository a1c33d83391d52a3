"""Knowledge-base snapshots on the bus (services/retriever/snapshots.py): ingestion publishes
a site's graph and key-value files, versioned, to the `kb_snapshots` object store; retriever
replicas with KB_DIRs of their own load them, hot-swap a new version, and answer as the
knowledge base that was ingested.

The replicas are KnowledgeBase instances in this process, each with its own KB_DIR, on a
real nats-server. Their vectors are in one in-memory Qdrant client handed to all of them,
which they use as they would a Qdrant server (shared collections, every point tagged with
its site, `KnowledgeBase(client=...)`): two processes cannot share qdrant-client's local
mode, and no Qdrant server runs here. What travels through the bus, the graph and the
key-value files, is exactly what it is in production; each replica reads it from its own
directory only (LightRAG's in-memory tables are keyed by a workspace name unique to each
load, so nothing leaks between the instances in this one process)."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import uuid
from pathlib import Path

import nats.errors
import pytest
from qdrant_client import QdrantClient

from services.retriever import documents, snapshots
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever
from services.retriever.settings import RetrievalSettings, RetrieverSettings, SnapshotSettings
from shared.bus import connect
from shared.config import BusConfig, ConfigError
from shared.embeddings import shared_embedder
from shared.site_config import SiteConfig
from tests.helpers import wait_for
from tests.servers import NATS_USERS, ROOT, nats_server_with_config

QUESTION = "How much does the Orbit plan cost?"


async def _no_record(_call) -> None:
    return None


@pytest.fixture
def qdrant():
    client = QdrantClient(":memory:")
    yield client
    client.close()


@pytest.fixture
async def store(bus):
    return await snapshots.open_store(bus)


def kb_at(root: Path, qdrant) -> KnowledgeBase:
    return KnowledgeBase(root, shared_embedder(), client=qdrant).open()


async def answer(kb: KnowledgeBase, site: str) -> list[tuple[str, str]]:
    retriever = Retriever(kb=kb, base=RetrievalSettings(limiter_enabled=False), rerankers={})
    result = await retriever.retrieve(site, QUESTION, SiteConfig(), _no_record)
    return sorted((d.title, d.content) for d in result.documents)


async def ingest_job(root: Path, qdrant, store, site: str, source: Path) -> tuple[str, str, bool]:
    """What `concierge ingest` does with KB_SNAPSHOTS=bus, in a fresh KB_DIR as a Job has:
    restore the published snapshot, ingest, close, publish. (outcome, version, new?)"""
    await store.restore(site, root / site)
    kb = kb_at(root, qdrant)
    try:
        outcome = await kb.ingest(site, documents.read(site, source, "plans.md"))
    finally:
        await kb.close()
    manifest, new = await store.publish(site, root / site)
    return outcome, manifest.version, new


async def test_replicas_load_the_published_snapshot_and_hot_swap_a_new_version(tmp_path, qdrant, store, site):
    source = tmp_path / "plans.md"
    source.write_text("# Plans\n\n## Price\nThe Orbit plan costs $10 per seat (saffron edition).\n")
    outcome, first, new = await ingest_job(tmp_path / "job1", qdrant, store, site, source)
    assert (outcome, new) == ("added", True)

    replicas = [kb_at(tmp_path / name, qdrant) for name in ("replica_a", "replica_b")]
    followers = [snapshots.Follower(store, kb, poll_s=0.1) for kb in replicas]
    try:
        for follower, kb in zip(followers, replicas):
            await follower.sync()
            # Nothing fetched at start: the site's snapshot is fetched when it is first asked.
            assert site not in follower.versions and not (kb.root / "snapshots").exists()
        answers = [await answer(kb, site) for kb in replicas]
        assert [f.versions[site] for f in followers] == [first, first]
        assert answers[0] and answers[0] == answers[1]
        assert any("saffron" in content for _, content in answers[0])
        # Each replica reads its own copy, not the Job's directory.
        loaded = [kb._site_dir(site) for kb in replicas]
        assert all(d.is_relative_to(kb.root / "snapshots") for d, kb in zip(loaded, replicas))

        for follower in followers:
            follower.start()
        # An edit, by a Job with a KB_DIR of its own: it starts from the published snapshot
        # (so the document is "replaced", not "added" beside the old one) and publishes anew.
        source.write_text("# Plans\n\n## Price\nThe Orbit plan costs $12 per seat (indigo edition).\n")
        outcome, second, new = await ingest_job(tmp_path / "job2", qdrant, store, site, source)
        assert (outcome, new) == ("replaced", True) and second != first
        for follower in followers:
            await wait_for(lambda f=follower: f.versions.get(site) == second)
        for kb, old in zip(replicas, loaded):
            joined = " ".join(content for _, content in await answer(kb, site))
            assert "indigo" in joined and "saffron" not in joined
            assert not old.exists()  # the swapped-out version's directory is gone

        # The same content again: no new version, nothing written to the bucket.
        objects_before = sorted(i.name for i in await store.objects.list(ignore_deletes=True))
        outcome, third, new = await ingest_job(tmp_path / "job3", qdrant, store, site, source)
        assert (outcome, third, new) == ("unchanged", second, False)
        assert sorted(i.name for i in await store.objects.list(ignore_deletes=True)) == objects_before
    finally:
        for follower, kb in zip(followers, replicas):
            await follower.stop()
            await kb.close()


async def test_a_query_in_flight_finishes_on_the_old_version(tmp_path, qdrant, store, site):
    source = tmp_path / "plans.md"
    source.write_text("# Plans\n\n## Price\nThe Orbit plan costs $10 per seat (saffron edition).\n")
    await ingest_job(tmp_path / "job1", qdrant, store, site, source)
    kb = kb_at(tmp_path / "replica", qdrant)
    follower = snapshots.Follower(store, kb, poll_s=0.1)
    try:
        await follower.sync()
        await answer(kb, site)  # a loaded snapshot is opened by its first query
        old = kb.pool.peek(site)
        with old.use():  # a query holding the old version
            source.write_text("# Plans\n\n## Price\nThe Orbit plan costs $12 per seat (indigo edition).\n")
            await ingest_job(tmp_path / "job2", qdrant, store, site, source)
            swap = asyncio.ensure_future(follower.sync())
            await wait_for(lambda: kb.pool.peek(site) is not old)
            assert old.directory.exists() and not swap.done()  # new queries go to the new one meanwhile
            assert "indigo" in " ".join(c for _, c in await answer(kb, site))
        await swap
        assert not old.directory.exists()
        # ... and LightRAG's in-memory tables of the old version are let go, not kept for ever.
        from lightrag.kg import shared_storage

        assert not [k for k in shared_storage._shared_dicts if k.startswith(f"{old.directory.name}:")]
        assert [k for k in shared_storage._shared_dicts if k.startswith(f"{kb.pool.peek(site).directory.name}:")]
    finally:
        await kb.close()


async def test_a_site_without_a_snapshot_has_nothing_and_a_withdrawn_one_goes(tmp_path, qdrant, store, site):
    kb = kb_at(tmp_path / "replica", qdrant)
    follower = snapshots.Follower(store, kb, poll_s=0.1)
    try:
        await follower.sync()
        assert await answer(kb, site) == []
        source = tmp_path / "plans.md"
        source.write_text("# Plans\n\n## Price\nThe Orbit plan costs $10 per seat (saffron edition).\n")
        await ingest_job(tmp_path / "job", qdrant, store, site, source)
        await follower.sync()
        assert await answer(kb, site)
        await store.objects.delete(site)
        await follower.sync()
        assert await answer(kb, site) == [] and site not in follower.versions
    finally:
        await kb.close()


async def test_history_keeps_the_newest_archives(tmp_path, bus, site):
    store = snapshots.SnapshotStore((await snapshots.open_store(bus)).objects, history=2)
    directory = tmp_path / site
    directory.mkdir()
    versions = []
    for n in range(4):
        (directory / "documents.json").write_text(f'{{"n": {n}}}')
        manifest, new = await store.publish(site, directory)
        assert new
        versions.append(manifest.version)
    names = {i.name for i in await store.objects.list(ignore_deletes=True) if i.name.startswith(f"{site}/")}
    assert names == {f"{site}/{v}" for v in versions[-2:]}
    assert (await store.current(site)).version == versions[-1]


async def test_with_the_production_permissions_ingestion_and_the_retriever_publish_and_replay_only_reads(tmp_path, site):
    """deploy/nats-server.conf: ingestion connects as `admin` (docs/deploy.md); the
    retriever may create the bucket, read it (a multi-chunk archive) and write it (a
    knowledge source's run publishes the site it changed); the replay worker, which follows
    the snapshots for a fork's retrieval, may only read it."""
    passwords = {name: uuid.uuid4().hex for name in NATS_USERS}
    env = {f"NATS_{name.upper()}_PASSWORD": pw for name, pw in passwords.items()}
    with nats_server_with_config((ROOT / "deploy" / "nats-server.conf").read_text(), env) as url:
        retriever = await connect(BusConfig(url=url, user="retriever", password=passwords["retriever"]), "retriever")
        admin = await connect(BusConfig(url=url, user="admin", password=passwords["admin"]), "ingest")
        try:
            reading = await snapshots.open_store(retriever)  # first: the retriever creates the bucket
            assert await reading.digests() == {}
            directory = tmp_path / site
            directory.mkdir()
            (directory / "graph.graphml").write_bytes(os.urandom(400_000).hex().encode())  # several chunks
            manifest, new = await (await snapshots.open_store(admin)).publish(site, directory)
            assert new and list(await reading.digests()) == [site]
            assert (await reading.current(site)).version == manifest.version
            assert snapshots.unpack(await reading.fetch(manifest), tmp_path / "copy").version == manifest.version
            (directory / "documents.json").write_text("{}")
            synced, new = await reading.publish(site, directory)  # as a sync run's end does
            assert new and (await reading.current(site)).version == synced.version
            replay = await connect(BusConfig(url=url, user="replay", password=passwords["replay"]), "replay")
            try:
                replaying = await snapshots.open_store(replay)
                assert (await replaying.current(site)).version == synced.version
                assert snapshots.unpack(await replaying.fetch(synced), tmp_path / "again").version == synced.version
                with pytest.raises(nats.errors.TimeoutError):
                    await replay.js.publish(f"$O.{reading.objects._name}.M.x", b"{}", timeout=0.5)
            finally:
                await replay.close()
        finally:
            await retriever.close()
            await admin.close()


# --- the archive, without a bus -------------------------------------------------------------


def test_an_archive_round_trips_and_the_version_is_the_content(tmp_path):
    source = tmp_path / "site"
    (source / "sub").mkdir(parents=True)
    (source / "documents.json").write_text("{}")
    (source / "sub" / "graph.graphml").write_text("<graph/>")
    (source / "kv_store_x.json.tmp").write_text("half-written")
    manifest, data = snapshots.pack("demo", source)
    assert [f.path for f in manifest.files] == ["documents.json", "sub/graph.graphml"]
    assert snapshots.unpack(data, tmp_path / "copy").version == manifest.version
    assert (tmp_path / "copy" / "sub" / "graph.graphml").read_text() == "<graph/>"
    assert snapshots.describe("demo", source).version == manifest.version
    (source / "documents.json").write_text('{"a": 1}')
    assert snapshots.describe("demo", source).version != manifest.version


def _archive(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_tampered_or_escaping_archive_is_refused(tmp_path):
    source = tmp_path / "site"
    source.mkdir()
    (source / "documents.json").write_text("{}")
    manifest, _ = snapshots.pack("demo", source)
    header = snapshots.msgspec.json.encode(manifest)
    with pytest.raises(snapshots.SnapshotError, match="do not match"):
        snapshots.unpack(_archive({"manifest.json": header, "files/documents.json": b'{"x": 1}'}), tmp_path / "a")
    with pytest.raises(snapshots.SnapshotError, match="outside"):
        snapshots.unpack(_archive({"manifest.json": header, "files/../../evil": b"x"}), tmp_path / "b" / "c")
    assert not (tmp_path / "evil").exists()
    with pytest.raises(snapshots.SnapshotError, match="unreadable"):
        snapshots.unpack(b"not a tarball", tmp_path / "d")


def test_snapshots_are_on_with_a_qdrant_server_and_off_in_the_embedded_default(monkeypatch):
    monkeypatch.delenv("KB_SNAPSHOTS", raising=False)
    assert SnapshotSettings.from_env(server=False).enabled is False
    assert SnapshotSettings.from_env(server=True).enabled is True
    monkeypatch.setenv("KB_SNAPSHOTS", "off")
    assert SnapshotSettings.from_env(server=True).enabled is False
    monkeypatch.setenv("KB_SNAPSHOTS", "bus")
    with pytest.raises(ConfigError, match="needs QDRANT_URL"):
        SnapshotSettings.from_env(server=False)
    monkeypatch.setenv("KB_SNAPSHOTS", "sometimes")
    with pytest.raises(ConfigError):
        SnapshotSettings.from_env(server=True)
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")  # the retriever's settings pass it on
    monkeypatch.setenv("KB_SNAPSHOTS", "")
    assert RetrieverSettings.from_env().snapshots.enabled is True
