"""The bus against a real JetStream: topology, dedupe, optimistic concurrency, reads,
credentials and per-service permissions."""

from __future__ import annotations

import asyncio
import uuid

import nats.errors
import pytest

from shared import events as ev
from shared import subjects
from shared.bus import BusRefused, ConcurrencyConflict, Position, connect, ensure_topology, topology_ready
from shared.config import BusConfig, ConfigError
from shared.consumer import ConsumerRunner
from shared.node import Node
from shared.site_config import SiteConfigs
from shared.store import CachedStore, JetStreamStore
from shared.store.jetstream import read_snapshot
from tests.servers import NATS_USERS, ROOT, nats_server_with_config
from tests.helpers import fast, unique, wait_for


def requested(site: str, session: str, turn: int, message: str = "hi", event_id: str | None = None):
    return ev.TurnRequested(
        event_id=event_id or ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(),
        producer="test", message=message,
    )


async def test_topology_is_idempotent(bus):
    await ensure_topology(bus)
    await ensure_topology(bus)
    assert await topology_ready(bus)
    info = await bus.js.stream_info(subjects.CONV_STREAM)
    assert info.config.allow_direct and subjects.CONV_SUBJECTS in info.config.subjects


async def test_same_event_id_is_stored_once(bus, site):
    event = requested(site, "s1", 1)
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert not first.duplicate and second.duplicate
    assert len(await bus.read(subjects.conversation(site, "s1"))) == 1


async def test_two_gateways_cannot_start_the_same_turn(bus, site):
    await bus.publish(requested(site, "s1", 1), expected_subject_seq=0)
    with pytest.raises(ConcurrencyConflict):
        # A second gateway read the same (empty) conversation and tries turn 1 too.
        await bus.publish(requested(site, "s1", 1), expected_subject_seq=0)
    stored = await bus.read(subjects.conversation(site, "s1"))
    assert [r.event.turn for r in stored] == [1]
    ack = await bus.publish(requested(site, "s1", 2), expected_subject_seq=stored[-1].seq)
    assert ack.seq > stored[-1].seq


async def test_read_returns_one_conversation_in_order_across_batches(bus, site):
    for i in range(1, 8):
        await bus.publish(requested(site, "a", i, f"a{i}"))
        await bus.publish(requested(site, "b", i, f"b{i}"))
    records = await bus.read(subjects.conversation(site, "a"), batch=3)
    assert [r.event.message for r in records] == [f"a{i}" for i in range(1, 8)]
    assert all(subjects.in_conversation(r.subject, site, "a") for r in records)
    tail = await bus.read(subjects.conversation(site, "a"), after_seq=records[3].seq, batch=2)
    assert [r.event.message for r in tail] == ["a5", "a6", "a7"]
    assert await bus.read(subjects.conversation(site, "nobody")) == []


async def test_reads_made_for_an_event_include_it_and_other_reads_do_not_wait_for_it(bus, site):
    """A read given the position of the event being handled (`at`: what the store passes
    for every handler's read) is held to that event: with one server it is always there, so
    nothing waits; a read whose filter does not cover that event is not held to it. The
    cluster side, a replica behind, is tests/test_bus_cluster.py."""
    await bus.publish(requested(site, "a", 1, "a1"))
    event = requested(site, "a", 2, "a2")
    ack = await bus.publish(event)
    bus.config.request_timeout = 0.5  # a read that waited in vain would fail, not pass slowly
    at = Position(subjects.conv(site, "a", "turn_requested"), ack.seq)
    assert [r.event.message for r in await bus.read(subjects.conversation(site, "a"), at=at)] == ["a1", "a2"]
    assert (await bus.last(subjects.conv(site, "a", "turn_requested"), at=at)).event_id == event.event_id
    assert await bus.last(subjects.conv(site, "a", "turn_completed"), at=at) is None
    assert await bus.read(subjects.conversation(site, "b"), at=at) == []
    assert [r.event.message for r in await bus.read(subjects.conversation(site, "a"), after_seq=ack.seq, at=at)] \
        == []


@pytest.mark.parametrize("filter_subject, subject, matched", [
    ("conv.s.a.>", "conv.s.a.turn_requested", True),
    ("conv.>", "conv.s.a.turn_requested", True),
    ("conv.s.*.turn_requested", "conv.s.b.turn_requested", True),
    ("conv.s.a.turn_requested", "conv.s.a.turn_requested", True),
    ("conv.s.a.>", "conv.s.ab.turn_requested", False),
    ("conv.s.a.>", "conv.s.a", False),
    ("conv.s.*.route_decided", "conv.s.a.turn_requested", False),
    ("conv.s.a.turn_requested", "conv.s.a.turn_requested.x", False),
])
def test_a_filter_names_the_subjects_nats_matches_it_with(filter_subject, subject, matched):
    assert subjects.matches(filter_subject, subject) is matched


# --- credentials ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured_nats():
    """A server started with deploy/nats-server.conf, the documented production config."""
    passwords = {name: uuid.uuid4().hex for name in NATS_USERS}
    env = {f"NATS_{name.upper()}_PASSWORD": pw for name, pw in passwords.items()}
    with nats_server_with_config((ROOT / "deploy" / "nats-server.conf").read_text(), env) as url:
        yield url, passwords


async def as_service(secured, name: str, **over):
    url, passwords = secured
    return await connect(BusConfig(url=url, user=name, password=passwords[name], **over), name=name)


async def test_a_connection_without_or_with_wrong_credentials_is_refused(secured_nats):
    url, _ = secured_nats
    with pytest.raises(BusRefused, match="auth: none"):
        await asyncio.wait_for(connect(BusConfig(url=url), name="anonymous"), 10)
    with pytest.raises(BusRefused, match="auth: user"):
        await asyncio.wait_for(connect(BusConfig(url=url, user="router", password="guess"), name="router"), 10)


async def test_each_service_works_within_its_subjects_and_is_refused_outside(secured_nats, site):
    gateway, router, responder = [await as_service(secured_nats, n, snapshot_every=1)
                                  for n in ("gateway", "router", "responder")]
    try:
        async def classify(event, inputs, ctx):
            await asyncio.sleep(1.0)  # at work past a heartbeat (every 0.2 s), so it says so
            return [ctx.follow(ev.IntentClassified, intent="LEARN", confidence=1.0, classifier="rule")]

        runner = ConsumerRunner(router, Node(unique("perm"), ("turn_requested",), classify), fast(ack_wait_s=0.6),
                                start_lookback_s=5)
        heard = []

        async def hear(msg):
            heard.append(msg.data)

        # The router says it is at work on the turn; the gateway's stall clock hears it.
        progress = await gateway.nc.subscribe(subjects.progress(site, "s1", 1), cb=hear)
        await runner.start()
        try:
            await gateway.publish(requested(site, "s1", 1))

            async def classified():
                return [r for r in await gateway.read(subjects.conversation(site, "s1"))
                        if isinstance(r.event, ev.IntentClassified)]

            await wait_for(classified)
            await wait_for(lambda: heard, what="a progress marker")
        finally:
            await runner.stop()
            await progress.unsubscribe()
        await responder.publish_token(ev.TokenChunk(event_id=ev.new_id(), site=site, session_id="s1", turn=1,
                                                    ts=ev.now(), index=0, content="Hi"))
        assert (await JetStreamStore(responder).state(site, "s1")).turn == 1  # it reads the snapshot bucket
        # The responder claims and settles a lead (one delivery per lead) under its own user.
        from services.responder import webhook_claims

        claims = webhook_claims.for_leads(responder)
        claim = await asyncio.wait_for(claims.claim(site, "s1", "lead-event-1"), 5)
        assert claim.owner == "lead-event-1" and claim.outcome is None
        # And each handoff request's webhook.
        handoffs = webhook_claims.for_handoffs(responder)
        claim = await asyncio.wait_for(handoffs.claim(site, "s1", "handoff-event-1"), 5)
        assert claim.owner == "handoff-event-1" and claim.outcome is None
        # It stores the knowledge vectors it embedded (kb_vectors.py), and reads them back.
        from shared import kb_vectors

        vectors = kb_vectors.KnowledgeVectors(_FixedEmbedder())
        kv = responder.kv[subjects.KB_VECTORS_BUCKET]
        first = await vectors.vectors(kv, site, ["Invoices sync hourly."])
        await vectors.flush()  # stored in the background
        stored = await kv.get(kb_vectors.key(site, "fixed", "Invoices sync hourly."))
        assert stored.value == first[0].tobytes()
        # A router cannot start turns, and nobody but the admin can purge the log.
        with pytest.raises(nats.errors.TimeoutError):
            await router.js.publish(subjects.conv(site, "s1", "turn_requested"), ev.encode(requested(site, "s1", 2)),
                                    stream=subjects.CONV_STREAM, timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await gateway.js.publish(subjects.conv(site, "s1", "route_decided"), b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await responder.nc.request(f"$JS.API.STREAM.PURGE.{subjects.CONV_STREAM}", b"", timeout=0.5)
        assert [type(r.event) for r in await gateway.read(subjects.conversation(site, "s1"))] == \
            [ev.TurnRequested, ev.IntentClassified]
        # The gateway stores a visitor's vote on an answer; a node's service may not.
        vote = ev.FeedbackGiven(event_id=ev.new_id(), site=site, session_id="s1", turn=1, ts=ev.now(),
                                producer="gateway", rating="up")
        assert (await gateway.publish(vote)).seq > 0
        with pytest.raises(nats.errors.TimeoutError):
            await responder.js.publish(subjects.conv(site, "s1", "feedback_given"), ev.encode(vote),
                                       stream=subjects.CONV_STREAM, timeout=0.5)
        # The gateway stores what an operator does in a handoff and holds its claim; a node's
        # service may do neither.
        joined = ev.OperatorJoined(event_id=ev.new_id(), site=site, session_id="s1", turn=1, ts=ev.now(),
                                   producer="gateway", operator="Ada")
        assert (await gateway.publish(joined)).seq > 0
        assert await gateway.bucket(subjects.HANDOFF_CLAIM_BUCKET).create(subjects.kv_key(site, "s1"), b"{}") > 0
        with pytest.raises(nats.errors.TimeoutError):
            await responder.js.publish(subjects.conv(site, "s1", "operator_message"), b"{}",
                                       stream=subjects.CONV_STREAM, timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await responder.bucket(subjects.HANDOFF_CLAIM_BUCKET).put(subjects.kv_key(site, "s1"), b"{}")
        # The gateway writes the conversation's snapshot as a turn starts; the nodes'
        # services only read it.
        await gateway.publish(requested(site, "s1", 2))
        store = CachedStore(gateway)
        state = await store.state(site, "s1", write_snapshot=True)
        await store.snapshots_written()
        assert (await read_snapshot(responder, site, "s1"))[0] == state and state.turn == 2
        with pytest.raises(nats.errors.TimeoutError):
            await responder.bucket(subjects.SNAPSHOT_BUCKET).put(subjects.kv_key(site, "s1"), b"{}")
        # The gateway asks for a run of the site's test cases and its eval_runner stores each
        # case's result and the run's end (shared/eval_runs.py); a node's service may not.
        from shared import eval_runs

        asked = await eval_runs.request(gateway, site, "operator", "admin")
        for kind, fields in ((ev.EvalCaseResult, {"case_id": "case-1", "version": 1, "passed": True}),
                             (ev.EvalRunCompleted, {"cases": 1, "passed": 1})):
            assert (await gateway.publish(ev.follow(asked, kind, "eval_runner", **fields))).seq > 0
        with pytest.raises(nats.errors.TimeoutError):
            await responder.js.publish(subjects.conv(site, asked.session_id, "eval_run_completed"), b"{}",
                                       stream=subjects.CONV_STREAM, timeout=0.5)
    finally:
        for bus in (gateway, router, responder):
            await bus.close()


async def test_the_gateway_and_the_router_change_sites_and_audit_them_and_no_one_else_does(secured_nats, site,
                                                                                           tmp_path):
    """Sites as data under deploy/nats-server.conf: the gateway (the operator API) makes and
    changes a site, the router imports a file, each audited in the site's log; a node's
    service may do neither."""
    from shared.site_store import SiteConfigSync, SiteStore

    gateway, router, responder = [await as_service(secured_nats, n) for n in ("gateway", "router", "responder")]
    try:
        await SiteStore(gateway).put(site, {"name": "Acme"}, "admin", must_create=True)
        await SiteStore(gateway).patch(site, {"widget": {"title": "Hello"}}, "admin")
        (tmp_path / f"{site}.toml").write_text('name = "From the file"\n')
        assert (await SiteConfigSync(router, tmp_path).sync_once())[site] == "loaded"
        log = [r.event for r in await responder.read(subjects.conv(site, ev.SITE_SESSION, "site_changed"))]
        assert [e.change for e in log] == ["created", "updated", "updated"]
        with pytest.raises(nats.errors.TimeoutError):
            await responder.js.publish(f"$KV.{subjects.SITE_CONFIG_BUCKET}.{site}", b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await responder.js.publish(subjects.conv(site, ev.SITE_SESSION, "site_changed"), b"{}", timeout=0.5)
    finally:
        for bus in (gateway, router, responder):
            await bus.close()


async def test_the_gateway_imports_accounts_and_audits_them_and_no_node_does(secured_nats, site):
    """Account data under deploy/nats-server.conf: the gateway (the operator API) stores a
    site's accounts and audits the import in the site's log; the replay worker reads them; a
    node's service may write neither."""
    from shared import accounts

    gateway, enricher, replay = [await as_service(secured_nats, n) for n in ("gateway", "enricher", "replay")]
    try:
        portfolio = accounts.parse(b'[{"name": "Acme", "arr": 1000}]')
        assert (await accounts.store(gateway, site, portfolio, "admin", "api")).added["accounts"] == 1
        assert [a.name for a in await accounts.accounts(replay, site)] == ["Acme"]
        assert [e.actor for e in await accounts.imports(replay, site)] == ["admin"]
        with pytest.raises(nats.errors.TimeoutError):
            await enricher.js.publish(f"$KV.{subjects.ACCOUNTS_BUCKET}.{site}.account.acme", b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await enricher.js.publish(subjects.conv(site, accounts.ACCOUNTS_SESSION, "accounts_imported"), b"{}",
                                      timeout=0.5)
    finally:
        for bus in (gateway, enricher, replay):
            await bus.close()


async def test_a_service_follows_the_log_through_the_servers_flow_control(secured_nats, site):
    """The log feed (shared/store/feed.py) is an ordered push consumer with flow control: the
    server stops delivering until the subscriber answers on `$JS.FC.>`, which each service
    user may publish. More data than the server sends unanswered gets through."""
    gateway, router = [await as_service(secured_nats, n) for n in ("gateway", "router")]
    try:
        store = CachedStore(router)
        await store.follow()
        feed = store.feed
        try:
            big = "x" * 60_000
            last = 0
            for i in range(200):  # 12 MB
                last = (await gateway.publish(requested(site, f"f{i % 7}", 1 + i // 7, message=big))).seq
            await wait_for(lambda: feed.position >= last, timeout=30, what="the feed at the last event")
            assert feed.breaks == 0
        finally:
            await store.close()
    finally:
        for bus in (gateway, router):
            await bus.close()


async def test_the_replay_worker_reads_and_answers_requests_and_writes_nothing(secured_nats, site):
    """`concierge replay serve` connects as `replay`: it reads the log and the site configs
    and answers the gateway on replay.request.*; it can neither store an event, nor take
    a node's messages, nor purge."""
    gateway, replay = [await as_service(secured_nats, n) for n in ("gateway", "replay")]
    try:
        await gateway.publish(requested(site, "s1", 1))
        assert [type(r.event) for r in await replay.read(subjects.conversation(site, "s1"))] == [ev.TurnRequested]
        assert await SiteConfigs(replay).find(site) is None  # the bucket is readable (no config for it)

        async def answer(msg):
            await msg.respond(b'{"ok": true}')

        sub = await replay.nc.subscribe(subjects.replay_request("diff"), queue="replay", cb=answer)
        await replay.nc.flush()  # the server has the subscription
        await gateway.nc.flush()  # (without it, one request in some thirty found no responder)
        try:
            reply = await gateway.nc.request(subjects.replay_request("diff"), b"{}", timeout=5)
            assert reply.data == b'{"ok": true}'
        finally:
            await sub.unsubscribe()
        with pytest.raises(nats.errors.TimeoutError):
            await replay.js.publish(subjects.conv(site, "s1", "route_decided"), b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await replay.nc.request(f"$JS.API.CONSUMER.CREATE.{subjects.CONV_STREAM}", b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await replay.nc.request(f"$JS.API.STREAM.PURGE.{subjects.CONV_STREAM}", b"", timeout=0.5)
    finally:
        for bus in (gateway, replay):
            await bus.close()


async def test_the_gateway_queues_brief_work_and_the_enricher_takes_it_and_answers(secured_nats, site):
    """Lead briefs under deploy/nats-server.conf: the gateway (the operator API) queues a
    brief and a triage on the BRIEFS work queue; the enricher consumes it and stores each
    step in the conversation; neither may publish the other's part, nor the router any."""
    from shared import briefs

    gateway, enricher, router = [await as_service(secured_nats, n) for n in ("gateway", "enricher", "router")]
    metadata = ev.BriefMetadata(priority=5, stage="exploring", estimated_seats=0, confidence=10)

    async def brief(event, inputs, ctx):
        return [ctx.follow(ev.BriefGathered, key="gathered", request_id=event.request_id, inputs=ev.BriefInputs()),
                ctx.follow(ev.BriefCompleted, key="completed", request_id=event.request_id, brief="b",
                           metadata=metadata, call_script="c", summary="s")]

    async def rank(event, inputs, ctx):
        return [ctx.follow(ev.TriageCompleted, request_id=event.request_id)]

    def gave_up(event, node, attempts, reason):
        return ev.follow(event, ev.BriefFailed, node, key="failed", node=node, reason=reason, attempts=attempts,
                         request_id=event.request_id, failed_event_id=event.event_id)

    runners = [ConsumerRunner(enricher, Node(unique(name), (consumes,), handle, stream=subjects.BRIEFS_STREAM,
                                             failure=gave_up), fast(), start_lookback_s=5)
               for name, consumes, handle in (("brief", "brief_requested", brief),
                                              ("triage", "triage_requested", rank))]
    try:
        for runner in runners:
            await runner.start()
        item, triage = briefs.brief_request(site, "lead1", 1, "gateway"), briefs.triage_request(site, "gateway")
        await gateway.publish_work(item)
        await gateway.publish_work(triage)
        await enricher.publish_work(briefs.brief_request(site, "lead2", 1, "enricher"))

        async def both_completed():
            done = await gateway.read(subjects.conv_of_type("brief_completed", site))
            return done if len(done) == 2 else None

        done = await wait_for(both_completed, what="the briefs completed")
        await wait_for(lambda: gateway.read(subjects.conv(site, ev.TRIAGE_SESSION, "triage_completed")),
                       what="the triage completed")
        await wait_for(lambda: _emptied(gateway, site), what="the work queue emptied")
        assert item.request_id in {r.event.request_id for r in done}
        with pytest.raises(nats.errors.TimeoutError):  # the gateway writes no brief
            await gateway.js.publish(subjects.conv(site, "lead1", "brief_completed"), b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):  # nor does the router queue work
            await router.publish_work(briefs.triage_request(site, "router"))
    finally:
        for runner in runners:
            await runner.stop()
        for bus in (gateway, enricher, router):
            await bus.close()


async def test_the_gateway_queues_account_reports_and_the_enricher_writes_them(secured_nats, site):
    """Account reports under deploy/nats-server.conf: the gateway stores the accounts and
    queues a report; the enricher's real report nodes read the `accounts` bucket and store
    each step in the account's log; the gateway may not write a report."""
    from services.enricher import account_reporter, report_gatherer
    from shared import account_reports, accounts

    gateway, enricher = [await as_service(secured_nats, n) for n in ("gateway", "enricher")]
    runners = [ConsumerRunner(enricher, node, fast(), start_lookback_s=5)
               for node in (report_gatherer.make_node(), account_reporter.make_node(None))]
    try:
        await accounts.store(gateway, site, accounts.Portfolio(
            accounts=[accounts.Account(id="acme", name="Acme", usage=[accounts.Metric(metric="seats", current=9,
                                                                                        limit=10)])]),
            "test", "test")
        for runner in runners:
            await runner.start()
        await account_reports.queue(gateway, await account_reports.requests_for(gateway, site, ["acme"], "gateway"))
        [done] = await wait_for(lambda: account_reports.reports(gateway, site, "acme"), timeout=20,
                                what="the account's report")
        assert isinstance(done, ev.AccountReportCompleted) and done.metadata.proposition == "upsell"
        await wait_for(lambda: _emptied(gateway, site), what="the work queue emptied")
        with pytest.raises(nats.errors.TimeoutError):  # the gateway writes no report
            await gateway.js.publish(subjects.conv(site, "_acct-acme", "account_report_completed"), b"{}", timeout=0.5)
    finally:
        for runner in runners:
            await runner.stop()
        for bus in (gateway, enricher):
            await bus.close()


async def _emptied(bus, site: str) -> bool:
    info = await bus.js.stream_info(subjects.BRIEFS_STREAM, subjects_filter=f"briefs.{site}.>")
    return not info.state.subjects


async def test_nkey_seed_file_authenticates(tmp_path, site):
    nkeys = pytest.importorskip("nkeys")
    seed = nkeys.encode_seed(uuid.uuid4().bytes * 2, nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    seed_file = tmp_path / "router.nk"
    seed_file.write_bytes(seed)
    config = f'authorization {{ users = [ {{nkey: "{public}"}} ] }}'
    with nats_server_with_config(config) as url:
        bus = await connect(BusConfig(url=url, nkey_seed_file=str(seed_file)), name="router")
        try:
            await bus.publish(requested(site, "s1", 1))
            assert len(await bus.read(subjects.conversation(site, "s1"))) == 1
        finally:
            await bus.close()
        with pytest.raises(BusRefused):
            await asyncio.wait_for(connect(BusConfig(url=url), name="anonymous"), 10)


def test_credentials_from_the_environment(monkeypatch, tmp_path):
    for name in ("NATS_CREDS", "NATS_NKEY_SEED", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert BusConfig.from_env().connect_options() == {}
    monkeypatch.setenv("NATS_USER", "router")
    with pytest.raises(ConfigError, match="NATS_USER and NATS_PASSWORD"):
        BusConfig.from_env()
    monkeypatch.setenv("NATS_PASSWORD", "s3cret-value")
    config = BusConfig.from_env()
    assert config.connect_options() == {"user": "router", "password": "s3cret-value"}
    assert "s3cret-value" not in repr(config) and "auth='user'" in repr(config)
    monkeypatch.setenv("NATS_TOKEN", "t")
    with pytest.raises(ConfigError, match="one kind"):
        BusConfig.from_env()
    for name in ("NATS_USER", "NATS_PASSWORD", "NATS_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("NATS_CREDS", str(tmp_path / "missing.creds"))
    with pytest.raises(ConfigError, match="NATS_CREDS"):
        BusConfig.from_env()


class _FixedEmbedder:
    """An embedder whose vectors say which text they are for (the bucket's bytes are checked)."""
    version, dim = "fixed", 4

    async def aembed_all(self, texts):
        import numpy as np

        return np.array([[len(t), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)


def test_headers_are_parsed_as_nats_py_parses_them():
    """shared.bus swaps nats-py's header parser for a faster one: the same dict for any block
    (spaces and Unicode around names and values, names with spaces or not ASCII, lines with
    no colon, bytes that are not UTF-8)."""
    import random

    from nats.aio.client import Client

    from shared.bus import _header_lines, _nats_header_lines

    assert Client._parse_header_lines is _header_lines
    assert _nats_header_lines.__module__ == "nats.aio.client"  # nats-py's own, even after a second import
    pieces = [b"Nats-Msg-Id", b"Nats-Sequence", b"a b", b"\xc3\xa9t\xc3\xa9", b"", b" ", b"\t", b":", b": ",
              b"value", b"\xc2\xa0", b"\xe2\x80\x83x", b"\x1c", b"\x0b", b"\xff\xfe", b"1:2", b"\r", b"\n", b"-"]
    rng = random.Random(7)
    for _ in range(3000):
        lines = [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(0, 5))]
        block = b"\r\n".join(lines) + rng.choice([b"", b"\r\n", b"\r\n\r\n"])
        assert _header_lines(block) == _nats_header_lines(block), block


async def test_a_deliverys_place_is_read_from_its_reply_as_nats_py_reads_it(bus, site):
    """`delivery` (the runner's and the feed's parse of a reply subject) agrees with nats-py's
    `msg.metadata` on a real delivery, and on a redelivery; the longer form (a domain and an
    account hash after `$JS.ACK`) too; a reply that is no JetStream delivery is refused."""
    from nats.aio.msg import Msg

    from shared.bus import delivery

    await bus.publish(requested(site, "s1", 1))
    await bus.publish(requested(site, "s1", 2))
    sub = await bus.js.pull_subscribe(subjects.conv(site, "s1", "turn_requested"), durable=unique("place"),
                                      stream=subjects.CONV_STREAM)
    try:
        first, second = await sub.fetch(2, timeout=5)
        await first.nak()
        (again,) = await sub.fetch(1, timeout=5)
        for msg in (first, second, again):
            at, meta = delivery(msg.reply), msg.metadata
            assert (at.consumer, at.delivered, at.stream_seq, at.consumer_seq) == (
                meta.consumer, meta.num_delivered, meta.sequence.stream, meta.sequence.consumer)
        assert delivery(again.reply).delivered == 2 and delivery(second.reply).delivered == 1
    finally:
        await sub.unsubscribe()
    long_form = "$JS.ACK.hub.ACCHASH.CONV.answer_writer.3.1207.88.1732500000000000000.4.r4nd"
    meta = Msg(None, reply=long_form).metadata
    assert tuple(delivery(long_form)) == (meta.consumer, meta.num_delivered, meta.sequence.stream,
                                          meta.sequence.consumer) == ("answer_writer", 3, 1207, 88)
    for reply in ("_INBOX.abc.1", "", "$JS.ACK.CONV.node.1.2", "$JS.ACK.CONV.node.1.2.3.4.5.6"):
        with pytest.raises(ValueError):
            delivery(reply)


async def test_sources_under_the_production_permissions(secured_nats, site):
    """Knowledge sources under deploy/nats-server.conf: the gateway defines a source, stores
    an upload and asks for a run; the retriever plans it, queues and takes its page, stages
    the text, ends the run and stores the vectors of its sentences; neither may write the
    other's events."""
    import msgspec

    from services.retriever.sources import fetcher, planner
    from shared.web import WebClient
    from shared import sources

    gateway, retriever = [await as_service(secured_nats, n) for n in ("gateway", "retriever")]
    try:
        data = b"# Warranty\n\nThree years on every sensor.\n"
        spec = sources.file_spec("warranty.md", len(data))
        spec = msgspec.structs.replace(spec, upload=sources.upload_key(site, spec.id, spec.name))
        await sources.Staging(gateway).upload(spec.upload, data)
        await sources.define(gateway, site, spec, "test")
        requested_run, _ = await sources.request_sync(gateway, site, spec.id, "added")
        staging = sources.Staging(retriever)
        assert await staging.uploaded(spec.upload) == data

        class NoKnowledge:
            async def ready(self, site):
                pass

            def registry(self, site):
                return {}

        web = WebClient("Test")  # a file source: nothing fetched from the network
        runner = ConsumerRunner(retriever, planner.make_node(web, NoKnowledge()), fast(), start_lookback_s=5)
        fetch = ConsumerRunner(retriever, fetcher.make_node(web, staging), fast(), start_lookback_s=5)
        await runner.start()
        await fetch.start()
        try:
            async def fetched():
                return await retriever.last(subjects.conv(site, sources.session_of(spec.id), "page_fetched"))

            await wait_for(fetched, timeout=20, what="the page fetched")
            page = await fetched()
            assert page.outcome == "changed" and (await staging.staged(page.staged)).text.startswith("# Warranty")
        finally:
            await runner.stop()
            await fetch.stop()
            await web.close()
        await retriever.publish(ev.SyncCompleted(event_id=ev.new_id(), site=site, session_id=requested_run.session_id,
                                                 turn=1, ts=ev.now()))
        # A run that changed the knowledge base stores its sentences' vectors (shared/kb_vectors.py).
        kv = await retriever.js.key_value(subjects.KB_VECTORS_BUCKET)
        await kv.put(f"{site}.{'0' * 48}", bytes(16))
        with pytest.raises(nats.errors.TimeoutError):
            await gateway.js.publish(subjects.conv(site, requested_run.session_id, "sync_completed"), b"{}", timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await retriever.js.publish(subjects.conv(site, "s1", "turn_requested"), b"{}", timeout=0.5)
    finally:
        for bus in (gateway, retriever):
            await bus.close()


async def test_partitioned_retrieval_under_the_production_permissions(secured_nats, site):
    """RETRIEVER_PARTITIONS under deploy/nats-server.conf: the retriever makes the partition
    stream the server sources from CONV, joins the members bucket, takes its partitions,
    answers a visitor's turn from one and leaves the bucket when it stops."""
    from shared import partitions
    from shared.consumer import ConsumerRunner
    from shared.partitions import PartitionedRunner

    gateway, retriever = [await as_service(secured_nats, n) for n in ("gateway", "retriever")]
    try:
        async def retrieve(event, inputs, ctx):
            return [ctx.follow(ev.RetrievalCompleted, query=event.message)] if event.site == site else []

        node = Node("retrieval", ("turn_requested",), retrieve, partitions=4)
        replica = PartitionedRunner(retriever, node, lambda p: ConsumerRunner(
            retriever, node, fast(), start_lookback_s=5, partition=p), "r1", ttl_s=3.0, lookback_s=5)
        await replica.start()
        try:
            assert replica.owned == {0, 1, 2, 3} and replica.bound
            await gateway.publish(ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="s1", turn=1,
                                                   ts=ev.now(), producer="test", message="pricing?"))
            done = await wait_for(lambda: gateway.last(subjects.conv(site, "s1", "retrieval_completed")), 10,
                                  "the turn's retrieval from its partition")
            assert done.query == "pricing?"
        finally:
            await replica.stop()
        assert await replica.membership.live() == []  # left: its partitions free at once
    finally:
        for bus in (gateway, retriever):
            await bus.close()
