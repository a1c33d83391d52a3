"""What the enricher's brief nodes would have stored, for tests of what reads it (the
operator API, `concierge briefs`, erasure): a captured lead, a brief, a failure, a triage."""

from __future__ import annotations

from shared import events as ev

BRIEF = """## Summary
Ada from Acme wants a demo for 25 seats.

## Next step
Call ada@example.com this week."""
SCRIPT = "Opening: Hi Ada, thanks for asking about the demo.\nQuestion: how many seats?"


async def capture(bus, site: str, session: str, email: str = "ada@example.com", turn: int = 2) -> ev.LeadCaptured:
    """A conversation of `turn` turns whose visitor left `email` in the last one."""
    for number in range(1, turn + 1):
        await bus.publish(ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=number,
                                           ts=ev.now(), producer="test", message=f"message {number}"))
    lead = ev.LeadCaptured(event_id=ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(),
                           producer="booking_handler", email=email)
    await bus.publish(lead)
    return lead


def completed(site: str, session: str, request_id: str = "", priority: int = 7, stage: str = "evaluating",
              **fields) -> ev.BriefCompleted:
    values = {"brief": BRIEF, "call_script": SCRIPT, "summary": "Acme, 25 seats, wants a demo",
              "verdict": "pass", **fields}
    return ev.BriefCompleted(event_id=ev.new_id(), site=site, session_id=session, turn=2, ts=ev.now(),
                             producer="brief_writer", request_id=request_id or ev.new_id(),
                             metadata=ev.BriefMetadata(priority=priority, stage=stage, estimated_seats=25,
                                                       confidence=60), **values)


def failed(site: str, session: str, request_id: str = "", reason: str = "the model never gave valid metadata"):
    return ev.BriefFailed(event_id=ev.new_id(), site=site, session_id=session, turn=2, ts=ev.now(),
                          producer="brief_writer", node="brief_writer", reason=reason,
                          request_id=request_id or ev.new_id())


def triage(site: str, request_id: str, *items: tuple[str, str, str]) -> ev.TriageCompleted:
    """`items`: (session, classification, reason)."""
    return ev.TriageCompleted(event_id=ev.new_id(), site=site, session_id=ev.TRIAGE_SESSION, turn=0, ts=ev.now(),
                              producer="lead_triager", request_id=request_id, backend="data", leads=len(items),
                              items=[ev.TriageItem(session_id=s, classification=c, reason=r) for s, c, r in items])
