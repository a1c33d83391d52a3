"""The consumer runner: how every node receives events.

One named durable pull consumer per node, shared by all replicas of that node. For each
event that concerns the node, the runner gathers what the node needs (state, config, this
turn's awaited events: shared/node.py) and calls its handler with them. A message is acked
only after the handler returned and its output events are stored.
A handler that raises is retried: `nak` with the configured backoff, up to
`max_deliver` deliveries; a crash (no ack at all) is redelivered by the server after
`ack_wait`. After the last attempt the runner appends the node's failure event (a
`TurnFailed` unless the node names another) to the conversation and copies the message to
`dlq.<node>`; nothing ends in silence. Most nodes consume the conversation log (CONV); a
node may consume a work queue instead (BRIEFS: each item to one replica, gone once acked). A
payload that does not decode, or whose envelope (site, session, type) disagrees with the
subject it came on, is counted, logged with its subject, dead-lettered and terminated; it
never reaches a handler and never stops the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from dataclasses import dataclass, field

import nats.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from shared import events as ev
from shared import logs, metrics, partitions, privacy, subjects, telemetry
from shared.bus import BUS_UNAVAILABLE, Bus, Position, delivery
from shared.config import ConsumerConfig
from shared.node import Context, Later, Node, PermanentError, gather
from shared.site_config import SiteConfigs
from shared.store import ConversationStore, JetStreamStore

log = logging.getLogger(__name__)
OUTCOMES = ("ok", "retried", "deferred", "failed", "dead_lettered", "mismatched")  # concierge_node_events_total{outcome}
TRACER = telemetry.tracer("concierge.consumer")  # a proxy: follows the provider telemetry.setup sets

FETCH_TIMEOUT_S = 2.0
# A cluster electing leaders for the durables every replica has just created (or a loaded
# machine) answers JetStream requests late: at start a durable is asked for this many times.
START_ATTEMPTS = 6
# A stream whose leader died has none for a raft election timeout (4-9 s in nats-server):
# a handler that failed because the bus did not answer is retried this far apart, so its
# attempts outlast an election instead of being spent inside one (a lead never delivered).
BUS_RETRY_S = 5.0


class Overdue(Exception):
    """A handler ran past its node's `handler_deadline_s`."""


@dataclass
class Stats:
    handled: int = 0
    retried: int = 0
    failed: int = 0
    bad_events: int = 0  # undecodable, or on a subject its envelope disagrees with
    mismatched: int = 0  # of those, the envelope-subject disagreements
    in_flight: int = 0


@dataclass
class ConsumerRunner:
    bus: Bus
    node: Node
    config: ConsumerConfig
    configs: SiteConfigs | None = None  # the site configs nodes that need one are handed
    # Where the node's inputs are read (None: from the bus each time; a service passes its
    # process's CachedStore).
    store: ConversationStore | None = None
    start_lookback_s: float = 300.0
    stats: Stats = field(default_factory=Stats)
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _loop_task: asyncio.Task | None = None
    _advisory_sub: object | None = None
    _stopping: bool = False
    bound: bool = False  # the durable answered at start or at the last `check` (/readyz)
    # One partition of a partitioned node's events (shared/partitions.py: its own durable on
    # the node's partition stream), or None: the node's one durable on its stream.
    partition: int | None = None
    pending: tuple[int, int] = (0, 0)  # the durable's pending and ack-pending at the last `check`

    def __post_init__(self):
        if self.store is None:
            self.store = JetStreamStore(self.bus)

    @property
    def name(self) -> str:
        """The node's name: what its metrics, dead letters, failures and derived ids say,
        whichever partition this runner consumes."""
        return self.node.name

    @property
    def durable(self) -> str:
        return self.node.name if self.partition is None else partitions.durable(self.node.name, self.partition)

    @property
    def stream(self) -> str:
        return self.node.stream if self.partition is None else partitions.stream_name(self.node.name)

    def _in_log(self, subject: str) -> str:
        """Where a delivered message's event is stored in the conversation log: its subject,
        or for a partition's copy, the CONV subject it was copied from."""
        return subject if self.partition is None else partitions.original_subject(subject)

    def consumer_config(self) -> api.ConsumerConfig:
        cfg = api.ConsumerConfig(
            durable_name=self.durable,
            filter_subjects=([subjects.of_type(self.stream, t) for t in self.node.consumes] if self.partition is None
                             else [partitions.filter_subject(self.partition)]),
            ack_policy=api.AckPolicy.EXPLICIT,
            # A node added to a running system picks up recent turns, not all of history.
            deliver_policy=api.DeliverPolicy.BY_START_TIME,
            opt_start_time=_rfc3339(time.time() - self.start_lookback_s),
            max_deliver=self.config.max_deliver,
            ack_wait=self.config.ack_wait_s,
            max_ack_pending=self.node.max_in_flight or max(self.config.concurrency * 4, 64),
        )
        if self.stream != subjects.CONV_STREAM:
            # A work queue holds only what is still to do: all of it is this node's.
            cfg.deliver_policy, cfg.opt_start_time = api.DeliverPolicy.ALL, None
        return cfg

    async def start(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                await self._ensure_consumer()
                break
            except (asyncio.TimeoutError, ServiceUnavailableError) as exc:
                if attempt == START_ATTEMPTS:
                    raise
                log.warning("durable consumer not answering at start; asking again",
                            extra={"node": self.name, "attempt": attempt, "error": repr(exc)})
                await asyncio.sleep(attempt)
        self._psub = await self.bus.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        if not all(hasattr(self._psub, name) for name in ("_sub", "_nms", "_deliver")) or not hasattr(
                self._psub._sub, "_pending_queue"):
            raise RuntimeError("nats-py's pull subscription changed: check its version (pinned 2.16.0)")
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.stream}.{self.durable}"
        self._advisory_sub = await self.bus.nc.subscribe(advisory, queue=f"advisory-{self.durable}", cb=self._on_max_deliveries)
        self._loop_task = asyncio.create_task(self._fetch_loop(), name=f"consumer-{self.durable}")
        self._set_bound(True)
        log.info("consumer started", extra={"node": self.name, "consumes": list(self.node.consumes)})

    async def _ensure_consumer(self) -> None:
        """Create the durable, or bring an existing one's delivery settings up to date while
        keeping where it started (the server refuses to move a start time)."""
        cfg = self.consumer_config()
        try:
            current = await self.bus.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            current = None
        if current is not None:
            cfg.deliver_policy = current.config.deliver_policy
            cfg.opt_start_time = current.config.opt_start_time
        try:
            await self.bus.js.add_consumer(self.stream, cfg)
        except APIError as exc:
            # Another replica created it between our look and our create: that one is ours too.
            await self.bus.js.consumer_info(self.stream, self.durable)
            log.info("consumer created by a peer", extra={"node": self.name, "detail": exc.description})

    async def check(self) -> bool:
        """Ask the server about this node's durable: refreshes the pending gauges and says
        whether the consumer is there. One that disappeared (a server that lost its store) is
        created again, so the node recovers by itself; the pull subscription is bound by name
        and fetches from the new one."""
        try:
            info = await self.bus.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            log.warning("durable consumer missing; creating it again", extra={"node": self.name})
            try:
                await self._ensure_consumer()
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                log.warning("could not create the durable consumer", extra={"node": self.name, "error": repr(exc)})
            self._set_bound(False)
            return False
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            if self.bound:
                log.warning("durable consumer unreachable", extra={"node": self.name, "error": repr(exc)})
            self._set_bound(False)
            return False
        self.pending = (info.num_pending or 0, info.num_ack_pending or 0)
        if self.partition is None:  # a partitioned node's runner sums its partitions'
            metrics.node_pending.labels(self.name).set(self.pending[0])
            metrics.node_ack_pending.labels(self.name).set(self.pending[1])
        if not self.bound:
            log.info("durable consumer reachable again", extra={"node": self.name})
        self._set_bound(True)
        return True

    def _set_bound(self, bound: bool) -> None:
        self.bound = bound
        if self.partition is None:
            metrics.node_ready.labels(self.name).set(1 if bound else 0)

    async def stop(self) -> None:
        """Stop fetching, let in-flight handlers finish (bounded), leave the rest to redelivery."""
        self._stopping = True
        if self._loop_task:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self.bus.nc.is_connected:
            await self._psub.unsubscribe()
            # Messages pulled but not started go back now, to a peer (not after ack_wait).
            while True:
                try:
                    msg = self._psub._sub._pending_queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                if not (msg.headers and msg.headers.get(api.Header.STATUS)):
                    with contextlib.suppress(Exception):
                        await msg.nak()
            if self._advisory_sub:
                await self._advisory_sub.unsubscribe()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=self.config.drain_timeout_s)
            for task in pending:
                task.cancel()
        log.info("consumer stopped", extra={"node": self.name, "stats": self.stats.__dict__})

    async def _fetch_loop(self) -> None:
        """Pull continuously: one pull request at a time asks for as many messages as the node
        has free slots, and the messages are handled as they arrive; the next request goes
        out when this one is used up or over (expired: 408; or ended by the server: 409
        leadership change, deleted consumer, ...). A fetch of one message at a time
        (nats-py's batched fetch waits to fill its batch) cost a pull request per message: a
        publish, a timer and the server's work for each event every node handled."""
        asked, asked_until = 0, 0.0  # messages the open request may still bring, and until when
        while not self._stopping:
            free = self.config.concurrency - len(self._tasks)
            if free <= 0:
                await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
                await asyncio.sleep(0)  # let the done callbacks free the slots
                continue
            try:
                if asked <= 0:
                    asked = await self._ask(free)
                    # Past its expiry with no word from the server (a reconnect lost the
                    # request), ask again.
                    asked_until = time.monotonic() + FETCH_TIMEOUT_S + 0.5
                msg = await self._next(max(0.05, asked_until - time.monotonic()))
            except asyncio.TimeoutError:
                asked = 0
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fetch failed", extra={"node": self.name})
                asked = 0
                await asyncio.sleep(0.5)
                continue
            status = msg.headers.get(api.Header.STATUS) if msg.headers else None
            if status:
                if status == api.StatusCode.CONTROL_MESSAGE:
                    continue
                if status not in (api.StatusCode.REQUEST_TIMEOUT, api.StatusCode.NO_MESSAGES, api.StatusCode.CONFLICT):
                    log.warning("pull request ended by the server", extra={
                        "node": self.name, "status": status,
                        "description": msg.headers.get(api.Header.DESCRIPTION, "")})
                asked = 0  # that request is over
                if status != api.StatusCode.REQUEST_TIMEOUT:
                    await asyncio.sleep(0.1)  # refused, not expired: no tight loop of asking again
                continue
            asked -= 1
            task = asyncio.create_task(self._run(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ask(self, batch: int) -> int:
        """Send a pull request for up to `batch` messages, open for FETCH_TIMEOUT_S. (nats-py
        2.16, pinned, has no continuous pull of its own: the request goes to the pull
        subscription's subject with its inbox, as its `fetch` sends it; `start` checks the
        subscription has them.)"""
        request = {"batch": batch, "expires": int(FETCH_TIMEOUT_S * 1_000_000_000)}
        await self.bus.nc.publish(self._psub._nms, json.dumps(request).encode(), reply=self._psub._deliver)
        return batch

    async def _next(self, timeout: float) -> Msg:
        """The next message the pull requests brought (`Subscription.next_msg` without its
        task and uuid per call)."""
        sub = self._psub._sub
        queue = sub._pending_queue
        msg = queue.get_nowait() if not queue.empty() else await asyncio.wait_for(queue.get(), timeout)
        sub._pending_size -= len(msg.data)
        return msg

    @functools.cached_property
    def _metrics(self):
        """This node's metric children, looked up once rather than with `labels` at every
        message: in flight, handler seconds, and events by outcome."""
        return (metrics.node_in_flight.labels(self.name), metrics.node_handler_seconds.labels(self.name),
                {outcome: metrics.node_events.labels(self.name, outcome) for outcome in OUTCOMES})

    async def _run(self, msg: Msg) -> None:
        self.stats.in_flight += 1
        in_flight, handler_seconds, _ = self._metrics
        in_flight.inc()
        started = time.perf_counter()
        try:
            await self.process(msg)
        except Exception:
            # Only bus trouble gets here (publishing the failure itself failed): the message
            # stays unacked and comes back after ack_wait.
            log.exception("message left for redelivery", extra={"node": self.name, "subject": msg.subject})
        finally:
            self.stats.in_flight -= 1
            in_flight.dec()
            handler_seconds.observe(time.perf_counter() - started)

    def _count(self, outcome: str) -> None:
        self._metrics[2][outcome].inc()

    async def process(self, msg: Msg) -> None:
        if msg.headers and (privacy.ERASED_COPY in msg.headers
                            or self.name in msg.headers.get(privacy.SETTLED_COPY, "").split(",")):
            # A copy `concierge erase-visitor` stored: an erased visitor's (what it caused is
            # in the log already, and nothing more is done for them: no answer again, no model
            # call, no webhook, no analytics), or one of another conversation's rewritten log
            # whose original this node had handled (the header names the nodes that had).
            await self._handled(msg)
            return
        at = delivery(msg.reply)
        attempt = at.delivered
        subject = self._in_log(msg.subject)
        seq = at.stream_seq if self.partition is None else partitions.source_seq(msg)
        try:
            event = ev.decode(msg.data)
        except ev.BadEvent as exc:
            self.stats.bad_events += 1
            log.error("bad event dead-lettered", extra={"node": self.name, "subject": msg.subject, "error": str(exc)})
            await self.bus.dead_letter(self.name, msg, str(exc), subject)
            await msg.term()
            self._count("dead_lettered")
            return
        if mismatch := ev.subject_mismatch(event, subject):
            # Handlers act on the envelope's site and session: one believed over its subject
            # would let a publish on one conversation's subject write into another's.
            self.stats.bad_events += 1
            self.stats.mismatched += 1
            log.error("event on the wrong subject dead-lettered",
                      extra={"node": self.name, "subject": msg.subject, "error": mismatch})
            await self.bus.dead_letter(self.name, msg, mismatch, subject)
            await msg.term()
            self._count("mismatched")
            return

        if not self.node.concerns(event):
            # Not this node's (another route's handler, another kind of suggestion): nothing
            # to load, handle, time or trace; acked as handled.
            await self._handled(msg)
            return

        # What the handler's inputs hold of the log includes this event (and so what caused
        # it), even read from a replica that had not stored it yet when asked.
        conv = self.node.stream == subjects.CONV_STREAM
        position = Position(subject, seq) if conv and seq else None
        with logs.conversation(event.site, event.session_id, event.turn):
            span_name = f"{self.name} {ev.event_type(event)}"
            with telemetry.handling(TRACER, span_name, msg.headers) as span:
                span.set_attribute("concierge.attempt", attempt)
                # Only a turn's steps feed the gateway's stall clock; a work item has no visitor waiting.
                progress = subjects.progress(event.site, event.session_id, event.turn) if conv else None
                heartbeat = _Heartbeat(self, msg, progress)
                overdue = None
                try:
                    async with asyncio.timeout(None) as deadline:
                        overdue = asyncio.get_running_loop().call_later(
                            self.config.handler_deadline_s, self._overdue, asyncio.current_task(), deadline)
                        inputs = await gather(self.node.needs, event, self.store, self.configs, position)
                        if inputs is not None:  # None: not the delivery that completes the node's join
                            ctx = Context(out=self.bus, node=self.name, cause=event, attempt=attempt,
                                          input_seq=inputs.state.last_seq, config_version=inputs.config.version)
                            await self._store(await self.node.handle(event, inputs, ctx))
                except asyncio.CancelledError:
                    raise
                except TimeoutError as exc:
                    # The deadline's, or the handler's own timeout (an ordinary failure).
                    if deadline.expired():
                        exc = Overdue(f"handler still running after {self.config.handler_deadline_s:g} s: cancelled")
                    await self._failed(msg, event, attempt, exc)
                    return
                except PermanentError as exc:
                    log.error("handler gave up", extra={"node": self.name, "error": str(exc)})
                    await self._give_up(msg, event, attempt, f"{type(exc).__name__}: {exc}")
                    return
                except Later as later:
                    if attempt >= self.config.max_deliver:  # the server would not deliver it again
                        await self._give_up(msg, event, attempt, f"deferred past the last delivery: {later}")
                    else:
                        await msg.nak(delay=max(0.05, later.delay_s))
                        self._count("deferred")
                    return
                except Exception as exc:
                    await self._failed(msg, event, attempt, exc)
                    return
                finally:
                    heartbeat.cancel()
                    if overdue is not None:
                        overdue.cancel()
                await self._handled(msg)

    async def _failed(self, msg: Msg, event: ev.Envelope, attempt: int, exc: Exception) -> None:
        """A failed attempt: retried after the backoff, or after the last one given up."""
        if attempt >= self.config.max_deliver:
            log.error("last attempt failed", exc_info=exc, extra={"node": self.name, "attempt": attempt})
            await self._give_up(msg, event, attempt, f"{type(exc).__name__}: {exc}")
            return
        delay = self.config.backoff_s[min(attempt - 1, len(self.config.backoff_s) - 1)]
        if isinstance(exc, BUS_UNAVAILABLE):
            delay = max(delay, BUS_RETRY_S)
        log.warning("handler failed, will retry",
                    extra={"node": self.name, "attempt": attempt, "retry_in_s": delay, "error": repr(exc)})
        self.stats.retried += 1
        await msg.nak(delay=delay)
        self._count("retried")

    def _overdue(self, task: asyncio.Task, deadline: asyncio.Timeout) -> None:
        """The handler's deadline passed: say what it waits on, then end its wait."""
        log.error("handler overdue, cancelled", extra={
            "node": self.name, "deadline_s": self.config.handler_deadline_s,
            "stack": "".join(logs.awaiting(task.get_coro()))})
        deadline.reschedule(asyncio.get_running_loop().time())

    async def _store(self, outputs) -> None:
        """Store a handler's outputs (a work item on its queue, not in the log). Several go out
        at once, in order on the one connection, so the stream stores them in order, and
        their acks are awaited together: a node that stores a decision after what it
        implies (the intent router's SkillsApplied, then its RouteDecided) pays one round
        trip, not one per event. The first failure fails the handling (retried: the ids
        derive from the input, so what was stored is not stored twice)."""
        sends = [self.bus.publish_work(out) if isinstance(out, ev.WORK_ITEMS) else self.bus.publish(out)
                 for out in outputs]
        if len(sends) == 1:
            await sends[0]
            return
        for result in await asyncio.gather(*sends, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _handled(self, msg: Msg) -> None:
        await msg.ack()
        self.stats.handled += 1
        self._count("ok")

    @property
    def heartbeat_s(self) -> float:
        return max(self.config.ack_wait_s / 3, 0.2)

    async def _keep_alive(self, msg: Msg, progress: str | None) -> None:
        """Long handlers (a streamed answer) tell the server they are alive, so only a dead
        process gets its message redelivered. A handler at work on a turn also says so on
        the turn's `progress` subject with each heartbeat: the gateway ends a turn nobody
        works on (TURN_STALL_S) but not one whose step is merely slow. Not at once: the
        gateway hears every event of the turn too, and most handlers are done long before
        their first heartbeat (a marker from each would be most of a turn's messages).
        Started by a timer at the first heartbeat (`_Heartbeat`), so a handler done before
        it costs no task."""
        while True:
            await msg.in_progress()
            if progress is not None:
                await self._say_progress(progress)
            await asyncio.sleep(self.heartbeat_s)

    async def _say_progress(self, subject: str) -> None:
        try:
            await self.bus.nc.publish(subject, self.name.encode())
        except nats.errors.Error as exc:
            # Only the gateway's stall clock misses it; the heartbeat itself must go on.
            log.warning("progress marker not sent", extra={"node": self.name, "error": repr(exc)})

    async def _give_up(self, msg: Msg, event: ev.Envelope, attempts: int, reason: str) -> None:
        await self._record_failure(event, attempts, reason)
        await self.bus.dead_letter(self.name, msg, reason, self._in_log(msg.subject))
        await msg.term()
        self.stats.failed += 1
        self._count("failed")

    async def _record_failure(self, event: ev.Envelope, attempts: int, reason: str) -> None:
        await self.bus.publish(self.node.failure(event, self.name, attempts, reason))

    async def _on_max_deliveries(self, advisory: Msg) -> None:
        """The server gave up on a message whose handler never answered (the process died on
        its last attempt). Make that failure visible like any other."""
        try:
            info = json.loads(advisory.data)
            stored = await self.bus.js.get_msg(self.stream, seq=info["stream_seq"])
            event = ev.decode(stored.data)
        except Exception:
            log.exception("could not handle max-deliveries advisory", extra={"node": self.name})
            return
        subject = self._in_log(stored.subject)
        if mismatch := ev.subject_mismatch(event, subject):
            log.error("max-deliveries advisory for an event on the wrong subject",
                      extra={"node": self.name, "stream_seq": info["stream_seq"], "error": mismatch})
            return
        reason = f"no answer from {self.name} after {info.get('deliveries')} deliveries"
        log.error("max deliveries reached", extra={"node": self.name, "stream_seq": info["stream_seq"]})
        await self._record_failure(event, int(info.get("deliveries", 0)), reason)
        if self.stream != subjects.CONV_STREAM:
            # A work item (or a partition's copy of an event) nobody will ack again would stay
            # on its work queue for good.
            await self.bus.js.delete_msg(self.stream, info["stream_seq"])
        self.stats.failed += 1
        self._count("failed")


class _Heartbeat:
    """The heartbeats of one message's handling: a timer until the first is due, then the
    runner's `_keep_alive` task; `cancel` stops either."""

    def __init__(self, runner: ConsumerRunner, msg: Msg, progress: str | None):
        self._task: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_later(runner.heartbeat_s, self._start, runner, msg, progress)

    def _start(self, runner: ConsumerRunner, msg: Msg, progress: str | None) -> None:
        self._task = asyncio.ensure_future(runner._keep_alive(msg, progress))

    def cancel(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1e6):06d}Z"
