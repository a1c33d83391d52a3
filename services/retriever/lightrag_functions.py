"""The functions the knowledge base hands LightRAG: embedding, the LLM (or none), and its logging."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import warnings
from typing import Any

import numpy as np

from services.retriever.stage_clock import StageClock
from shared.embeddings import Embedder
from shared.llm import LLMClient

log = logging.getLogger(__name__)


QUERY_TEXTS = 8  # at most this many texts at once is a query (LightRAG embeds its three together)
# The token budgets a query hands LightRAG (knowledge.py): out of reach, so nothing is cut.
UNBOUNDED_TOKENS = 10_000_000
# A budget at least this large is one of ours: the chunks' budget is UNBOUNDED_TOKENS less
# what the rendered entities, relations and prompt count, which no query comes near.
UNBOUNDED_FLOOR = UNBOUNDED_TOKENS // 2


def embedding_function(embedder: Embedder, clock: StageClock, prepared: dict[str, np.ndarray]):
    """A plain function (LightRAG deep-copies its config; a bound method would copy the
    whole knowledge base): texts whose vectors an insert prepared (`prepared`, text ->
    vector: knowledge.py embeds all of an insert's texts in one pass before it) are
    looked up; a query's few texts (the question and its two keyword lists, in one call)
    go through the embedder's cache and batching, so a question asked again costs no model
    call; many others (LightRAG's own ingestion, with an LLM) are embedded in length-sorted
    batches off the event loop, without filling the cache, their time counted on `clock`
    as "embed"."""

    async def embed(texts: list[str], **_: Any) -> np.ndarray:
        if texts and all(text in prepared for text in texts):
            return np.stack([prepared[text] for text in texts])
        if len(texts) <= QUERY_TEXTS:
            return await embedder.aembed_all(list(texts))
        loop = asyncio.get_running_loop()
        with clock("embed"):
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
    (word_tokenizer.py): the hand-over to the thread and back costs more than the counting.
    LightRAG's module functions are swapped for an inline call; each module is checked to
    hold the name, so a LightRAG that renamed it fails here at start, not silently (pinned:
    lightrag-hku 1.5.7)."""
    import lightrag.operate
    import lightrag.utils

    for module in (lightrag.utils, lightrag.operate):
        if not hasattr(module, "run_in_tokenizer_executor"):
            raise RuntimeError(f"{module.__name__} has no run_in_tokenizer_executor: check LightRAG's version")
        module.run_in_tokenizer_executor = _tokenize_inline


def untruncated_when_unbounded() -> None:
    """LightRAG fits a query's entities, relations and chunks to token budgets for an LLM
    prompt: it renders every item as JSON, joins them, counts the tokens and keeps the
    items that fit (then renders and counts the chunks again, the way its prompt shows
    them). A query here sets the budgets out of reach (`UNBOUNDED_TOKENS`: the reranker or
    the limiter chooses what is kept, the answer's prompt has its own cap), so every item
    fits, and the rendering and counting, done on every query, decide nothing. With such a
    budget the two functions hand back every item, as they would after counting; with a real
    one (a summary's, at ingestion) they count as before. Checked at start like
    `tokenize_inline` (pinned: lightrag-hku 1.5.7)."""
    _swap("truncate_list_by_token_size", _list_unless_unbounded)
    _swap("_truncate_chunks_for_unified_context", _chunks_unless_unbounded)


def _swap(name: str, replacement_for) -> None:
    """Put `replacement_for(original)` in `lightrag.utils.<name>` (its callers look it up
    there at call time), the original kept as its `__wrapped__`; once per process, however
    many knowledge bases open. A LightRAG without the name fails here, at start."""
    import lightrag.utils

    original = getattr(lightrag.utils, name, None)
    if original is None:
        raise RuntimeError(f"lightrag.utils has no {name}: check LightRAG's version")
    if not hasattr(original, "__wrapped__"):  # not swapped already (another knowledge base)
        setattr(lightrag.utils, name, functools.wraps(original)(replacement_for(original)))


def _list_unless_unbounded(original):
    def truncate(list_data, key, separator, max_token_size, tokenizer):
        if max_token_size >= UNBOUNDED_FLOOR:
            return list(list_data)
        return original(list_data, key, separator, max_token_size, tokenizer)
    return truncate


def _chunks_unless_unbounded(original):
    def truncate(chunks, max_token_size, tokenizer):
        if max_token_size >= UNBOUNDED_FLOOR:
            return list(chunks)
        return original(chunks, max_token_size, tokenizer)
    return truncate


def cosine_once_per_vector() -> None:
    """LightRAG ranks a mix query's candidate chunks by `cosine_similarity(query, chunk)`,
    one call per chunk, each chunk's vector a list (as a vector store hands it back).
    Its `np.dot` and two `np.linalg.norm` calls turn each list into an array twice, and the
    norm's argument checks run for each, for every candidate chunk of every query. `_cosine`
    makes each array once and computes the same products in the same order and types (a
    norm is `sqrt(x.dot(x))`, as numpy's own), so every similarity is bit for bit the one
    LightRAG's gives. Checked at start like `tokenize_inline` (pinned: lightrag-hku 1.5.7)."""
    _swap("cosine_similarity", lambda original: _cosine)


def _cosine(v1, v2) -> float:
    a, b = np.asarray(v1), np.asarray(v2)
    dot_product = np.dot(a, b)
    denom = _norm(a) * _norm(b)
    if denom == 0 or not np.isfinite(denom) or not np.isfinite(dot_product):
        return 0.0
    return float(dot_product / denom)


def _norm(x: np.ndarray):
    """`np.linalg.norm` of a vector as numpy 2.4 computes it, without its argument checks:
    what is not inexact taken as floats, flattened in memory order (a strided vector's
    products are summed in that order)."""
    if not issubclass(x.dtype.type, (np.inexact, np.object_)):
        x = x.astype(float)
    x = x.ravel(order="K")
    return np.sqrt(x.dot(x))


_QUERYING = contextvars.ContextVar("lightrag_querying", default=False)


def unqueued_embedding(rag, func) -> None:
    """Give the instance and its stores `func` itself as their embedding function. LightRAG
    puts it behind a priority queue of its own per instance, whose worker tasks, once a
    query has started them, wake every second for as long as the process lives (LightRAG's
    `finalize_storages` leaves them running): a task set per site ever opened. The
    embedder (shared/embeddings.py) already batches and bounds what it runs, so the queue
    adds nothing but those tasks."""
    from dataclasses import replace

    queued = rag.embedding_func
    direct = replace(queued, func=func)
    rag.embedding_func = direct
    for value in vars(rag).values():
        if getattr(value, "embedding_func", None) is queued:
            value.embedding_func = direct


def share_query_config(rag) -> None:
    """Each `aquery_data` starts with `LightRAG._build_global_config()`: `dataclasses.asdict`
    of the whole instance, a deep copy of every field, for every query. A query
    only reads it (in lightrag-hku 1.5.7 `kg_query` and the functions it calls read
    `global_config` and write none of it), so this instance's copy is made once, by its
    first query, and handed to every query made inside `querying()`; anything else
    (ingestion, which may change its copy) still gets a copy of its own. Nothing changes an
    open instance's configuration (a site's knowledge base reloaded is a new instance)."""
    build = getattr(rag, "_build_global_config", None)
    if build is None:
        raise RuntimeError("LightRAG has no _build_global_config: check LightRAG's version")
    shared: list[dict[str, Any]] = []

    def global_config() -> dict[str, Any]:
        if not _QUERYING.get():
            return build()
        if not shared:
            shared.append(build())
        return shared[0]

    rag._build_global_config = global_config


@contextlib.contextmanager
def querying():
    """Queries made inside get the instance's shared configuration (`share_query_config`)."""
    token = _QUERYING.set(True)
    try:
        yield
    finally:
        _QUERYING.reset(token)


# --- letting a closed instance go without the cyclic garbage collector ---------------------------
# A LightRAG instance is a web of cycles: its rate-limiting wrappers are families of closures
# that reach each other through their cells, its update flags are instances of a class made
# per flag, its stores and bound methods point back at it. Closed after it has been open a
# while, none of that is freed when the last reference goes: it waits, long-lived, for a
# collection of the oldest generation, whose pause grows with every open site (and holds up
# every query of the process). `steady_flags` and `dismantle` take those cycles apart, so a
# closed site is freed on the spot and the open ones can be kept out of the collector's way
# (pool.py freezes them).

WRAPPER = "priority_limit_async_func_call."  # LightRAG's queueing wrappers: their closures' qualnames


class UpdateFlag:
    """One class for every update flag (LightRAG's `get_update_flag` makes a class per flag)."""

    def __init__(self, initial_value: bool = False):
        self.value = initial_value


def steady_flags(rag) -> None:
    """The instance's update flags made `UpdateFlag`s (the same objects, shared with
    LightRAG's tables: only their class changes), so no class dies with each site."""
    for store in _stores(rag):
        for value in list(vars(store).values()):
            if type(value).__qualname__ == "get_update_flag.<locals>.MutableBoolean":
                value.__class__ = UpdateFlag


def _stores(rag) -> list:
    from lightrag.base import StorageNameSpace

    return [value for value in vars(rag).values() if isinstance(value, StorageNameSpace)]


def _cut_closures(start) -> None:
    """Empty the cells of LightRAG's wrapper closures reachable from `start` (and of those
    they reach): the family's cycle broken, each function freed when its last holder goes."""
    seen: set[int] = set()
    pending = [start]
    while pending:
        func = pending.pop()
        if id(func) in seen or not getattr(func, "__qualname__", "").startswith(WRAPPER):
            continue
        seen.add(id(func))
        for cell in func.__closure__ or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(inner):
                pending.append(inner)
            cell.cell_contents = None


def dismantle(rag) -> None:
    """After `finalize_storages`: the instance's cycles taken apart (its wrappers' closures,
    its graph's views, its stores' and its own attributes), so that it is freed by reference
    counting. The instance is unusable afterwards."""
    for owner in [rag, *_stores(rag)]:
        for value in list(vars(owner).values()):
            for func in (value, getattr(value, "func", None)):  # an EmbeddingFunc holds its wrapper
                if callable(func):
                    _cut_closures(func)
    import networkx

    for store in _stores(rag):
        for value in vars(store).values():
            if isinstance(value, networkx.Graph):  # its cached views point back at it
                vars(value).clear()
        vars(store).clear()
    vars(rag).clear()
