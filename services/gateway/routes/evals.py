"""A site's own test cases, for operators (under the operator prefix: operator.py; the cases'
logs and checks: shared/eval_cases.py).

- `GET    evals/cases` (`retired=true`: those too): every case, its newest version;
- `POST   evals/cases`: a case, 201 (`{"message", "history", "lang", "expect", "note"}`, or
  `{"from_session", "from_turn", "expect", "note"}`: the visitor's message of that turn and
  the conversation before it read from its log); saving the same turn again is an edit
  (its next version, 200). Every wrong field is a 422 naming it;
- `GET    evals/cases/{case_id}`: the case and every version, with who saved it;
- `PUT    evals/cases/{case_id}`: its next version (what a POST takes; the id stays);
- `DELETE evals/cases/{case_id}`: retired (its versions stay; a PUT brings it back);
- `POST   evals/runs`: run the site's current cases against the system as it is now, 202
  with the run's id (the gateway's eval_runner carries it out: shared/eval_runs.py); 409
  when the site has no case;
- `GET    evals/runs`: the site's runs, newest first, with their pass rates;
- `GET    evals/runs/{run}`: one run, each case's result (what it answered, what it missed).
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from services.gateway.access import operator_of_site
from services.gateway.errors import NotFound
from services.gateway.openapi import ID_PATTERN, SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import RequestError, decode, read_body
from shared import eval_cases, eval_runs, history
from shared import events as ev

router = APIRouter()
Who = Annotated[Operator, Depends(operator_of_site)]
CaseId = Annotated[str, Path(pattern=r"^case-[0-9a-f]{12}$", description="a test case's id")]
RunId = Annotated[str, Path(pattern=r"^run-[0-9a-f]{12}$", description="a run's id")]
_input = msgspec.json.Decoder(eval_cases.CaseInput)
MAX_BODY = 64 * 1024


def _shown(saved: ev.EvalCaseSaved, retired: bool = False) -> dict:
    """The case with every field (its defaults too), its version and who saved it."""
    case = saved.case
    shown = {**msgspec.structs.asdict(case), "expect": msgspec.structs.asdict(case.expect),
             "history": [msgspec.structs.asdict(m) for m in case.history]}
    return {**msgspec.to_builtins(shown), "version": saved.turn, "saved_at": saved.ts, "saved_by": saved.actor,
            "retired": retired}


async def _case_of(request: Request, site: str, given: eval_cases.CaseInput, case_id: str | None) -> ev.EvalCase:
    """The case the input describes: written out, or read from the turn it names."""
    message, past, lang = given.message, list(given.history), given.lang
    if given.from_session:
        if not re.match(ID_PATTERN, given.from_session) or not ev.is_conversation(given.from_session) \
                or given.from_turn < 1:
            raise RequestError("from_session", "a conversation's id and one of its turns (from_turn ≥ 1)")
        state = await request.app.state.store.state(site, given.from_session)
        message = history.message_of(state, given.from_turn)
        if not message:
            raise RequestError("from_turn", f"conversation {given.from_session} has no visitor message at turn "
                                            f"{given.from_turn}", status=404)
        past = [ev.HistoryMessage(role=m.role, content=m.content) for m in state.messages
                if m.turn < given.from_turn and m.role in ("user", "assistant")][-eval_cases.MAX_HISTORY:]
        record = state.turns.get(given.from_turn)
        lang = lang or (record.language if record is not None else "")
    elif given.from_turn:
        raise RequestError("from_session", "from_turn names a turn of the conversation from_session names")
    return ev.EvalCase(id=case_id or eval_cases.case_id(site, message, given.from_session, given.from_turn),
                       message=message, history=past, lang=lang, expect=given.expect, note=given.note,
                       from_session=given.from_session, from_turn=given.from_turn)


@router.get("/evals/cases")
async def list_cases(request: Request, site: SiteId, retired: bool = Query(False)):
    """The site's test cases, newest version of each (retired ones with `retired=true`)."""
    found = await eval_cases.current(request.app.state.bus, site)
    cases = [_shown(saved, gone) for saved, gone in found.values() if retired or not gone]
    return JSONResponse({"site": site, "cases": cases}, headers={"Cache-Control": "no-store"})


@router.post("/evals/cases", status_code=201)
async def add_case(request: Request, site: SiteId, who: Who):
    """Save a case: a visitor's message and what should have happened."""
    given = decode(await read_body(request, MAX_BODY), _input)
    case = await _case_of(request, site, given, None)
    saved = await eval_cases.save(request.app.state.bus, site, case, who.actor)
    return JSONResponse({"site": site, "case": _shown(saved)}, status_code=201 if saved.turn == 1 else 200)


async def _log(request: Request, site: str, case_id: str) -> tuple[list[ev.Envelope], ev.EvalCaseSaved, bool]:
    """The case's log, its newest version and whether it is retired; 404 when there is none."""
    log = await eval_cases.versions(request.app.state.bus, site, case_id)
    found = eval_cases.latest(log)
    if found is None:
        raise NotFound(f"no case {case_id} in site {site}")
    return log, *found


@router.get("/evals/cases/{case_id}")
async def show_case(request: Request, site: SiteId, case_id: CaseId):
    """The case, and each of its versions with who saved it."""
    log, saved, retired = await _log(request, site, case_id)
    return JSONResponse({"site": site, "case": _shown(saved, retired),
                         "versions": [_shown(e) if isinstance(e, ev.EvalCaseSaved)
                                      else {"retired_at": e.ts, "retired_by": e.actor, "version": e.turn}
                                      for e in log]}, headers={"Cache-Control": "no-store"})


@router.put("/evals/cases/{case_id}")
async def edit_case(request: Request, site: SiteId, case_id: CaseId, who: Who):
    """The case's next version."""
    await _log(request, site, case_id)
    given = decode(await read_body(request, MAX_BODY), _input)
    saved = await eval_cases.save(request.app.state.bus, site, await _case_of(request, site, given, case_id), who.actor)
    return {"site": site, "case": _shown(saved)}


@router.delete("/evals/cases/{case_id}")
async def retire_case(request: Request, site: SiteId, case_id: CaseId, who: Who):
    """Withdraw the case from the site's runs; its versions stay."""
    await _log(request, site, case_id)
    await eval_cases.retire(request.app.state.bus, site, case_id, who.actor)
    return {"site": site, "case": case_id, "retired": True}


@router.post("/evals/runs", status_code=202)
async def start_run(request: Request, site: SiteId, who: Who):
    """Run the site's current cases; the run's results come as its log grows."""
    bus = request.app.state.bus
    found = await eval_cases.current(bus, site)
    if not any(not retired for _, retired in found.values()):
        raise RequestError("cases", f"site {site} has no test case to run: save one first", status=409)
    requested = await eval_runs.request(bus, site, "operator", who.actor)
    return JSONResponse({"site": site, "run": eval_runs.summary(requested, None)}, status_code=202)


@router.get("/evals/runs")
async def list_runs(request: Request, site: SiteId):
    """The site's runs, newest first."""
    return JSONResponse({"site": site, "runs": await eval_runs.runs(request.app.state.bus, site)},
                        headers={"Cache-Control": "no-store"})


@router.get("/evals/runs/{run}")
async def show_run(request: Request, site: SiteId, run: RunId):
    """A run and each case's result."""
    found = await eval_runs.run_detail(request.app.state.bus, site, run)
    if found is None:
        raise NotFound(f"no run {run} in site {site}")
    return JSONResponse({"site": site, "run": found}, headers={"Cache-Control": "no-store"})
