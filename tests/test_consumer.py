"""The consumer runner against a real JetStream: ack, retry, dead-letter, idempotency."""

from __future__ import annotations

import asyncio

import nats.js.errors

from shared import events as ev
from shared import consumer, subjects
from shared.consumer import ConsumerRunner
from shared.node import Later, Needs, Node, PermanentError
from tests.helpers import events_of, fast, own, requested, start, unique, wait_for


async def test_handler_output_is_stored_and_message_acked(bus, site):
    async def handle(event, inputs, ctx):
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="test")]

    runner = await start(bus, Node(unique("route"), ("turn_requested",), own(site, handle)))
    try:
        await bus.publish(requested(site))
        stored = await wait_for(lambda: _find(bus, site, ev.RouteDecided))
        assert stored.causation_id is not None and stored.turn == 1
        info = await bus.js.consumer_info(subjects.CONV_STREAM, runner.durable)
        await wait_for(lambda: _acked(bus, runner.durable))
        assert info.config.max_deliver == 3
    finally:
        await runner.stop()


async def test_failures_are_retried_with_backoff_then_succeed(bus, site):
    attempts = []

    async def handle(event, inputs, ctx):
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("flaky dependency")
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="third time")]

    runner = await start(bus, Node(unique("flaky"), ("turn_requested",), own(site, handle)))
    try:
        await bus.publish(requested(site))
        await wait_for(lambda: _find(bus, site, ev.RouteDecided))
        assert attempts == [1, 2, 3]
        assert runner.stats.retried == 2 and runner.stats.failed == 0
        assert not [e for e in await events_of(bus, site) if isinstance(e, ev.TurnFailed)]
    finally:
        await runner.stop()


async def test_a_bus_that_does_not_answer_is_retried_far_enough_apart_to_outlast_an_election(bus, site, monkeypatch):
    """A stream without a leader (its server killed: an election takes 4-9 s) answers a
    publish with no response. The handler's quick backoff would spend every attempt inside
    the election (the rehearsal's lead whose claim could not be stored, never delivered);
    such failures wait `BUS_RETRY_S` instead (here 1 s: the stream appears after 0.5 s)."""
    monkeypatch.setattr(consumer, "BUS_RETRY_S", 1.0)
    stream, attempts = f"LATER_{site}", []

    async def handle(event, inputs, ctx):
        attempts.append(ctx.attempt)
        await ctx.out.js.publish(f"later.{site}", b"a side effect's record")  # no stream yet: no response
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="the bus is back")]

    runner = await start(bus, Node(unique("later"), ("turn_requested",), own(site, handle)))
    try:
        await bus.publish(requested(site))
        await wait_for(lambda: attempts, 5, "the first attempt")
        await asyncio.sleep(0.5)
        await bus.js.add_stream(name=stream, subjects=[f"later.{site}"])
        await wait_for(lambda: _find(bus, site, ev.RouteDecided), 10, "handled once the stream is there")
        assert attempts == [1, 2]
        assert not [e for e in await events_of(bus, site) if isinstance(e, ev.TurnFailed)]
    finally:
        await runner.stop()
        await bus.js.delete_stream(stream)


async def test_last_attempt_ends_in_failure_event_and_dead_letter(bus, site):
    async def handle(event, inputs, ctx):
        raise RuntimeError("always broken")

    name = unique("broken")
    runner = await start(bus, Node(name, ("turn_requested",), own(site, handle)))
    try:
        sent = requested(site)
        await bus.publish(sent)
        failed = await wait_for(lambda: _find(bus, site, ev.TurnFailed))
        assert failed.node == name and failed.attempts == 3 and "always broken" in failed.reason
        assert failed.failed_event_id == sent.event_id
        # the failure is recorded before the copy reaches dlq.<node>: wait for that too
        dead = await wait_for(lambda: _dead_letter(bus, name), 5, "the dead letter")
        assert ev.decode(dead.data) == sent
        assert dead.headers["Concierge-Subject"] == subjects.conv(site, "s1", "turn_requested")
    finally:
        await runner.stop()


async def test_permanent_error_fails_at_once(bus, site):
    calls = []

    async def handle(event, inputs, ctx):
        calls.append(ctx.attempt)
        raise PermanentError("bad input")

    runner = await start(bus, Node(unique("permanent"), ("turn_requested",), own(site, handle)))
    try:
        await bus.publish(requested(site))
        failed = await wait_for(lambda: _find(bus, site, ev.TurnFailed))
        assert failed.attempts == 1 and calls == [1]
    finally:
        await runner.stop()


async def test_a_handler_whose_moment_has_not_come_gets_the_event_again_then_with_no_retry_counted(bus, site):
    import time

    calls = []

    async def handle(event, inputs, ctx):
        calls.append((ctx.attempt, time.monotonic()))
        if len(calls) == 1:
            raise Later(0.6)
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="its moment came")]

    runner = await start(bus, Node(unique("later"), ("turn_requested",), own(site, handle)))
    try:
        await bus.publish(requested(site))
        await wait_for(lambda: _find(bus, site, ev.RouteDecided))
        assert [a for a, _ in calls] == [1, 2] and calls[1][1] - calls[0][1] >= 0.5
        assert (runner.stats.retried, runner.stats.failed) == (0, 0)
    finally:
        await runner.stop()


async def test_malformed_payload_is_dead_lettered_and_the_consumer_keeps_going(bus, site):
    seen = []

    async def handle(event, inputs, ctx):
        seen.append(event.event_id)
        return []

    name = unique("sturdy")
    runner = await start(bus, Node(name, ("turn_requested",), own(site, handle)))
    try:
        await bus.js.publish(subjects.conv(site, "s1", "turn_requested"), b'{"type":"turn_requested","turn":"x"}')
        await bus.js.publish(subjects.conv(site, "s1", "turn_requested"), b"\xff not even json")
        good = requested(site)
        await bus.publish(good)
        await wait_for(lambda: seen)
        assert seen == [good.event_id]
        assert runner.stats.bad_events == 2
        # the good event's handler may end before the bad ones' copies are stored in the DLQ
        dead = await wait_for(lambda: _dead_letter(bus, name, b"\xff not even json"), 5, "the dead letter")
        assert "malformed" in dead.headers["Concierge-Reason"]
    finally:
        await runner.stop()


async def test_event_whose_envelope_disagrees_with_its_subject_is_dead_lettered(bus, site):
    """A publish on one conversation's subject carrying another site's (or session's, or
    type's) envelope is never handled: handlers would act, and write, as the envelope says."""
    seen = []

    victim = f"{site}v"

    async def handle(event, inputs, ctx):
        if event.site not in (site, victim):  # other tests' events; the victim's must never come
            return []
        seen.append(event.event_id)
        return [ctx.follow(ev.IntentClassified, intent="LEARN", confidence=1.0, classifier="rule")]

    name = unique("strict")
    runner = await start(bus, Node(name, ("turn_requested",), handle))
    try:
        crafted = [requested(victim), requested(site, session="other"), requested(site)]
        subjects_of = [subjects.conv(site, "s1", "turn_requested")] * 2 + [subjects.conv(site, "s1", "intent_classified")]
        for event, subject in zip(crafted, subjects_of):
            await bus.js.publish(subject, ev.encode(event), stream=subjects.CONV_STREAM)
        good = requested(site)
        await bus.publish(good)
        await wait_for(lambda: seen)
        await asyncio.sleep(0.3)
        assert seen == [good.event_id]
        assert runner.stats.mismatched == 2  # the third is not on this node's subjects
        dead = await bus.js.get_last_msg(subjects.DLQ_STREAM, subjects.dlq(name))
        assert dead.headers["Concierge-Subject"] == subjects.conv(site, "s1", "turn_requested")
        assert "envelope disagrees with subject" in dead.headers["Concierge-Reason"]
        assert "session_id 'other'" in dead.headers["Concierge-Reason"]
        assert await bus.read(subjects.conversation(victim, "s1")) == []  # nothing written as the victim
        stored = await bus.read(subjects.conversation(site, "s1"))
        assert [r.event.event_id for r in stored] == [good.event_id, stored[1].event.event_id]
        assert isinstance(stored[1].event, ev.IntentClassified)  # crafted ones are left out of every read
    finally:
        await runner.stop()


async def test_same_event_delivered_twice_gives_one_outcome(bus, site):
    """A redelivery (here: the handler's ack is lost because it ran past ack_wait) makes the
    same output ids, and JetStream's dedupe keeps one."""
    runs = []

    async def handle(event, inputs, ctx):
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(1.5)  # longer than ack_wait and no heartbeat: the server redelivers
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason=f"attempt {ctx.attempt}")]

    node = Node(unique("slow"), ("turn_requested",), own(site, handle))
    runner = ConsumerRunner(bus, node, fast(ack_wait_s=0.5), start_lookback_s=5)
    runner._keep_alive = _no_heartbeat  # simulate a stalled handler that cannot say it is alive
    await runner.start()
    try:
        await bus.publish(requested(site))
        await wait_for(lambda: len(runs) >= 2)
        await asyncio.sleep(2.0)
        decided = [e for e in await events_of(bus, site) if isinstance(e, ev.RouteDecided)]
        assert len(decided) == 1
        assert sorted(runs)[:2] == [1, 2]
    finally:
        await runner.stop()


async def test_concurrency_limit_is_respected(bus, site):
    active, peak, done = 0, 0, []

    async def handle(event, inputs, ctx):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.1)
        active -= 1
        done.append(event.event_id)
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="ok")]

    runner = await start(bus, Node(unique("limited"), ("turn_requested",), own(site, handle)), fast(concurrency=3))
    try:
        for i in range(12):
            await bus.publish(requested(site, session=f"s{i}"))
        await wait_for(lambda: len(done) == 12, timeout=15)
        assert peak == 3
    finally:
        await runner.stop()


async def test_one_pull_request_brings_as_many_messages_as_the_node_has_free_slots(bus, site):
    """The runner pulls continuously: a request asks for its free slots and the messages are
    handled as they come, so events arriving one by one cost no pull request each."""
    done = []

    async def handle(event, inputs, ctx):
        done.append(event.event_id)
        return []

    node = Node(unique("pulling"), ("turn_requested",), own(site, handle))
    asked = []

    async def heard(msg):
        asked.append(msg.data)

    watch = await bus.nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{subjects.CONV_STREAM}.{node.name}", cb=heard)
    runner = await start(bus, node, fast(concurrency=8))
    try:
        for i in range(24):
            await bus.publish(requested(site, session=f"p{i}"))
        await wait_for(lambda: len(done) == 24, timeout=15)
        # Every message handled (other tests' recent ones too): one at a time, as many
        # requests as messages or more.
        handled = runner.stats.handled
        assert handled >= 24 and 1 <= len(asked) <= handled / 2, (handled, asked)
        assert b'"batch": 8' in asked[0]
    finally:
        await runner.stop()
        await watch.unsubscribe()


async def test_stop_lets_in_flight_handlers_finish(bus, site):
    finished = []

    async def handle(event, inputs, ctx):
        await asyncio.sleep(0.5)
        finished.append(event.event_id)
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="drained")]

    runner = await start(bus, Node(unique("drain"), ("turn_requested",), own(site, handle)))
    await bus.publish(requested(site))
    await wait_for(lambda: runner.stats.in_flight == 1)
    await runner.stop()
    assert len(finished) == 1
    assert await _find(bus, site, ev.RouteDecided)


async def _no_heartbeat(msg, progress):
    await asyncio.Event().wait()


async def _find(bus, site, cls):
    for event in await events_of(bus, site):
        if isinstance(event, cls):
            return event
    return None


async def _dead_letter(bus, durable, data=None):
    """The node's last dead letter (with these bytes, when `data` is given), or None yet."""
    try:
        dead = await bus.js.get_last_msg(subjects.DLQ_STREAM, subjects.dlq(durable))
    except nats.js.errors.NotFoundError:
        return None
    return dead if data is None or dead.data == data else None


async def _acked(bus, durable):
    info = await bus.js.consumer_info(subjects.CONV_STREAM, durable)
    return info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_handler_at_work_on_a_turn_says_so_with_each_heartbeat(bus, site):
    """The gateway's stall clock (TURN_STALL_S) must not cut a slow step: a node handling an
    event of a turn says so on the turn's progress subject with each heartbeat (ack_wait / 3
    = 0.2 s here), and falls silent when it is done. An event the node is not concerned with
    says nothing."""
    markers = []

    async def heard(msg):
        markers.append((msg.subject, msg.data.decode(), asyncio.get_running_loop().time()))

    sub = await bus.nc.subscribe(f"progress.{site}.>", cb=heard)

    async def slow(event, inputs, ctx):
        await asyncio.sleep(1.0)
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="after a while")]

    name = unique("slow")
    node = Node(name, ("turn_requested",), own(site, slow), needs=Needs(when=lambda e: e.turn == 1))
    runner = await start(bus, node, fast(ack_wait_s=0.6))
    try:
        sent = asyncio.get_running_loop().time()
        await bus.publish(requested(site, "s1", 1))
        await wait_for(lambda: _find(bus, site, ev.RouteDecided), 10, "the slow answer")
        await bus.publish(requested(site, "s2", 2))  # turn 2: not this node's concern
        await wait_for(lambda: _acked(bus, runner.durable), 10, "both acked")
        await asyncio.sleep(0.5)
    finally:
        await runner.stop()
        await sub.unsubscribe()
    assert {(subject, node_name) for subject, node_name, _ in markers} == {(subjects.progress(site, "s1", 1), name)}
    times = [at - sent for _, _, at in markers]
    assert times[0] < 0.5 and len(times) >= 4, times  # every 0.2 s for 1 s
    assert max(b - a for a, b in zip(times, times[1:])) < 0.5, times
    assert times[-1] < 1.5, times  # silent once handled


async def test_handler_that_never_answers_ends_in_failure_event(bus, site):
    """When every delivery times out (a process dying on each attempt), the server's
    max-deliveries advisory is turned into a TurnFailed: no silent loss."""

    async def handle(event, inputs, ctx):
        await asyncio.sleep(30)
        return []

    node = Node(unique("hung"), ("turn_requested",), own(site, handle))
    runner = ConsumerRunner(bus, node, fast(max_deliver=2, ack_wait_s=0.3, drain_timeout_s=0.1), start_lookback_s=5)
    runner._keep_alive = _no_heartbeat
    await runner.start()
    try:
        await bus.publish(requested(site))
        failed = await wait_for(lambda: _find(bus, site, ev.TurnFailed), timeout=10)
        assert failed.node == node.name and "2 deliveries" in failed.reason
    finally:
        await runner.stop()


async def test_a_handler_waiting_for_ever_while_its_heartbeat_goes_on_is_cancelled_at_its_deadline(bus, site, caplog):
    """Heartbeats keep a live process's message from being redelivered, so a handler stuck on
    an await that never returns would hold its message for ever. At the node's deadline it is
    cancelled, what it waited on is logged, and the attempt fails like any other: retried,
    then the turn's TurnFailed. The handler's own TimeoutError stays an ordinary failure."""
    calls = []

    async def stuck_forever():
        await asyncio.Event().wait()

    async def handle(event, inputs, ctx):
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise TimeoutError("the fetch's own timeout")
        await stuck_forever()

    node = Node(unique("stuck"), ("turn_requested",), own(site, handle))
    runner = ConsumerRunner(bus, node, fast(max_deliver=3, ack_wait_s=0.6, handler_deadline_s=1.0),
                            start_lookback_s=5)
    await runner.start()
    try:
        await bus.publish(requested(site))
        failed = await wait_for(lambda: _find(bus, site, ev.TurnFailed), timeout=15)
        assert calls == [1, 2, 3] and failed.attempts == 3  # heartbeats kept each from redelivery
        assert failed.reason == "Overdue: handler still running after 1 s: cancelled"
        overdue = [r for r in caplog.records if r.getMessage() == "handler overdue, cancelled"]
        assert len(overdue) == 2 and "stuck_forever" in overdue[0].stack
        retried = [r for r in caplog.records if r.getMessage() == "handler failed, will retry"]
        assert "the fetch's own timeout" in retried[0].error
    finally:
        await runner.stop()


async def test_an_llm_call_record_is_cut_to_the_servers_max_payload(site):
    """The limit comes from the server's own `max_payload`, not from a constant."""
    from shared.bus import connect
    from shared.config import BusConfig
    from shared.node import Context
    from tests.servers import nats_server_with_config

    with nats_server_with_config("max_payload: 65536") as url:
        bus = await connect(BusConfig(url=url), name="small")
        try:
            assert bus.nc.max_payload == 65536 and bus.max_event_bytes == 49152
            cause = requested(site)
            await bus.publish(cause)
            ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
            await ctx.record_llm(ev.LLMCall(role="answer", model="m", base_url="http://x",
                                            messages=[{"role": "user", "content": "q" * 200_000}],
                                            response_text="fine"))
            (stored,) = [r.event for r in await bus.read(subjects.conv(site, "s1", "llm_call_recorded"))]
            assert stored.call.truncated > 150_000 and stored.call.response_text == "fine"
            assert stored.call.messages[0]["content"].endswith(f"…[truncated {stored.call.truncated} chars]")
        finally:
            await bus.close()


async def test_the_runner_hands_a_node_what_it_needs_and_stamps_what_it_saw(bus, site):
    """Needs: the folded state, the site's config, a wait with its deadline (what did not come
    is named late), and `when`: events that do not concern the node reach no handler."""
    from shared.node import Needs, Wait
    from tests.helpers import FixedConfigs
    from shared.site_config import SiteConfig

    handled = []

    async def handle(event, inputs, ctx):
        handled.append((event.turn, inputs.state.turn, inputs.config.name, inputs.late))
        return [ctx.follow(ev.RouteDecided, route="ANSWER", reason="test")]

    needs = Needs(state=True, config=True, waits=(Wait(("retrieval_completed",), 0.3),),
                  when=lambda event: event.message != "not for me")
    node = Node(unique("seam"), ("turn_requested",), own(site, handle), needs=needs)
    runner = await start(bus, node, configs=FixedConfigs(SiteConfig(name="Acme")))
    try:
        ignored = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="other", turn=1, ts=ev.now(),
                                   producer="test", message="not for me")
        await bus.publish(ignored)
        first = requested(site)
        await bus.publish(first)
        stored = await wait_for(lambda: _find(bus, site, ev.RouteDecided))
        assert handled == [(1, 1, "Acme", ("retrieval_completed",))]
        (record,) = [r for r in await bus.read(subjects.conv(site, "s1", "turn_requested"))]
        assert stored.input_seq == record.seq  # the state it was given ended at its own TurnRequested
        await wait_for(lambda: _acked(bus, runner.durable), what="both events acked")
    finally:
        await runner.stop()
