"""brief_requester: a captured lead becomes a work item for its brief.

`LeadCaptured` → a `BriefRequested` on the BRIEFS work queue (its id derived from the lead's
event, so a redelivered lead queues nothing twice). A booking that goes on after the e-mail
(company, team size) asks once more when it ends (`BookingProgressed.done` on a later turn),
so the latest brief knows what the form collected; a visitor who leaves mid-form still has
the first. The brief itself is written by whichever replica takes the item
(brief_gatherer.py, then lead_briefer.py); operators queue more with `concierge briefs
generate` or the operator API.

An erased lead (`concierge erase-visitor` stores its log again, the e-mail redacted) is
nobody to brief: not queued; nor is a request whose log holds a step of it already (the log
stored again after another lead's erase). A give-up is a `BriefFailed`, never the visitor's
turn failing.
"""

from __future__ import annotations

from services.enricher.briefs.failure import brief_failed
from shared import briefs
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node
from shared.privacy import REDACTED

NAME = "brief_requester"


def wanted(event: ev.LeadCaptured | ev.BookingProgressed, inputs: Inputs) -> str | None:
    """Why this event asks for a brief (the work item's reason), or None."""
    booking = inputs.state.booking
    match event:
        case ev.LeadCaptured() if event.email != REDACTED:
            return "lead_captured"
        case ev.BookingProgressed() if booking.lead_captured and booking.lead_turn < event.turn:
            return "booking_completed"
    return None


async def request(event: ev.LeadCaptured | ev.BookingProgressed, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    reason = wanted(event, inputs)
    if reason is None or briefs.has_step_in(inputs.log, event.event_id):
        return []
    return [ctx.follow(ev.BriefRequested, reason=reason, request_id=event.event_id)]  # to the BRIEFS queue


def make_node() -> Node:
    return Node(name=NAME, consumes=("lead_captured", "booking_progressed"), handle=request,
                needs=Needs(state=True, log=briefs.STEPS,
                            when=lambda event: ev.is_conversation(event.session_id)
                            and (isinstance(event, ev.LeadCaptured) or event.done)),
                failure=brief_failed)
