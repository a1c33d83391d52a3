"""retrieval: what the site's knowledge base says about this turn's message.

On `TurnRequested`: the search text is the message, with the visitor's previous message in
front for a short follow-up ("and with Salesforce?"), unless that message was a HACK
turn's (the gateway puts it on the event, `TurnRequested.previous`, from the state it
loaded to start the turn: retrieval, the long pole of an ANSWER turn, reads no log before
its search); the site's `Retriever` (search.py: keywords, LightRAG, reranker or limiter)
finds the documents → `RetrievalCompleted` with them numbered 1..N for `[N]` citations.

A REDIRECT or BOOKING route for the turn cancels a retrieval still running; the event
says `cancelled`. A knowledge base that fails twice gives a `RetrievalCompleted` with the
error: the answer goes on without sources rather than the turn failing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.retriever.search import KnowledgeBaseError, Retriever, search_text
from shared import language
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "retrieval"


def make_node(retriever: Retriever, partitions: int = 0, on_partitions=None) -> Node:
    """`partitions` > 0: the turns split by site across the replicas (shared/partitions.py),
    `on_partitions(owned, count)` told which this replica answers."""
    async def retrieve(event: ev.TurnRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        started = time.perf_counter()
        mode = retriever.base.for_site(inputs.config).mode

        def done(**fields) -> ev.RetrievalCompleted:
            return ctx.follow(ev.RetrievalCompleted, mode=mode, embedding_version=retriever.kb.embedder.version,
                              latency_ms=round((time.perf_counter() - started) * 1000, 2), **fields)

        if not event.message.strip():
            return [done(error="empty message: nothing to search for")]
        query = search_text(event.previous or "", event.message)
        lang = language.guess(query, event.visitor)
        work = asyncio.create_task(retriever.retrieve(event.site, query, inputs.config, ctx.record_llm, lang,
                                                      message=event.message))
        try:
            cancelled = await inputs.route.race(work)
        except KnowledgeBaseError as exc:
            log.error("retrieval failed", extra={"site": event.site, "error": str(exc)})
            return [done(query=query, error=str(exc))]
        if cancelled:
            return [done(query=query, cancelled=True)]
        result = work.result()
        return [done(query=query, documents=result.documents, keywords=result.keywords, found=result.found,
                     selection=result.selection, fallback=result.fallback, unknown_names=result.unknown_names,
                     contact_page=result.contact_page,
                     error="; ".join(result.errors) or None)]

    return Node(name=NAME, consumes=("turn_requested",), handle=retrieve, needs=Needs(config=True, route=True),
                partitions=partitions, on_partitions=on_partitions)
