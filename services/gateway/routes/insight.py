"""A site's insight, for operators (under the operator prefix: operator.py): the figures and
knowledge gaps projected from its conversations (shared/insight.py, shared/gaps.py), the
conversations behind a number, exports, and curated answers.

- `GET  insight?since=7d&until=&language=&route=`: what `concierge insight` prints last (one
  JSON object: the figures, per day, and the gaps, largest first);
- `GET  insight/conversations?since=&outcome=&turn_outcome=&language=&route=`: the
  conversations behind a figure (session, start, outcome, first question), newest first;
- `GET  insight/conversations.csv`, `GET insight/leads.csv`: exports over the same range;
- `POST insight/answers` (`{"question": ..., "answer": ...}`): a curated answer, a knowledge
  source of its own (shared/sources.py `curated_spec`), synced now, 202; it marks the gaps it
  answers, and closes them once a similar question is answered from it.

A duration that is not one (`since=week`) or an unknown route or outcome is a 422 naming it.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from shared import gaps, insight, sources
from services.gateway.access import operator_of_site
from services.gateway.openapi import SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import decode, read_body

router = APIRouter()
_answer = msgspec.json.Decoder(sources.CuratedInput)
MAX_ANSWER_BYTES = 256 * 1024
LISTED = 500  # conversations listed at most (newest first)
Duration = Annotated[str | None, Query(max_length=16, description="7d, 24h, 90m or seconds")]
Language = Annotated[str | None, Query(pattern=r"^[a-z]{2}$")]
RouteName = Literal["ANSWER", "REDIRECT", "BOOKING", "HANDOFF"]


def filters(since: str | None, until: str | None, language: str | None, route: str | None) -> insight.Filters:
    now = time.time()

    def ago(name: str, value: str) -> float:
        try:
            return now - insight.since_seconds(value)
        except ValueError as exc:
            raise RequestValidationError([{"loc": ("query", name), "msg": str(exc), "type": "value_error"}]) from None

    return insight.Filters(since=ago("since", since or "7d"), until=ago("until", until) if until else float("inf"),
                           language=language, route=route)


@router.get("/insight")
async def site_insight(request: Request, site: SiteId, since: Duration = None, until: Duration = None,
                       language: Language = None, route: RouteName | None = None):
    """The site's figures over the range, per day, and its knowledge gaps, largest first."""
    from shared.embeddings import shared_embedder

    return await gaps.report(request.app.state.bus, site, filters(since, until, language, route),
                                shared_embedder().embed_many)


def _listed(records: list[insight.ConversationFacts], chosen: insight.Filters, outcome: str | None,
            turn_outcome: str | None) -> list[insight.ConversationFacts]:
    found = [r for r in insight.selected(records, chosen) if (outcome is None or r.outcome == outcome)
             and (turn_outcome is None or any(t.outcome == turn_outcome or (turn_outcome == t.rating and t.rating)
                                              for t in r.turns))]
    return sorted(found, key=lambda r: -r.started_ts)


@router.get("/insight/conversations")
async def insight_conversations(request: Request, site: SiteId, since: Duration = None, until: Duration = None,
                                language: Language = None, route: RouteName | None = None,
                                outcome: Literal["resolved", "unresolved", "converted", "abandoned"] | None = None,
                                turn_outcome: Literal["answered", "not_found", "redirected", "booking", "handoff", "blocked",
                                                      "failed", "up", "down"] | None = None):
    """The conversations behind a figure: those of the range with this outcome, or with a
    turn of this outcome (`up`, `down`: a turn rated so)."""
    records = await insight.Projections(request.app.state.bus).records(site)
    found = _listed(records, filters(since, until, language, route), outcome, turn_outcome)
    return {"site": site, "count": len(found), "conversations": [
        {"session_id": r.session_id, "started": r.started_ts, "language": r.language, "outcome": r.outcome,
         "turns": len(r.turns), "question": next((t.question for t in r.turns if t.question), "")}
        for r in found[:LISTED]]}


def _csv(rows: list[list], header: list[str], name: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@router.get("/insight/conversations.csv")
async def conversations_csv(request: Request, site: SiteId, since: Duration = None, until: Duration = None,
                            language: Language = None, route: RouteName | None = None):
    """Every conversation of the range with its outcome and counts, as CSV."""
    records = await insight.Projections(request.app.state.bus).records(site)
    found = _listed(records, filters(since, until, language, route), None, None)
    rows = [[r.session_id, _iso(r.started_ts), r.language, r.outcome, len(r.turns),
             sum(t.outcome == "answered" for t in r.turns), sum(t.outcome == "not_found" for t in r.turns),
             sum(t.outcome == "redirected" for t in r.turns), int(r.booking_started), int(r.booking_completed),
             int(r.lead), sum(t.rating == "up" for t in r.turns), sum(t.rating == "down" for t in r.turns),
             next((t.question for t in r.turns if t.question), "")] for r in found]
    return _csv(rows, ["session_id", "started", "language", "outcome", "turns", "answered", "not_found",
                       "redirected", "booking_started", "booking_completed", "lead", "feedback_up",
                       "feedback_down", "first_question"], f"{site}-conversations.csv")


@router.get("/insight/leads.csv")
async def leads_csv(request: Request, site: SiteId, since: Duration = None, until: Duration = None):
    """The range's leads (erased ones left out), with their conversation's outcome, as CSV."""
    from shared import subjects
    from shared.briefs import first_captures

    chosen = filters(since, until, None, None)
    bus = request.app.state.bus
    captures = first_captures(await bus.read(subjects.conv_of_type("lead_captured", site)))
    outcomes = {r.session_id: r for r in await insight.Projections(bus).records(site)}
    rows = [[session, _iso(lead.ts), lead.email, lead.capture_context,
             outcomes[session].outcome if session in outcomes else "",
             outcomes[session].language if session in outcomes else ""]
            for session, lead in captures.items() if chosen.since <= lead.ts < chosen.until]
    return _csv(rows, ["session_id", "captured", "email", "capture_context", "outcome", "language"],
                f"{site}-leads.csv")


@router.post("/insight/answers", status_code=202)
async def curated_answer(request: Request, site: SiteId, who: Annotated[Operator, Depends(operator_of_site)]):
    """An operator's answer to a question: a knowledge source of its own, synced now."""
    given = decode(await read_body(request, MAX_ANSWER_BYTES), _answer)
    spec = sources.curated_spec(given)  # SourceError: a 422 naming each field (errors.py)
    actor = "admin" if who.site is None else f"key:{who.site}"
    bus = request.app.state.bus
    await sources.define(bus, site, spec, actor)
    run, _ = await sources.request_sync(bus, site, spec.id, "curated answer", actor)
    # An answer citing it names it by its question (a page with no web address is cited by its title).
    return {"site": site, "source": spec.id, "question": spec.title, "cited_as": spec.title, "run": run.turn}

