"""Where a turn's time goes: the critical path of each route, from the stored events'
timestamps and the client's own clock (one machine: one clock).

    request → TurnRequested stored                        gateway_in
    TurnRequested → the two analyses stored               analyses  (intent, signals)
    analyses → RouteDecided                               route     (the router's join; with the
                                                                     LLM skill selector, its wait too)
    TurnRequested → RetrievalCompleted (ANSWER, parallel) retrieval
    TurnRequested → the visitor's profile (ANSWER, par.)  profile   (the later of EnrichmentCompleted
                                                                     and ProfileInferred)
    max(RouteDecided, RetrievalCompleted) → the profile   profile_wait   (what the answer waited for it,
                                                                          within the site's budget)
    max(RouteDecided, RetrievalCompleted, profile) → LLM request   answer_start   (a reply from an LLM)
    LLM request → first token published                   model          (the LLM's time to first
                                                                          token, and its way out)
    RouteDecided / retrieval → first token published      reply          (no LLM: extractive, templates)
    first token published → first SSE token read          relay

An LLM call's request time is its record's timestamp minus its latency. Per route and segment `p50` in ms; a segment
a turn does not go through is left out of that turn.
"""

from __future__ import annotations

from collections import defaultdict

from cli.measure.stats import percentile
from shared import events as ev

ANALYSES = ("intent_classified", "interest_signals_detected")
SEGMENTS = ("gateway_in", "analyses", "route", "retrieval", "profile", "profile_wait", "answer_start", "model", "reply",
            "relay")
PROFILE = ("enrichment_completed", "profile_inferred")
REPLY_NODES = {"ANSWER": "answer_writer", "REDIRECT": "redirect_handler", "BOOKING": "booking_handler"}


def turn_segments(records: list, first_token_ts: float | None, sent_at: float | None,
                  first_read_at: float | None) -> tuple[str | None, dict[str, float]]:
    """(route, {segment: ms}) of one turn: `records` its stored events, `first_token_ts` the
    first TokenChunk's timestamp, `sent_at` / `first_read_at` the client's clock (time.time())
    when it sent the request and read the first token."""
    at: dict[str, float] = {}
    route, llm_call = None, None
    for event in records:
        kind = ev.event_type(event)
        at.setdefault(kind, event.ts)
        if kind == "route_decided":
            route = event.route
        if kind == "llm_call_recorded" and route and event.node == REPLY_NODES.get(route) and llm_call is None:
            llm_call = event
    start = at.get("turn_requested")
    if start is None or route is None:
        return route, {}
    ms = {}
    if sent_at is not None:
        ms["gateway_in"] = start - sent_at
    analyses = [at[k] for k in ANALYSES if k in at]
    if len(analyses) == len(ANALYSES):
        ms["analyses"] = max(analyses) - start
        ms["route"] = at["route_decided"] - max(analyses)
    ready = at["route_decided"]
    if route == "ANSWER" and "retrieval_completed" in at:
        ms["retrieval"] = at["retrieval_completed"] - start
        ready = max(ready, at["retrieval_completed"])
    started = (llm_call.ts - llm_call.call.latency_ms / 1000) if llm_call is not None else first_token_ts
    if route == "ANSWER" and all(k in at for k in PROFILE):
        profiled = max(at[k] for k in PROFILE)
        ms["profile"] = profiled - start
        if started is not None:  # the answer waited for it until it came or its budget ran out
            waited_until = min(profiled, started)
            ms["profile_wait"] = max(0.0, waited_until - ready)
            ready = max(ready, waited_until)
    if first_token_ts is not None:
        if llm_call is not None:
            requested = llm_call.ts - llm_call.call.latency_ms / 1000
            ms["answer_start"] = requested - ready
            ms["model"] = first_token_ts - requested
        else:
            ms["reply"] = first_token_ts - ready
        if first_read_at is not None:
            ms["relay"] = first_read_at - first_token_ts
    return route, {segment: value * 1000 for segment, value in ms.items()}


def summarize(turns: list[tuple[str | None, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per route, each segment's p50 (ms) over the turns that went through it."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for route, segments in turns:
        if route:
            for segment, ms in segments.items():
                values[route][segment].append(ms)
    return {route: {segment: round(percentile(values[route][segment], 50), 1)
                    for segment in SEGMENTS if values[route].get(segment)}
            for route in sorted(values)}


def profile_wait(turns: list[tuple[str | None, dict[str, float]]]) -> dict[str, float]:
    """What ANSWER turns waited for the visitor's profile past their route and retrieval (the
    profile budget's cost): p50, p90, p99 in ms, and how many turns waited at all."""
    waits = [segments["profile_wait"] for route, segments in turns if route == "ANSWER" and "profile_wait" in segments]
    if not waits:
        return {}
    return {"p50": round(percentile(waits, 50), 1), "p90": round(percentile(waits, 90), 1),
            "p99": round(percentile(waits, 99), 1), "turns": len(waits), "waited": sum(1 for w in waits if w > 1.0)}
