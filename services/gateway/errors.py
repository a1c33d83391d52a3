"""What the API answers instead of a result: each exception a route raises, as JSON
(`schemas.ErrorBody`: a code and a detail) with its status. `HANDLERS` is what create_app
installs."""

from __future__ import annotations

import asyncio
import logging

import nats.errors
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from services.gateway.operators import Unauthorized
from shared.accounts import AccountsError
from shared.eval_cases import CaseError
from shared.sources import SourceError
from services.gateway.schemas import RequestError
from shared.site_config import SiteConfigError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2  # what a 503 asks a client to wait: the bus back, or the sites loaded


class NotReady(Exception):
    """This gateway cannot answer yet (its sites are not loaded): 503 with Retry-After."""


class NotFound(Exception):
    """Nothing there for this caller: 404. An operator of another site gets it too, as if
    the site had nothing."""


class RateLimited(Exception):
    """Too many requests from this address or for this site: 429 after `wait_s`."""

    def __init__(self, wait_s: int):
        super().__init__(f"too many requests; retry in {wait_s} s")
        self.wait_s = wait_s


class TurnInProgress(Exception):
    """The session has a turn that has not ended: 429 (with Retry-After when the log, not the
    guard, says so: the turn may end any moment)."""

    def __init__(self, detail: str, retry_after_s: int | None = None):
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class Conflict(Exception):
    """The conversation is not where the request needs it: it moved on while this turn
    started (the log's sequence check), or the turn voted on has no answer: 409."""


def _answer(error: str, detail, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [{"field": ".".join(str(p) for p in e.get("loc", ())[1:]) or None, "message": e.get("msg", "")}
              for e in exc.errors()]
    return _answer("invalid_request", detail, 422)


async def _invalid_definition(_: Request, exc: SiteConfigError | SourceError | AccountsError | CaseError
                              ) -> JSONResponse:
    # Every field's problem at once (a form shows each beside its field), in `detail` as every
    # 422 has them, and as `errors` too, the name the operator UI and the CLI read.
    errors = [e if isinstance(e, dict) else {"field": e.field, "message": e.message} for e in exc.errors]
    return JSONResponse({"error": "invalid_request", "detail": errors, "errors": errors}, status_code=422)


async def _unauthorized(_: Request, exc: Unauthorized) -> JSONResponse:
    return _answer("unauthorized", exc.detail, 401, {"WWW-Authenticate": "Bearer"})


async def _not_ready(_: Request, exc: NotReady) -> JSONResponse:
    return _answer("unavailable", str(exc), 503, {"Retry-After": str(RETRY_AFTER_S)})


async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
    return _answer("not_found", str(exc), 404)


async def _rate_limited(_: Request, exc: RateLimited) -> JSONResponse:
    return _answer("rate_limited", str(exc), 429, {"Retry-After": str(exc.wait_s)})


async def _turn_in_progress(_: Request, exc: TurnInProgress) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return _answer("turn_in_progress", str(exc), 429, headers)


async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
    return _answer("conflict", str(exc), 409)


async def _too_large_for_the_bus(_: Request, exc: Exception) -> JSONResponse:
    # What a request would write is bigger than one message of the bus: the caller's to shrink.
    return _answer("too_large", "what this request would store is larger than one message of the event bus may be",
                   413)


async def _bus_unavailable(_: Request, exc: Exception) -> JSONResponse:
    # The bus is down or slow: the client may retry; this is not its mistake, nor a bug.
    log.error("bus unavailable", extra={"error": repr(exc)})
    return _answer("unavailable", "the event bus is not reachable; retry shortly", 503,
                   {"Retry-After": str(RETRY_AFTER_S)})


HANDLERS = {
    RequestError: _request_error,
    RequestValidationError: _validation_error,
    SiteConfigError: _invalid_definition,
    SourceError: _invalid_definition,
    AccountsError: _invalid_definition,
    CaseError: _invalid_definition,
    Unauthorized: _unauthorized,
    NotReady: _not_ready,
    NotFound: _not_found,
    RateLimited: _rate_limited,
    TurnInProgress: _turn_in_progress,
    Conflict: _conflict,
    nats.errors.MaxPayloadError: _too_large_for_the_bus,
    nats.errors.Error: _bus_unavailable,
    asyncio.TimeoutError: _bus_unavailable,
}
