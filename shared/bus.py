"""The bus: NATS connection, streams and KV buckets, publishing and reading the log.

Everything here is I/O. Publishing always sets `Nats-Msg-Id` to the event id, so a
repeated publish inside the dedupe window is dropped by the server; publishing a
`TurnRequested` can also require that the conversation has not moved on (optimistic
concurrency), so two gateways cannot start the same turn.

Reading the log uses direct gets, which every replica of an R3 stream answers, followers
included: a follower that has not yet stored the newest events answers without them. A
node acting on an event must not read a log older than that event (issue #17: the
intent router, reading a lagging replica, saw two of a turn's three analyses on each of
their deliveries and never routed the turn). A read given the `Position` of the event
being acted on (`at`: the conversation store passes it for every handler's read) that should
include it and came back without it is made again until the replica has caught up, or fails
with `StaleRead`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (APIError, BadRequestError, BucketNotFoundError, NoStreamResponseError, NotFoundError,
                            ServiceUnavailableError)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from nats.errors import NoRespondersError

from shared import events as ev
from shared import metrics
from shared import subjects
from shared import telemetry
from shared.config import BusConfig
from shared.state import Record

log = logging.getLogger(__name__)

# JetStream error codes: a failed Nats-Expected-Last-Subject-Sequence check; a stream or
# bucket that already exists with another configuration.
WRONG_LAST_SEQUENCE = 10071
ALREADY_EXISTS = 10058
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # nats-server's default


# How often a read that came back from a replica behind the event being handled is made again.
BEHIND_RETRY_S = 0.05
# The bus did not answer: no response from a stream (one whose leader died has none for a
# raft election, 4-9 s), no responders, a timeout, a 503. Worth asking again a little later.
BUS_UNAVAILABLE = (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError,
                   ServiceUnavailableError)


class ConcurrencyConflict(Exception):
    """The conversation changed since it was read: someone else started this turn."""


class StaleRead(Exception):
    """The replica answering reads stayed behind the event being handled for longer than
    the request timeout. Not the handler's fault: it is retried like any other failure."""


@dataclass(frozen=True)
class Position:
    """Where an event sits in the log: its subject and stream sequence. A read given the
    position of the event being acted on sees the log at least up to it: everything stored
    before it, its causes included, even from a replica that had not stored it when asked."""

    subject: str
    seq: int


class Delivery(NamedTuple):
    """Where a delivered JetStream message sits, as its reply subject says."""

    consumer: str
    delivered: int  # how many times it has been delivered (1 the first time)
    stream_seq: int
    consumer_seq: int


def delivery(reply: str) -> Delivery:
    """A delivered message's place, from its reply subject `$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>.<consumer seq>.<time>.<pending>` (or with a domain and an
    account hash after `$JS.ACK`). nats-py's `msg.metadata` parses the same into objects and
    a datetime, work the runner and the log feed would do for every delivery for nothing."""
    tokens = reply.split(".")
    if not (len(tokens) == 9 or len(tokens) >= 11) or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise ValueError(f"not a JetStream delivery: reply subject {reply!r}")
    at = 2 if len(tokens) == 9 else 4
    return Delivery(tokens[at + 1], int(tokens[at + 2]), int(tokens[at + 3]), int(tokens[at + 4]))


@dataclass
class _BatchAnswer:
    """A batched direct get's answer as it arrives: the stored messages, then a status
    message (204 end of batch, 404 nothing found, or an error) that completes it."""

    done: asyncio.Future
    found: list[Msg] = field(default_factory=list)

    def take(self, msg: Msg) -> None:
        if self.done.done():
            return
        if msg.headers and msg.headers.get("Status"):
            self.done.set_result(msg)
        else:
            self.found.append(msg)


@dataclass
class Bus:
    nc: NATS
    js: JetStreamContext
    config: BusConfig
    kv: dict[str, KeyValue] = field(default_factory=dict)
    _read_prefix: str | None = None
    _read_counter: int = 0
    _read_answers: dict[str, "_BatchAnswer"] = field(default_factory=dict)  # reads under way, by reply token

    # --- publishing ---------------------------------------------------------------------

    @property
    def max_event_bytes(self) -> int:
        """How big an event may be encoded: three quarters of the server's `max_payload`
        (1 MiB when the server did not say), leaving room for headers and for the server's
        limit being lowered later."""
        return (self.nc.max_payload or DEFAULT_MAX_PAYLOAD) * 3 // 4

    async def publish(self, event: ev.Envelope, expected_subject_seq: int | None = None) -> api.PubAck:
        """Append an event to the conversation log. Returns the ack (its `seq`, `duplicate`)."""
        subject = subjects.conv(event.site, event.session_id, ev.event_type(event))
        headers = {"Nats-Msg-Id": event.event_id}
        telemetry.inject(headers)
        if expected_subject_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_subject_seq)
        try:
            return await self.js.publish(subject, ev.encode(event), headers=headers, stream=subjects.CONV_STREAM)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise ConcurrencyConflict(f"{subject}: expected last sequence {expected_subject_seq}") from exc
            raise

    async def publish_work(self, item: ev.BriefRequested | ev.TriageRequested) -> api.PubAck:
        """Queue a work item on the BRIEFS work queue (deduplicated by its id like any event)."""
        subject = subjects.work(item.site, item.session_id, ev.event_type(item))
        headers = {"Nats-Msg-Id": item.event_id}
        telemetry.inject(headers)
        return await self.js.publish(subject, ev.encode(item), headers=headers, stream=subjects.BRIEFS_STREAM)

    async def publish_token(self, chunk: ev.TokenChunk | ev.SourcesAttached) -> None:
        """Token chunks (and the sources sent ahead of them) go out as plain publishes: the
        TOKENS stream captures them for later reading, and the gateway, already subscribed,
        gets them without a round trip."""
        subject = subjects.tokens(chunk.site, chunk.session_id, chunk.turn)
        await self.nc.publish(subject, ev.encode(chunk), headers={"Nats-Msg-Id": chunk.event_id})

    async def dead_letter(self, node: str, msg: Msg, reason: str, subject: str | None = None) -> None:
        """`subject`: where the event was stored when `msg` is a copy of it (a partition's)."""
        headers = {
            "Concierge-Reason": reason[:1024],
            "Concierge-Subject": subject or msg.subject,
            "Concierge-Node": node,
        }
        if msg.headers and "Nats-Msg-Id" in msg.headers:
            headers["Nats-Msg-Id"] = f"dlq:{node}:{msg.headers['Nats-Msg-Id']}"
        await self.js.publish(subjects.dlq(node), msg.data, headers=headers, stream=subjects.DLQ_STREAM)

    # --- reading the log ----------------------------------------------------------------

    async def read(self, filter_subject: str, after_seq: int = 0, batch: int = 256,
                   at: Position | None = None) -> list[Record]:
        """All stored events on `filter_subject` with sequence > `after_seq`, in order (up to
        `at` at least, when its subject is one the filter covers: see `Position`).

        Uses JetStream's batched direct get (one request per `batch` events) instead of
        a consumer, so reading a conversation costs no server-side state. Events that do not
        decode, or whose envelope disagrees with their subject, are logged and left out:
        no state is folded from them.
        """
        records: list[Record] = []
        async for seq, subject, data in self.read_raw(filter_subject, after_seq, batch, at=at):
            if (event := stored_event(seq, subject, data)) is not None:
                records.append(Record(seq=seq, subject=subject, event=event))
        return records

    async def newest(self, *subjects_: str) -> ev.Event | None:
        """The newest (by its time) of the last events stored on these subjects, or None: a
        log's latest outcome when it has several kinds (a completion or a give-up)."""
        found = [await self.last(subject) for subject in subjects_]
        return max((e for e in found if e is not None), key=lambda e: e.ts, default=None)

    async def last(self, subject: str, at: Position | None = None) -> ev.Event | None:
        """The newest stored event on one subject (a direct get), or None (also when that
        event's envelope disagrees with the subject: it is logged, not trusted). `at`: from a
        replica that has stored that position."""
        floor = at
        if floor is None:
            try:
                msg = await self.js.get_msg(subjects.CONV_STREAM, subject=subject, direct=True)
            except NotFoundError:
                return None
            data, stored_subject = msg.data, msg.subject
        else:
            data, stored_subject = await self._last_from(subject, floor)
            if data is None:
                return None
        event = ev.decode(data)
        if mismatch := ev.subject_mismatch(event, stored_subject or subject):
            log.error("event on the wrong subject ignored", extra={"subject": subject, "error": mismatch})
            return None
        return event

    async def _last_from(self, subject: str, floor: Position) -> tuple[bytes | None, str | None]:
        """`last` from a replica that has stored the event being handled: the last message of
        `subject` and of the floor's subject in one answer, whose sequences (and the
        replica's last sequence, `Nats-UpTo-Sequence`) say whether it is that far."""
        waited = None
        while True:
            found, end = await self._direct_batch(
                subjects.CONV_STREAM, {"multi_last": [subject, floor.subject], "batch": 2})
            reached = max([int(m.headers["Nats-Sequence"]) for m in found]
                          + [int((end.headers or {}).get("Nats-UpTo-Sequence", 0)) if end else 0])
            if reached >= floor.seq:
                self._log_wait(waited, subject, floor)
                mine = [m for m in found if m.headers["Nats-Subject"] == subject]
                return (mine[0].data, subject) if mine else (None, None)
            waited = await self._wait_behind(waited, subject, floor)

    async def _wait_behind(self, waited: float | None, what: str, floor: Position) -> float:
        """A read came back from a replica behind the event being handled: pause before
        reading again, or give up after the request timeout. When the waiting began."""
        now = time.monotonic()
        waited = now if waited is None else waited
        if now - waited > self.config.request_timeout:
            raise StaleRead(f"{what}: the replica answering reads is still behind sequence {floor.seq} "
                            f"({floor.subject}) after {now - waited:.1f} s")
        await asyncio.sleep(BEHIND_RETRY_S)
        return waited

    @staticmethod
    def _log_wait(waited: float | None, what: str, floor: Position) -> None:
        """A read that had to wait says so: how far replicas lag shows in the logs."""
        if waited is not None:
            log.info("read waited for a replica behind the event being handled", extra={
                "filter": what, "floor_seq": floor.seq, "waited_s": round(time.monotonic() - waited, 3)})

    async def _direct_batch(self, stream: str, request: dict) -> tuple[list[Msg], Msg | None]:
        """One batched direct get: the messages, and the end-of-batch status message (None
        when the server found nothing: 404). The reply subscription gathers the answer and
        wakes this read once, at its end (a wait per message was a task and a timer each)."""
        prefix = await self._read_inbox()
        metrics.log_reads.labels(stream).inc()
        self._read_counter += 1
        token = str(self._read_counter)
        answer = _BatchAnswer(asyncio.get_running_loop().create_future())
        self._read_answers[token] = answer
        try:
            await self.nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(),
                                  reply=f"{prefix}.{token}")
            try:
                end = await asyncio.wait_for(answer.done, self.config.request_timeout)
            except asyncio.TimeoutError:
                raise nats.errors.TimeoutError from None
            status = end.headers.get("Status") if end.headers else None
            if status == "404":
                return answer.found, None
            if status == "204":  # end of batch
                return answer.found, end
            raise RuntimeError(f"direct get {request}: status {status} {end.headers}")
        finally:
            self._read_answers.pop(token, None)

    async def _read_inbox(self) -> str:
        """One long-lived reply subscription for every log read (replies routed by the last
        token of the reply subject), instead of a subscribe/unsubscribe pair per read:
        two fewer protocol writes per read, which is most of a read's cost."""
        if self._read_prefix is None:
            prefix = self.nc.new_inbox()

            async def route(msg):
                answer = self._read_answers.get(msg.subject.rsplit(".", 1)[-1])
                if answer is not None:
                    answer.take(msg)

            await self.nc.subscribe(f"{prefix}.*", cb=route)
            self._read_prefix = prefix
        return self._read_prefix

    async def read_raw(self, filter_subject: str, after_seq: int = 0, batch: int = 256,
                       stream: str = subjects.CONV_STREAM, at: Position | None = None):
        """(seq, subject, data) of the stored messages on `filter_subject`, in order: the
        conversation log by default, or another stream that allows direct gets (TOKENS).
        Given `at`, a read of the log whose filter covers that position goes on until it has
        reached it."""
        floor = at
        if not (floor and stream == subjects.CONV_STREAM and floor.seq > after_seq
                and subjects.matches(filter_subject, floor.subject)):
            floor = None
        next_seq, waited = after_seq + 1, None
        while True:
            found, end = await self._direct_batch(stream, {"seq": next_seq, "next_by_subj": filter_subject,
                                                           "batch": batch})
            for msg in found:
                seq = int(msg.headers["Nats-Sequence"])
                next_seq = seq + 1
                yield seq, msg.headers["Nats-Subject"], msg.data
            if end is not None and len(found) == batch:
                continue  # a full batch: there may be more
            if floor is None or next_seq > floor.seq:
                if floor is not None:
                    self._log_wait(waited, filter_subject, floor)
                return
            waited = await self._wait_behind(waited, filter_subject, floor)

    # --- key/value ----------------------------------------------------------------------

    def bucket(self, name: str) -> KeyValue:
        return self.kv[name]

    async def close(self, timeout: float = 5.0) -> None:
        """Drain (flush what was published, end subscriptions) when connected; otherwise,
        or when draining takes too long, just close."""
        if self.nc.is_closed:
            return
        if self.nc.is_connected:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout)
                return
            except (asyncio.TimeoutError, nats.errors.Error):
                log.warning("drain did not finish; closing")
        await self.nc.close()


_HEADER_SPACE = " \t\n\r\x0b\x0c"  # what bytes.strip strips


def stored_event(seq: int, subject: str, data: bytes) -> ev.Event | None:
    """A stored message's event, or None (logged) when it does not decode or its envelope
    disagrees with its subject: no state is folded from such a message (`Bus.read`, the
    log feed)."""
    try:
        event = ev.decode(data)
    except ev.BadEvent as exc:
        log.error("undecodable event in log", extra={"subject": subject, "seq": seq, "error": str(exc)})
        return None
    if mismatch := ev.subject_mismatch(event, subject):
        log.error("event on the wrong subject skipped", extra={"subject": subject, "seq": seq, "error": mismatch})
        return None
    return event


def _header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's `Client._parse_header_lines` (nats-py 2.16, pinned), the same dict for any
    header block, with less work: the block is decoded once rather than line by line, and
    a header name is checked for spaces by `isprintable` (C) rather than a generator over its
    characters. Every message a service gets carries headers (a log read's each carry seven),
    so their parsing is on every message's path. A block that is not UTF-8 goes to nats-py's
    own parser (which replaces the bad bytes value by value)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return _nats_header_lines(raw)
    out: dict[str, str] = {}
    for line in text.split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep:
            continue
        name = name.strip(_HEADER_SPACE)
        if not name.isascii():
            continue  # nats-py: a name that is not ASCII is skipped
        if not (name.isprintable() and " " not in name) and any(c.isspace() for c in name):
            continue  # nats-py: a name with a space in it is skipped
        out[name] = value.strip(_HEADER_SPACE)
    return out


# nats-py's own, kept on the class once: a second import of this module (a reload) must not
# take the swapped parser for it (its fallback would call itself).
if not hasattr(NATS, "_nats_parse_header_lines"):
    NATS._nats_parse_header_lines = NATS._parse_header_lines
_nats_header_lines = NATS._nats_parse_header_lines
NATS._parse_header_lines = staticmethod(_header_lines)


class BusRefused(Exception):
    """The NATS server refused this process's credentials: a configuration error that no
    retry mends (the start-up connect would otherwise retry for ever)."""


async def connect(config: BusConfig, name: str, topology: bool = True) -> Bus:
    """Connect with unlimited reconnects and make sure streams and buckets exist. `config.url`
    may list several servers (NATS_URL="nats://a:4222,nats://b:4222"): the client connects to
    one of them and, when it goes, reconnects to another (or to any the cluster announced
    since). Credentials
    come from `config` (NATS_CREDS, NATS_NKEY_SEED, NATS_USER/NATS_PASSWORD or NATS_TOKEN);
    a server that refuses them at start raises `BusRefused` instead of being retried.
    `topology=False`: streams and buckets are left as they are (a tool that only reads or
    writes one bucket does not bring the bus to its own settings)."""
    refused: asyncio.Future = asyncio.get_running_loop().create_future()
    connected: dict[str, Bus] = {}

    async def on_disconnect():
        if not (nc.is_closed or nc.is_draining):
            log.warning("nats disconnected", extra={"client": name})

    async def on_reconnect():
        log.info("nats reconnected", extra={"client": name})
        if "bus" in connected:  # a restarted server may have lost a memory stream (TOKENS)
            asyncio.ensure_future(_ensure_again(connected["bus"], name))

    async def on_error(exc):
        log.error("nats error", extra={"client": name, "error": repr(exc)})
        if "authorization violation" in str(exc).lower() and not refused.done():
            refused.set_result(exc)

    nc = NATS()
    connecting = asyncio.ensure_future(nc.connect(
        servers=config.servers(),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=config.request_timeout,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        error_cb=on_error,
        **config.connect_options(),
    ))
    await asyncio.wait({connecting, refused}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        await nc.close()
        raise BusRefused(f"NATS at {config.url} refused {name}'s credentials (auth: {config.auth_method()}): "
                         f"{refused.result()}")
    connecting.result()
    js = nc.jetstream(timeout=config.request_timeout)
    bus = Bus(nc=nc, js=js, config=config)
    if topology:
        await ensure_topology(bus)
    connected["bus"] = bus
    return bus


async def _ensure_again(bus: Bus, name: str, attempts: int = 10) -> None:
    """After a reconnect: create whatever streams and buckets the server no longer has, so
    readiness comes back by itself (no restart of the services)."""
    for attempt in range(1, attempts + 1):
        try:
            await ensure_topology(bus)
            log.info("topology ensured after reconnect", extra={"client": name})
            return
        except Exception as exc:  # noqa: BLE001 - the server may still be electing or recovering
            log.warning("topology not ensured yet after reconnect", extra={"client": name, "error": repr(exc)})
            await asyncio.sleep(min(0.5 * attempt, 3.0))


# The configs a site's key keeps (the most a key-value bucket keeps per key).
SITE_CONFIG_HISTORY = 64


async def ensure_topology(bus: Bus) -> None:
    """Create or update every stream and bucket. Safe to run from every replica at once."""
    cfg = bus.config
    await _ensure_stream(
        bus.js,
        api.StreamConfig(
            name=subjects.CONV_STREAM,
            subjects=[subjects.CONV_SUBJECTS],
            storage=api.StorageType.FILE,
            duplicate_window=cfg.dedupe_window_s,
            allow_direct=True,
            num_replicas=cfg.replicas,
            max_age=cfg.conv_max_age_s or None,
        ),
    )
    await _ensure_stream(
        bus.js,
        api.StreamConfig(
            name=subjects.TOKENS_STREAM,
            subjects=[subjects.TOKENS_SUBJECTS],
            storage=api.StorageType.MEMORY,
            max_age=cfg.tokens_max_age_s,
            max_bytes=cfg.tokens_max_bytes,
            duplicate_window=min(cfg.dedupe_window_s, cfg.tokens_max_age_s),
            allow_direct=True,
            num_replicas=cfg.replicas,
        ),
    )
    await _ensure_stream(
        bus.js,
        api.StreamConfig(
            name=subjects.DLQ_STREAM,
            subjects=[subjects.DLQ_SUBJECTS],
            storage=api.StorageType.FILE,
            max_age=cfg.dlq_max_age_s,
            num_replicas=cfg.replicas,
        ),
    )
    await _ensure_stream(
        bus.js,
        api.StreamConfig(
            name=subjects.BRIEFS_STREAM,
            subjects=[subjects.BRIEFS_SUBJECTS],
            # A work queue: a message is removed once acked, and a subject has one consumer.
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.FILE,
            duplicate_window=cfg.dedupe_window_s,
            num_replicas=cfg.replicas,
        ),
    )
    for bucket, ttl, history in (
        # A site's earlier configs too: a replay reruns a turn under the version it recorded.
        (subjects.SITE_CONFIG_BUCKET, None, SITE_CONFIG_HISTORY),
        (subjects.SESSION_GUARD_BUCKET, None, 1),
        (subjects.SNAPSHOT_BUCKET, cfg.snapshot_ttl_s or None, 1),
        (subjects.LEAD_CLAIM_BUCKET, None, 1),  # kept as long as the log that may replay a lead
        (subjects.HANDOFF_CLAIM_BUCKET, None, 1),  # deleted as the handoff ends; a stale one is taken over
        (subjects.HANDOFF_DELIVERY_BUCKET, None, 1),  # as lead_claims: kept as long as the log
        (subjects.KB_VECTORS_BUCKET, cfg.kb_vectors_ttl_s or None, 1),
        (subjects.INSIGHT_BUCKET, None, 1),  # made again from the log: `concierge insight rebuild`
        (subjects.ACCOUNTS_BUCKET, None, 1),  # what operators imported: kept until imported again
    ):
        bus.kv[bucket] = await _ensure_bucket(bus.js, bucket, ttl, cfg.replicas, history,
                                              direct=bucket in (subjects.INSIGHT_BUCKET, subjects.ACCOUNTS_BUCKET))


async def _ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        # Exists with another config (e.g. a changed retention): bring it up to date.
        if exc.err_code == ALREADY_EXISTS:
            await js.update_stream(config)
        else:
            raise


async def _ensure_bucket(js: JetStreamContext, bucket: str, ttl: float | None, replicas: int,
                         history: int = 1, direct: bool = False) -> KeyValue:
    """Create the bucket, or bring an existing one to `replicas` (NATS_REPLICAS raised when
    a single server became a cluster), `ttl`, `history` (the values kept per key) and
    `direct` (direct gets: a reader takes many keys in batches, `Bus.read_raw`): a bucket is
    the stream `KV_<bucket>`."""
    try:
        return await js.create_key_value(bucket=bucket, ttl=ttl, history=history, replicas=replicas, direct=direct)
    except BadRequestError as exc:
        if exc.err_code != ALREADY_EXISTS:
            raise
    info = await js.stream_info(f"KV_{bucket}")
    if (info.config.num_replicas != replicas or abs((info.config.max_age or 0) - (ttl or 0)) > 0.001
            or info.config.max_msgs_per_subject != history or bool(info.config.allow_direct) != direct):
        info.config.num_replicas = replicas
        info.config.max_age = ttl or 0
        info.config.max_msgs_per_subject = history
        info.config.allow_direct = direct
        await js.update_stream(info.config)
        log.info("bucket settings changed",
                 extra={"bucket": bucket, "replicas": replicas, "ttl_s": ttl, "history": history, "direct": direct})
    return await js.key_value(bucket)


async def ensure_bucket(bus: Bus, bucket: str, ttl: float | None) -> KeyValue:
    """A bucket made or brought to `ttl` and the bus's replicas (one a service owns alone)."""
    return await _ensure_bucket(bus.js, bucket, ttl, bus.config.replicas)


async def opened_bucket(bus: Bus, bucket: str, ttl: float | None) -> KeyValue:
    """A bucket as it is, or made when missing, and nothing else of the bus changed."""
    try:
        return await bus.js.key_value(bucket)
    except BucketNotFoundError:
        return await _ensure_bucket(bus.js, bucket, ttl, bus.config.replicas)


async def topology_ready(bus: Bus) -> bool:
    """True when connected and every stream exists: what /readyz reports."""
    if not bus.nc.is_connected:
        return False
    try:
        for name in (subjects.CONV_STREAM, subjects.TOKENS_STREAM, subjects.DLQ_STREAM, subjects.BRIEFS_STREAM):
            await bus.js.stream_info(name)
    except (NotFoundError, NoRespondersError, asyncio.TimeoutError, nats.errors.Error):
        return False
    return True



async def object_store(bus: Bus, bucket: str) -> ObjectStore:
    """A JetStream object store bucket, created when missing (file storage, the bus's stream
    replicas). Safe to call from every replica at once."""
    try:
        return await bus.js.create_object_store(bucket, replicas=bus.config.replicas,
                                                storage=api.StorageType.FILE)
    except BadRequestError as exc:
        if exc.err_code == ALREADY_EXISTS:
            return await bus.js.object_store(bucket)
        raise
