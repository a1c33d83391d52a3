"""handoff_timer: nobody is left waiting for a person in silence.

Woken by each `HandoffRequested`; until the site's maximum wait (`[handoff] max_wait_s`)
has passed since the request it hands the event back to the server to come again then
(shared/node.py `Later`: the server keeps the time, so a restart loses no timer). Then, if
the same handoff is still waiting with no operator having joined or written, it ends it
(`HandoffEnded`, by "system", `no_answer`) with a localized message asking for an e-mail
address the team can write to (data/replies.toml `handoff.no_answer`), which the visitor's
live channel carries. A handoff taken, ended or replaced by a later request in the meantime
is left alone. A replay does not run this node: what it stored is put back where it was in
the log, like the operators' steps (cli/replay/sandbox.py).
"""

from __future__ import annotations

import time

from services.responder import replies
from shared import events as ev
from shared import metrics
from shared.node import Context, Inputs, Later, Needs, Node, conversation_only

NAME = "handoff_timer"
CLOCK_SLACK_S = 1.0


async def check(event: ev.HandoffRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    state, config = inputs.state, inputs.config
    handoff = state.handoff
    if handoff.status != "waiting" or handoff.requested_ts != event.ts or handoff.replied:
        return []  # taken, ended, or a later request has its own timer
    due = event.ts + config.handoff.max_wait_s
    now = time.time()
    if now < due - CLOCK_SLACK_S:  # (within the slack: due; replicas' clocks differ a little)
        raise Later(due - now)
    lang = replies.visitor_language(state, handoff.requested_turn)
    offer = replies.follow_up_offer("no_answer", state, lang, site_name=config.name or event.site)
    ended = ctx.follow(ev.HandoffEnded, by="system", outcome="no_answer", message=offer)
    ended.turn = state.turn  # after the visitor's latest message, where it is shown
    metrics.handoffs_unanswered.labels("no_answer").inc()
    return [ended]


# Each handoff waiting for its deadline is one message handed back and not yet acked: as many
# may wait at once as the deployment has open handoffs, which must not hold back the next one's
# first delivery.
WAITING_AT_ONCE = 10_000


def given_up(event: ev.HandoffRequested, node: str, attempts: int, reason: str) -> ev.Envelope:
    """The last attempt failed (the bus or the log unreachable all along): the handoff ends as
    unanswered anyway, in English with no config to hand, so the visitor is not left waiting;
    an operator who holds it by then keeps it (the fold ignores a system end of a held handoff)."""
    return ev.follow(event, ev.HandoffEnded, node, key="given-up", by="system", outcome="no_answer",
                     message=replies.text("handoff.no_answer", "en", site_name=event.site))


def make_node() -> Node:
    return Node(name=NAME, consumes=("handoff_requested",), handle=check, needs=Needs(state=True, config=True, when=conversation_only),
                max_in_flight=WAITING_AT_ONCE, failure=given_up)
