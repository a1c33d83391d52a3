"""A local HTTP server that plays the enrichment providers (a real server on loopback).

Behaviour per path: /fast answers a profile, /slow answers after 2 s, /fail answers 500,
/malformed answers text that is not JSON, /notfound answers 404. Every hit is counted.
And three vendors' APIs answering in their documented formats, errors included:
/ipinfo/<ip>/json (IPinfo), /snitcher/radar/operator/v1/tracking-scripts/<id>/company/find
(Snitcher Radar), /pdl/v5/person/enrich (People Data Labs). Their keys: KEYS.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from cli.harness.supervisor import free_port

PROFILE = {"company_name": "Hooli", "company_domain": "hooli.example", "sector": "Software", "tier": "enterprise"}
KEYS = ("secret", "site-secret")  # the keys the vendors' stand-ins accept: the deployment's, a site's own


class Providers:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.hits: Counter = Counter()
        self.seen: list[dict] = []


def create_app(state: Providers) -> Starlette:
    async def handle(request: Request) -> Response:
        mode = request.path_params["mode"]
        state.hits[mode] += 1
        state.seen.append({"mode": mode, "query": dict(request.query_params),
                           "body": (await request.body()).decode(), "auth": request.headers.get("authorization")})
        if mode == "fast":
            return JSONResponse(PROFILE)
        if mode == "slow":
            await asyncio.sleep(2)
            return JSONResponse(PROFILE)
        if mode == "fail":
            return JSONResponse({"error": "boom"}, status_code=500)
        if mode == "malformed":
            return PlainTextResponse("<html>not json</html>")
        if mode == "badvalues":
            return JSONResponse({"company_name": 42})
        return JSONResponse({"error": "unknown"}, status_code=404)

    async def ipinfo(request: Request) -> Response:
        """IPinfo's `GET /{ip}/json`, answering as its documentation shows (a token as bearer)."""
        ip = request.path_params["ip"]
        state.hits["ipinfo"] += 1
        if request.headers.get("authorization") != "Bearer secret":
            return JSONResponse({"status": 403, "error": {"title": "Unknown token", "message": "Please ensure "
                                 "you've entered your token correctly."}}, status_code=403)
        if ip in IPINFO:
            return JSONResponse(IPINFO[ip])
        if ip == "203.0.113.99":
            return JSONResponse({"status": 429, "error": {"title": "Rate limit exceeded", "message": "Upgrade to "
                                 "increase your usage limits at https://ipinfo.io/pricing"}}, status_code=429)
        return JSONResponse({"status": 404, "error": {"title": "Wrong ip", "message": "Please provide a valid IP "
                             "address"}}, status_code=404)

    async def snitcher(request: Request) -> Response:
        """Snitcher Radar's `POST /radar/operator/v1/tracking-scripts/{id}/company/find`, a
        bearer key, {"session_uuid"}: answered as its documentation shows (the IP lookup's
        documented answer and errors, which the session lookup shares)."""
        state.hits["snitcher"] += 1
        body = await request.json()
        state.seen.append({"mode": "snitcher", "path": request.url.path, "body": body,
                           "auth": request.headers.get("authorization")})
        if request.headers.get("authorization") not in [f"Bearer {k}" for k in KEYS]:
            return JSONResponse({"message": "Unauthenticated."}, status_code=401)
        if request.path_params["script"] != SNITCHER_SCRIPT:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        found = SNITCHER.get(body.get("session_uuid"))
        if found is None:
            return JSONResponse({"message": "No company found for this session."}, status_code=404)
        status, answer = found
        return JSONResponse(answer, status_code=status)

    async def pdl(request: Request) -> Response:
        """People Data Labs' `GET /v5/person/enrich`, the key in `X-Api-Key`: a person by
        `email_hash`, honouring `min_likelihood` and `required` as PDL does (a 404 below them),
        its documented error bodies."""
        state.hits["pdl"] += 1
        query = dict(request.query_params)
        state.seen.append({"mode": "pdl", "query": query, "auth": request.headers.get("x-api-key")})
        if request.headers.get("x-api-key") not in KEYS:
            return _pdl_error(401, "authentication_error", "Invalid API Key")
        record = PDL.get(query.get("email_hash", ""))
        if isinstance(record, tuple):
            return _pdl_error(*record)
        if record is None or record["likelihood"] < int(query.get("min_likelihood", "0")) or any(
                not record["data"].get(field) for field in query.get("required", "").split(" AND ") if field):
            return _pdl_error(404, "not_found", "No records were found matching your request")
        return JSONResponse({"status": 200, **record})

    return Starlette(routes=[Route("/ipinfo/{ip}/json", ipinfo),
                             Route("/snitcher/radar/operator/v1/tracking-scripts/{script}/company/find", snitcher,
                                   methods=["POST"]),
                             Route("/pdl/v5/person/enrich", pdl),
                             Route("/{mode}", handle, methods=["GET", "POST"])])


def _pdl_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"status": status, "error": {"type": kind, "message": message}}, status_code=status)


def sha256(email: str) -> str:
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()


# Snitcher's answers (its documented shape), by session: a business, a fuzzy match, an ISP, a
# session still being resolved (202), the rate limit (429), the quota used up (403).
SNITCHER_SCRIPT = "script-1"
SNITCHER = {
    "sess-business": (200, {
        "ip": "203.0.113.10", "fuzzy": False, "domain": "initech.example", "type": "business",
        "company": {"name": "Initech", "domain": "initech.example", "website": "https://initech.example",
                    "industry": "Information Technology and Services", "founded_year": "2015",
                    "employee_range": "51-200 employees", "annual_revenue": 2000000, "total_funding": None,
                    "location": "Oude Enghweg 2, 1217 JC Hilversum, Netherlands",
                    "description": "Initech makes TPS reports."}}),
    "sess-fuzzy": (200, {"ip": "203.0.113.11", "fuzzy": True, "domain": "globex.example", "type": "business",
                         "company": {"name": "Globex", "domain": "globex.example", "industry": "Manufacturing",
                                     "employee_range": "1001-5000 employees",
                                     "location": "1 Main St, Springfield, United States"}}),
    "sess-isp": (200, {"ip": "203.0.113.12", "fuzzy": False, "type": "isp",
                       "company": {"name": "Example Telecom", "domain": "telecom.example"}}),
    "sess-queued": (202, {"status": 202, "message": "Queued for enrichment. Please retry this request in a few "
                                                    "seconds."}),
    "sess-ratelimited": (429, {"message": "Too Many Attempts."}),
    "sess-quota": (403, {"message": "You have exceeded your allowed quota. Please upgrade to a plan that allows "
                                    "more volume or wait for your billing cycle to reset."}),
}

# PDL's records (its documented shape: a person, `likelihood` 1-10), by the e-mail's SHA-256;
# a tuple is an error answer (status, type, message).
PDL_EMAIL = "Ada.Lovelace@Hooli.example"
PDL = {
    sha256(PDL_EMAIL): {"likelihood": 9, "data": {
        "id": "qEnOZ5Oh0poWnQ1luFBfVw_0000", "full_name": "ada lovelace", "first_name": "ada",
        "work_email": "ada.lovelace@hooli.example", "job_title": "head of engineering",
        "job_company_name": "hooli", "job_company_website": "hooli.example",
        "job_company_industry": "computer software", "job_company_size": "1001-5000",
        "job_company_location_country": "united states", "location_country": "united states"}},
    sha256("grace@initech.example"): {"likelihood": 6, "data": {
        "full_name": "grace hopper", "job_company_name": "Initech GmbH",
        "job_company_website": "https://www.initech.example/", "job_company_industry": "information technology and services", "job_company_size": "51-200",
        "job_company_location_country": "germany"}},
    sha256("weak@globex.example"): {"likelihood": 3, "data": {"full_name": "weak match", "job_company_name": "globex"}},
    sha256("between@jobs.example"): {"likelihood": 9, "data": {"full_name": "between jobs", "job_company_name": None}},
    sha256("credits@pdl.example"): (402, "payment_required", "You have hit your account maximum for person "
                                                              "enrichment (all matches used)"),
    sha256("rate@pdl.example"): (429, "rate_limit_error", "An error occurred due to requests hitting the API too "
                                                          "quick"),
}


# IPinfo's answers (its documented shape), by address: a business (paid plan: `company`), an
# ISP's customer, a free plan's `org` only, a private address.
IPINFO = {
    "203.0.113.10": {"ip": "203.0.113.10", "city": "Austin", "region": "Texas", "country": "US",
                     "loc": "30.2672,-97.7431", "org": "AS64500 Initech Inc.", "postal": "78701",
                     "timezone": "America/Chicago",
                     "asn": {"asn": "AS64500", "name": "Initech Inc.", "domain": "initech.example",
                             "route": "203.0.113.0/24", "type": "business"},
                     "company": {"name": "Initech", "domain": "initech.example", "type": "business"}},
    "203.0.113.20": {"ip": "203.0.113.20", "country": "DE", "org": "AS64501 Example Telecom",
                     "company": {"name": "Example Telecom", "domain": "telecom.example", "type": "isp"}},
    "198.51.100.7": {"ip": "198.51.100.7", "city": "Boston", "country": "US", "org": "AS64502 Example University"},
    "10.0.0.1": {"ip": "10.0.0.1", "bogon": True},
}


@contextmanager
def provider_server() -> Iterator[Providers]:
    port = free_port()
    state = Providers(port)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(5)
