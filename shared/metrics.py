"""Prometheus metrics: every name the processes export, in one place.

Scraped at `/metrics` on every process's `OPS_PORT` (shared/ops.py), the gateway's too. docs/deploy.md ("Read the metrics") lists them with their labels.
The node and LLM metrics live in whichever process hosts the node or makes the call; the
turn metrics only in the gateway.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)

from shared.events import LLMCall

disable_created_metrics()  # no `*_created` series: Prometheus does not need them

# Handlers range from a rule lookup (a millisecond) to a streamed answer (tens of seconds).
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
LLM_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)
TTFT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 20, 30, 60)

# What happened to one delivered message, by the consumer runner (shared/consumer.py):
#   ok            handled, outputs stored, acked
#   retried       the handler raised; nak'ed for another delivery
#   deferred      the handler's moment has not come (shared/node.py `Later`): nak'ed with
#                 that delay
#   failed        given up (last attempt, PermanentError, or the server's max-deliveries
#                 advisory): TurnFailed appended and the message dead-lettered
#   dead_lettered undecodable payload, dead-lettered and terminated
#   mismatched    envelope disagrees with its subject, dead-lettered and terminated
OUTCOMES = ("ok", "retried", "deferred", "failed", "dead_lettered", "mismatched")

node_events = Counter("concierge_node_events", "Messages a node's consumer finished with, by outcome",
                      ["node", "outcome"])
node_handler_seconds = Histogram("concierge_node_handler_seconds",
                                 "Time from a message's delivery to its ack/nak/term, by node", ["node"],
                                 buckets=HANDLER_BUCKETS)
node_in_flight = Gauge("concierge_node_in_flight", "Messages a node is handling now", ["node"])
node_pending = Gauge("concierge_node_pending",
                     "Messages on the node's durable consumer not yet delivered (num_pending)", ["node"])
node_ack_pending = Gauge("concierge_node_ack_pending",
                         "Messages delivered to the node's consumer and not yet acknowledged", ["node"])
node_ready = Gauge("concierge_node_ready", "1 when the node's durable consumer answered its last check", ["node"])
partitions_owned = Gauge("concierge_partitions_owned",
                         "Partitions of a partitioned node's events this replica consumes (shared/partitions.py)",
                         ["node"])
partition_moves = Counter("concierge_partition_moves",
                          "Partitions this replica took or gave up as its node's members came and went", ["node"])

log_reads = Counter("concierge_log_reads",
                    "Direct-get requests for stored events (one per batch of up to 256), by stream: the "
                    "cost of rebuilding state, which snapshots and the fold cache keep down", ["stream"])

log_feed_breaks = Counter("concierge_log_feed_breaks",
                          "Times this process's log feed (shared/store/feed.py) detached every cached state: `restart` "
                          "(a delivery missed, or the consumer made again), `lagging` (a load waited in vain for it)",
                          ["reason"])

kb_vectors = Counter("concierge_kb_vectors",
                     "Knowledge-base text vectors extractive answers needed, by where they came from: memory, the "
                     "kb_vectors bucket, or embedded on the turn's path (shared/kb_vectors.py)", ["source"])

kb_opens = Counter("concierge_kb_opens", "Sites' knowledge bases opened by this retriever (a site's first query "
                   "since it started or since the pool closed it: services/retriever/pool.py)")
kb_evictions = Counter("concierge_kb_evictions",
                       "Open knowledge bases closed to keep the pool within KB_MEMORY_BUDGET_MB / KB_OPEN_SITES")
kb_open_sites = Gauge("concierge_kb_open_sites", "Sites whose knowledge base this retriever holds open")
kb_open_bytes = Gauge("concierge_kb_open_bytes",
                      "What the open knowledge bases are estimated to take in memory (services/retriever/pool.py)")

llm_calls = Counter("concierge_llm_calls", "LLM calls (a call = one request, retries included)", ["role", "model"])
llm_errors = Counter("concierge_llm_errors", "LLM calls that ended in an error", ["role", "model"])
llm_fallbacks = Counter("concierge_llm_fallbacks", "LLM calls answered (or failed) by the fallback endpoint",
                        ["role", "model"])
llm_tokens = Counter("concierge_llm_tokens", "Tokens the provider reported, by kind (prompt, completion)",
                     ["role", "model", "kind"])
llm_seconds = Histogram("concierge_llm_call_seconds", "LLM call latency, first request to last token",
                        ["role", "model"], buckets=LLM_BUCKETS)

turns = Counter("concierge_gateway_turns",
                "Chat requests by route and outcome (complete, timeout, stalled, failed, interrupted, abandoned, "
                "blocked, rate_limited, busy, conflict)", ["route", "outcome"])
ttft_seconds = Histogram("concierge_gateway_ttft_seconds",
                         "Time from a chat request to the first answer token sent to the visitor",
                         buckets=TTFT_BUCKETS)


GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
gc_pause_seconds = Histogram("concierge_gc_pause_seconds",
                             "The cyclic garbage collector's pauses, by generation: every coroutine of the "
                             "process waits them out", ["generation"], buckets=GC_BUCKETS)
_gc_started: list[float] = []


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_started[:] = [time.perf_counter()]
    elif _gc_started:
        gc_pause_seconds.labels(str(info.get("generation", ""))).observe(time.perf_counter() - _gc_started.pop())


def observe_gc() -> None:
    """Time each collection of the cyclic GC (`gc.callbacks`), once per process."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def observe_llm_call(call: LLMCall) -> None:
    labels = (call.role, call.model)
    llm_calls.labels(*labels).inc()
    llm_seconds.labels(*labels).observe(call.latency_ms / 1000)
    if call.error:
        llm_errors.labels(*labels).inc()
    if call.fallback_used:
        llm_fallbacks.labels(*labels).inc()
    for kind in ("prompt", "completion"):
        if count := (call.usage or {}).get(f"{kind}_tokens"):
            llm_tokens.labels(*labels, kind).inc(count)


def exposition() -> tuple[bytes, str]:
    """The Prometheus text of every metric of this process, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST

# Lead briefs (services/enricher: brief_gatherer, lead_briefer, lead_triager), by outcome:
#   generated  a BriefCompleted stored     failed   a BriefFailed stored (a step gave up)
#   retried    a draft the evaluator failed, written again with its issues as feedback
BRIEF_OUTCOMES = ("generated", "failed", "retried")
briefs = Counter("concierge_briefs", "Lead briefs by outcome and backend (llm | data)", ["outcome", "backend"])
brief_seconds = Histogram("concierge_brief_seconds", "Time to write one brief, gathered data to BriefCompleted",
                          ["backend"], buckets=HANDLER_BUCKETS)
# Account reports (services/enricher: report_gatherer, account_reporter), by the same outcomes.
reports = Counter("concierge_account_reports", "Account reports by outcome and backend (llm | data)",
                  ["outcome", "backend"])

class SiteLabels:
    """The `site` label of per-site series: a site's id for the first SITE_LABELS sites a
    process counts, `_other` for every later one, so that a process's series stay bounded
    whatever the number of sites (each site's own figures are its insight: shared/insight.py,
    the console's Insight view)."""

    OTHER = "_other"

    def __init__(self, limit: int):
        self.limit = limit
        self._named: set[str] = set()

    def __call__(self, site: str) -> str:
        if site in self._named:
            return site
        if len(self._named) < self.limit:
            self._named.add(site)
            return site
        return self.OTHER


SITE_LABELS = 200
site_label = SiteLabels(SITE_LABELS)

# Insight (services/enricher/insight_projector.py), per site, counted as the projector first
# sees a turn end or a vote change (a rebuild counts nothing): a site's rates in PromQL, e.g.
# answered / turns, or converted / conversations ended.
insight_turns = Counter("concierge_insight_turns", "Ended turns by site and outcome (shared/insight.py)",
                        ["site", "outcome"])
insight_feedback = Counter("concierge_insight_feedback", "Visitor votes by site and rating", ["site", "rating"])
insight_conversations = Counter("concierge_insight_conversations",
                                "Conversations by site and the outcome they first reached", ["site", "outcome"])

# Human handoff (issue 42): requests by reason (responder, handoff_handler), what operators do
# (gateway, the operator API), and how long a visitor waited for the first operator reply.
# The handoff rate: handoffs / turns, e.g. sum(rate(concierge_handoffs_total[1h])) /
# sum(rate(concierge_gateway_turns_total{outcome="complete"}[1h])).
handoffs = Counter("concierge_handoffs", "Handoffs requested, by reason (visitor_asked, lead_score, not_found, "
                   "operator)", ["reason"])
# Handoffs nobody could take, by why (out_of_hours: handoff_handler; no_answer: handoff_timer):
# each offered the visitor the e-mail follow-up.
handoffs_unanswered = Counter("concierge_handoffs_unanswered", "Handoffs nobody could take, by why "
                              "(out_of_hours, no_answer)", ["outcome"])
handoff_actions = Counter("concierge_handoff_operator_actions", "Operators' handoff actions (claim, message, "
                          "release, close), stored", ["action"])
handoff_first_reply_seconds = Histogram("concierge_handoff_first_reply_seconds",
                                        "A handoff's request to its first operator message",
                                        buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600))

# Enrichment providers (services/enricher/sources.py `Guarded`): every request sent to a
# provider, retries included, by source (session_provider, person_api, ip_api), site and
# outcome: what each provider costs each site. Outcomes:
#   hit, partial, miss   answered (a completed profile, a partial one, none)
#   rate_limited         its 429: the plan's request rate
#   quota                the plan's credits used up (PDL's 402, Snitcher's 403 "quota")
#   refused              the key refused (401/403)
#   failed, timeout      any other error, no answer in the source's timeout
#   cancelled            the chain's deadline or the turn's route ended it mid-request
ENRICHMENT_OUTCOMES = ("hit", "partial", "miss", "rate_limited", "quota", "refused", "failed", "timeout", "cancelled")
enrichment_calls = Counter("concierge_enrichment_provider_calls",
                           "Requests sent to enrichment providers, by source, site and outcome",
                           ["source", "site", "outcome"])
