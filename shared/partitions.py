"""Partitions: a node's events split by site across its replicas, each site's at one replica.

A node whose state is per site and costly to hold (the retriever's `retrieval`: a site's
knowledge base opened on its first question, kept open while asked) sets `Node.partitions`
to P > 0. Its events are then not taken from one durable on CONV shared by every replica.
The server copies them (a stream source with a subject transform) into a work-queue
stream of the node's own, `PART_<NODE>`, under `part.<p>.<the event's CONV subject>`, where
p = FNV-1a(site) mod P is the transform's `partition(P, 1)` (`partition_of` computes the
same); each partition has a durable of its own (`<node>-p<p>`).

Which replica consumes which partition is agreed through the bucket `partition_members`:
every replica puts its key `<node>.<member>` every TTL/3 (the bucket forgets a key TTL
after its last put) and lists the live keys; with the members sorted, partition p is
`members[p % n]`'s. A replica that stops removes its key, so its partitions move at once;
one that dies has them moved when its key expires. While partitions move, two replicas may
both fetch from one durable for a moment: each message still goes to one of them (and
handlers are idempotent anyway); what a dead replica took and never acked comes back after
the node's ack_wait. Nothing waits longer than the key's TTL plus ack_wait for an owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import time
from typing import Callable

import nats.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError

from shared import metrics, subjects
from shared.bus import ALREADY_EXISTS, BUS_UNAVAILABLE, Bus, ensure_bucket

log = logging.getLogger(__name__)
# A cluster electing the leaders of what every replica has just created answers late at
# start: the partition stream and the members bucket are asked for this many times (as
# consumer.START_ATTEMPTS).
START_ATTEMPTS = 6

MEMBERS_BUCKET = "partition_members"
PREFIX = "part"
# A copy no replica took within this long belongs to a turn long ended (the gateway's stall
# clock failed it): the partition stream does not keep it for ever.
MAX_AGE_S = 3600.0
SOURCE_HEADER = "Nats-Stream-Source"


def partition_of(site: str, count: int) -> int:
    """The partition the server gives `site` (its subject transform's `partition(count, 1)`:
    FNV-1a 32 of the token, modulo the count)."""
    h = 0x811C9DC5
    for byte in site.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % count


def stream_name(node: str) -> str:
    return f"PART_{node.upper()}"


def durable(node: str, partition: int) -> str:
    return f"{node}-p{partition}"


def filter_subject(partition: int) -> str:
    return f"{PREFIX}.{partition}.>"


def original_subject(subject: str) -> str:
    """`part.<p>.conv.<site>.<session>.<type>` → the event's CONV subject."""
    return subject.split(".", 2)[2]


def source_seq(msg: Msg) -> int:
    """A partition's copy of an event: its sequence in CONV (from the header the server puts
    on what it sources: `<stream> <seq> <filter> <transform> <subject> ...`; 0 when absent)."""
    source = (msg.headers or {}).get(SOURCE_HEADER, "").split()
    return int(source[1]) if len(source) > 1 and source[0] == subjects.CONV_STREAM and source[1].isdigit() else 0


def stream_config(node: str, consumes: tuple[str, ...], count: int, replicas: int,
                  start: float | None = None) -> api.StreamConfig:
    """The node's partition stream: CONV's events of the types it consumes, each under its
    site's partition; sourced from `start` (a UNIX time) on, when given."""
    transforms = [api.SubjectTransform(
        src=subjects.conv_of_type(kind),
        dest=f"{PREFIX}.{{{{partition({count},1)}}}}.conv.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{kind}")
        for kind in consumes]
    source = api.StreamSource(name=subjects.CONV_STREAM, subject_transforms=transforms)
    if start is not None:
        source.opt_start_time = datetime.datetime.fromtimestamp(start, datetime.timezone.utc)
    return api.StreamConfig(name=stream_name(node), subjects=[], sources=[source],
                            retention=api.RetentionPolicy.WORK_QUEUE, storage=api.StorageType.FILE,
                            max_age=MAX_AGE_S, num_replicas=replicas)


def _transforms(config: api.StreamConfig) -> list[tuple[str, str]]:
    source = (config.sources or [None])[0]
    return [(t.src, t.dest) for t in (source.subject_transforms or [])] if source is not None else []


async def ensure_stream(bus: Bus, node: str, consumes: tuple[str, ...], count: int, lookback_s: float) -> None:
    """Create the node's partition stream (sourcing the last `lookback_s` of the log, as a
    new durable on CONV starts), or bring its partition count and types up to date, keeping
    where its source started: only when they changed (every replica starting asks, and an
    update on a cluster still electing the stream's leader can take past a request's
    timeout). Partitions past a lowered count lose their durables; whatever those still
    held is logged (its turns ended by the gateway's stall clock)."""
    config = stream_config(node, consumes, count, bus.config.replicas, time.time() - lookback_s)
    try:
        await bus.js.add_stream(config)
        return
    except BadRequestError as exc:
        if exc.err_code != ALREADY_EXISTS:
            raise
    current = await bus.js.stream_info(config.name)
    if _transforms(current.config) != _transforms(config):
        old = (current.config.sources or [None])[0]
        if old is not None:
            config.sources[0].opt_start_time = old.opt_start_time
            config.sources[0].opt_start_seq = old.opt_start_seq
        await bus.js.update_stream(config)
    for info in await bus.js.consumers_info(config.name):
        name = info.name or ""
        tail = name.rpartition("-p")[2]
        if name.startswith(f"{node}-p") and tail.isdigit() and int(tail) >= count:
            log.warning("partition past the count removed", extra={
                "node": node, "durable": name, "pending": info.num_pending, "partitions": count})
            with contextlib.suppress(NotFoundError):
                await bus.js.delete_consumer(config.name, name)


def assignment(members: list[str], me: str, count: int) -> frozenset[int]:
    """The partitions `me` consumes among `members` (members[p % n] takes p, sorted)."""
    ordered = sorted(set(members))
    if me not in ordered:
        return frozenset()
    return frozenset(p for p in range(count) if ordered[p % len(ordered)] == me)


def member_name() -> str:
    """A replica's name among its node's when PARTITION_MEMBER names none: the host's name (a
    pod's) and the process id."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Membership:
    """This replica's key in the members bucket, put every `ttl_s / 3`, and the node's live
    members listed after each put. `changed(members)` is called when they change."""

    def __init__(self, bus: Bus, node: str, me: str, ttl_s: float,
                 changed: Callable[[list[str]], "asyncio.Future | None"]):
        self.bus, self.node, self.me, self.ttl_s = bus, node, me, ttl_s
        self._changed = changed
        self.members: list[str] = []
        self._kv = None
        self._task: asyncio.Task | None = None

    @property
    def key(self) -> str:
        return f"{self.node}.{self.me}"

    async def join(self) -> list[str]:
        """Put this replica's key and list the members (itself among them)."""
        self._kv = await ensure_bucket(self.bus, MEMBERS_BUCKET, self.ttl_s)
        await self.beat()
        self._task = asyncio.create_task(self._beating(), name=f"partition-members-{self.node}")
        return self.members

    async def beat(self) -> None:
        await self._kv.put(self.key, str(time.time()).encode())
        members = await self.live()
        if members != self.members:
            await self._changed(members)  # when it fails, the next beat tries again
            self.members = members

    async def live(self) -> list[str]:
        """The members whose key has not expired (the bucket's stream holds a subject per live
        key: a leaving member purges its subject rather than leaving a delete marker)."""
        info = await self.bus.js.stream_info(f"KV_{MEMBERS_BUCKET}",
                                             subjects_filter=f"$KV.{MEMBERS_BUCKET}.{self.node}.>")
        prefix = f"$KV.{MEMBERS_BUCKET}.{self.node}."
        return sorted(subject[len(prefix):] for subject in (info.state.subjects or {}))

    async def _beating(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                # Unheard, this replica's key expires and its partitions go to the others;
                # it keeps consuming its own meanwhile (a message still goes to one of them).
                log.warning("partition membership not renewed", extra={"node": self.node, "error": repr(exc)})
            except Exception:
                log.exception("partition membership failed", extra={"node": self.node})

    async def leave(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._kv is not None and self.bus.nc.is_connected:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self.bus.js.purge_stream(f"KV_{MEMBERS_BUCKET}", subject=f"$KV.{MEMBERS_BUCKET}.{self.key}")


class PartitionedRunner:
    """What a service runs for a partitioned node, in place of one ConsumerRunner: a runner
    per partition this replica owns (started and stopped as members come and go), the
    membership that decides them, and `node.on_partitions(owned, count)` told of each change
    (the retriever closes the sites it no longer serves)."""

    def __init__(self, bus: Bus, node, make_runner: Callable[[int], "object"], member: str, ttl_s: float,
                 lookback_s: float):
        self.bus, self.node = bus, node
        self.count = node.partitions
        self._make_runner = make_runner
        self._lookback_s = lookback_s
        self.membership = Membership(bus, node.name, member, ttl_s, self._rebalance)
        self.runners: dict[int, object] = {}
        self.moves = 0  # partitions taken or given up since start
        self._lock = asyncio.Lock()
        self._stopping = False

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self.runners)

    @property
    def bound(self) -> bool:
        """Ready: a member, and every partition it owns bound (a replica may own none: more
        replicas than partitions)."""
        return bool(self.membership.members) and all(r.bound for r in self.runners.values())

    async def start(self) -> None:
        """The partition stream made (or checked) and this replica a member. A cluster that
        has just made the stream or the members bucket answers nothing until it has elected
        their leaders (no responders, no response from the stream, a timeout): asked again,
        START_ATTEMPTS times, as a durable is."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                await ensure_stream(self.bus, self.node.name, self.node.consumes, self.count, self._lookback_s)
                await self.membership.join()
                break
            except (asyncio.TimeoutError, *BUS_UNAVAILABLE) as exc:
                if attempt == START_ATTEMPTS:
                    raise
                log.warning("partition stream or members bucket not answering at start; asking again",
                            extra={"node": self.name, "attempt": attempt, "error": repr(exc)})
                await asyncio.sleep(attempt)
        log.info("partitioned consumer started", extra={
            "node": self.name, "member": self.membership.me, "members": self.membership.members,
            "partitions": sorted(self.owned), "of": self.count})

    async def _rebalance(self, members: list[str]) -> None:
        async with self._lock:
            if self._stopping:
                return
            wanted = assignment(members, self.membership.me, self.count)
            if not members or self.membership.me not in members:
                return  # not listed (our own key not renewed): keep what we have until we are
            gone = [p for p in self.runners if p not in wanted]
            new = sorted(p for p in wanted if p not in self.runners)
            if not gone and not new:
                return
            await asyncio.gather(*(self.runners.pop(p).stop() for p in gone))
            for p in new:
                runner = self._make_runner(p)
                await runner.start()
                self.runners[p] = runner
            self.moves += len(gone) + len(new)
            metrics.partition_moves.labels(self.name).inc(len(gone) + len(new))
            metrics.partitions_owned.labels(self.name).set(len(self.runners))
            log.info("partitions moved", extra={
                "node": self.name, "members": members, "taken": new, "given_up": sorted(gone),
                "owned": sorted(self.runners)})
            if self.node.on_partitions is not None:
                await self.node.on_partitions(self.owned, self.count)

    async def check(self) -> bool:
        results = await asyncio.gather(*(r.check() for r in self.runners.values()))
        pending = [r.pending for r in self.runners.values()]
        metrics.node_pending.labels(self.name).set(sum(p[0] for p in pending))
        metrics.node_ack_pending.labels(self.name).set(sum(p[1] for p in pending))
        metrics.node_ready.labels(self.name).set(1 if self.bound else 0)
        return all(results)

    async def stop(self) -> None:
        """Leave first (the other members take the partitions now), then stop each runner
        (in flight finished, fetched but not started given back)."""
        async with self._lock:
            self._stopping = True
        await self.membership.leave()
        await asyncio.gather(*(r.stop() for r in self.runners.values()))
        self.runners.clear()
