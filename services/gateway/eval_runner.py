"""eval_runner: a run of a site's test cases carried out (shared/eval_runs.py).

The gateway's one node: it is where turns come from, so it alone may publish a turn's
request (deploy/nats-server.conf), and a run asks each case as turns of a session of its own
for the router, the retriever and the responder to answer. A durable consumer of
`eval_run_requested` on the conversation stream: any gateway replica takes a run, at most
`RUNS_IN_FLIGHT` runs at once deployment-wide (the durable's `max_ack_pending`; others
wait their turn), each asking its cases `EVAL_RUN_CONCURRENCY` at a time, so that runs
never take more than a few visitors' share of the system. Each case's result is stored as it
is judged (`EvalCaseResult`), then `EvalRunCompleted`; a run whose last attempt fails ends
in an `EvalRunCompleted` with its error, never in silence.
"""

from __future__ import annotations

import logging

from shared import eval_runs
from shared import events as ev
from shared.node import Context, Inputs, Node

log = logging.getLogger(__name__)

NAME = "eval_runner"
RUNS_IN_FLIGHT = 2


def run_failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.Envelope:
    return ev.follow(event, ev.EvalRunCompleted, node, key="completed", cases=0, passed=0,
                     error=f"{reason[:500]} (after {attempts} attempts)")


def make_node(bus, turn_deadline_s: float, concurrency: int = eval_runs.CONCURRENCY) -> Node:
    async def run(event: ev.EvalRunRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        async def store(result: dict) -> None:
            await ctx.emit(ctx.follow(ev.EvalCaseResult, key=f"result-{result['case_id']}", **result))

        figures = await eval_runs.execute(bus, event, store, turn_deadline_s, concurrency)
        log.info("eval run completed", extra={"site_id": event.site, "run": eval_runs.run_of(event.session_id),
                                              "cases": figures["cases"], "passed": figures["passed"]})
        return [ctx.follow(ev.EvalRunCompleted, key="completed", **figures)]

    return Node(NAME, consumes=("eval_run_requested",), handle=run, failure=run_failed, max_in_flight=RUNS_IN_FLIGHT)
