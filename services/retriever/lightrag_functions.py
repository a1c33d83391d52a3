"""The functions the knowledge base hands LightRAG: embedding, the LLM (or none), and its logging."""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from typing import Any

import numpy as np

from shared.embeddings import Embedder
from shared.llm import LLMClient

log = logging.getLogger(__name__)


QUERY_TEXTS = 8  # at most this many texts at once is a query (LightRAG embeds its three together)


def embedding_function(embedder: Embedder):
    """A plain function (LightRAG deep-copies its config; a bound method would copy the
    whole knowledge base): a query's few texts (the question and its two keyword lists, in
    one call) go through the embedder's cache and batching, so a question asked again costs
    no model call; many (ingestion) are embedded in length-sorted batches off the event
    loop, without filling the cache."""

    async def embed(texts: list[str], **_: Any) -> np.ndarray:
        if len(texts) <= QUERY_TEXTS:
            return await embedder.aembed_all(list(texts))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, embedder.embed_many, list(texts))

    return embed


def llm_function(llm: LLMClient):
    """LightRAG's LLM hook on the `extraction` role. Ingestion belongs to no conversation,
    so the calls are logged rather than stored as events."""

    async def complete(prompt: str, system_prompt: str | None = None, history_messages: list | None = None,
                       **_: Any) -> str:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            list(history_messages or []) + [{"role": "user", "content": prompt}]
        return await llm.complete("extraction", messages, _log_call, temperature=0.0)

    return complete


async def _log_call(call) -> None:
    log.debug("extraction LLM call", extra={"model": call.model, "latency_ms": call.latency_ms, "error": call.error})


async def no_llm(*_: Any, **__: Any) -> str:
    raise RuntimeError("the knowledge base was asked for an LLM call: retrieval and offline ingestion need none")


def quiet_lightrag() -> None:
    """LightRAG logs every storage step at INFO and warns about payload indexes in
    Qdrant's local mode (they do nothing there); keep our logs readable."""
    import lightrag.utils  # noqa: F401 - it sets its logger's level on import; ours comes after

    # LOG_LEVEL as logs.setup reads it: logging set-up, once, when the knowledge base opens at
    # start (tests/test_settings.py lists this read).
    level = logging.DEBUG if os.environ.get("LOG_LEVEL", "").upper() == "DEBUG" else logging.ERROR
    logging.getLogger("lightrag").setLevel(level)
    warnings.filterwarnings("ignore", message="Payload indexes have no effect", category=UserWarning)


async def _tokenize_inline(fn, *args):
    return fn(*args)


def tokenize_inline() -> None:
    """LightRAG counts and cuts a query's context in tokens on a one-thread executor, to keep
    a sub-word tokenizer (tiktoken) off the event loop. Ours is one regex pass
    (word_tokenizer.py): the hand-over to the thread and back cost more than the counting
    (the retriever's thread hops were a third of a query's time, measured with pyinstrument;
    inline, a query took 1.5-2 ms less CPU). LightRAG's module functions are swapped for an
    inline call; each module is checked to hold the name, so a LightRAG that renamed it
    fails here at start, not silently (pinned: lightrag-hku 1.5.7)."""
    import lightrag.operate
    import lightrag.utils

    for module in (lightrag.utils, lightrag.operate):
        if not hasattr(module, "run_in_tokenizer_executor"):
            raise RuntimeError(f"{module.__name__} has no run_in_tokenizer_executor: check LightRAG's version")
        module.run_in_tokenizer_executor = _tokenize_inline

