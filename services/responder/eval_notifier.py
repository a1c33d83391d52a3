"""eval_notifier: tells the site's team when a run of its test cases broke something (on
`EvalRunCompleted` with newly failing cases: shared/eval_runs.py).

- Webhook: POST JSON (`eval.regressed`: the run, why it ran (an operator, a sync, a config
  change), its pass rate and the previous run's, and each newly failing case with its
  message, what it missed and what the assistant answered) to the site's
  `lead.webhook_url`, else LEAD_WEBHOOK_URL; none: recorded as skipped, nothing sent.
  Signed with the site's lead webhook secret and retried as webhooks.py says; the outcome
  is stored in the run's log as `WebhookRecorded(hook="eval")` whatever it is.
- One run, one delivery: the run's end claims its delivery (webhook_claims.py); a
  redelivery after the outcome was stored reports it again and sends nothing. The
  `webhook-id` is the run's on every attempt.

A run with nothing newly failing (or one that could not finish) sends nothing.
"""

from __future__ import annotations

import hashlib

import msgspec

from services.responder import webhooks
from services.responder.settings import LeadSettings
from services.responder.webhook_claims import Outcome, WebhookClaims, deliver_once
from shared import eval_runs, subjects
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node

NAME = "eval_notifier"
SHOWN_ANSWER = 600  # characters of a failing case's answer the webhook carries


def eval_id(site: str, session_id: str) -> str:
    """A run's stable `webhook-id`."""
    return "eval_" + hashlib.blake2b(f"{site}|{session_id}".encode(), digest_size=16).hexdigest()


def payload(event: ev.EvalRunCompleted, inputs: Inputs, previous: ev.EvalRunCompleted | None) -> dict:
    requested = next(iter(inputs.log.get("eval_run_requested", ())), None)
    results = {r.case_id: r for r in inputs.log.get("eval_case_result", ())}
    return {
        "event": "eval.regressed", "event_id": event.event_id, "site": event.site,
        "run": eval_runs.run_of(event.session_id), "ts": event.ts,
        "reason": requested.reason if requested else "", "cause": requested.cause if requested else "",
        "cases": event.cases, "passed": event.passed, "pass_rate": _rate(event),
        "previous_run": event.previous_run, "previous_pass_rate": _rate(previous) if previous else None,
        "newly_failing": [{"case_id": case, "message": results[case].message, "failures": results[case].failures,
                           "answer": results[case].answer[:SHOWN_ANSWER]}
                          for case in event.newly_failing if case in results],
    }


def _rate(run: ev.EvalRunCompleted) -> float | None:
    return round(run.passed / run.cases, 3) if run.cases else None


def make_node(claims: WebhookClaims, bus, settings: LeadSettings = LeadSettings(),
              senders: webhooks.Senders | None = None) -> Node:
    http = senders or webhooks.Senders.of(settings)

    async def deliver(event: ev.EvalRunCompleted, inputs: Inputs) -> Outcome:
        config = inputs.config
        previous = (await bus.last(subjects.conv(event.site, eval_runs.session_of(event.previous_run),
                                                 "eval_run_completed")) if event.previous_run else None)
        return await webhooks.send(http, settings, "eval", config.lead.webhook_url or settings.webhook_url,
                                   event.site, config.lead, eval_id(event.site, event.session_id),
                                   payload(event, inputs, previous))

    async def handle(event: ev.EvalRunCompleted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        claim = await deliver_once(claims, event.site, event.session_id, event.event_id,
                                   lambda: deliver(event, inputs))
        return [ctx.follow(ev.WebhookRecorded, hook="eval", **msgspec.structs.asdict(claim.outcome))]

    return Node(name=NAME, consumes=("eval_run_completed",), handle=handle,
                needs=Needs(config=True, log=("eval_run_requested", "eval_case_result"),
                            when=lambda event: bool(event.newly_failing) and not event.error))
