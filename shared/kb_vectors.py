"""The vectors of a site's knowledge-base texts (sentences, section titles) that extractive
answers compare with the question, kept on the bus so a turn does not embed them.

An extractive answer compares its question with every sentence and title of the retrieved
sources; embedding those it has not seen before means dozens of sentences for new
sources, embedded on the turn's path before its first token. They are the knowledge base's
texts, the same for every visitor, so they are prepared once, ahead:

- `concierge ingest` embeds every sentence and title the site's knowledge base can hand an
  answer, and the retriever, when a source's sync changed the site's knowledge base
  (services/retriever/sources/collector.py), those of its chunks (`warm`); both store them
  in the JetStream key-value bucket `kb_vectors`;
- a responder reads what it misses in memory from the bucket, and stores in it, in the
  background, what it had to embed itself (a text the ingest did not foresee, a site
  ingested without a bus), so every replica, and the next process after a restart, finds
  it there.

Keys: `<site>.<sha256 of the embedding version and the text>`: a site's vectors are
found only by the texts it holds, all under `<site>.` (one subject filter purges a site's);
vectors of another model are other keys. Values: the float32 vector's bytes,
as the embedder returns them. Only knowledge-base texts are stored, never a visitor's
words (the question is embedded in the process, as before). The bucket's entries expire
after `KB_VECTORS_TTL_S` (30 days by default): each ingest writes the site's again, and
an expired one is embedded and stored again on first use.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict

import nats.errors
import numpy as np
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from shared import events as ev
from shared import metrics
from shared.kb_sentences import candidates, masked
from shared.embeddings import Embedder

log = logging.getLogger(__name__)

WARM_BATCH = 256  # texts embedded and stored at a time by `warm`


def key(site: str, version: str, text: str) -> str:
    digest = hashlib.sha256(version.encode() + b"\n" + text.encode()).hexdigest()
    return f"{site}.{digest[:48]}"


def texts(documents: list[ev.RetrievedDocument], name: str) -> list[str]:
    """Every knowledge-base text an extractive answer over any of `documents` may embed
    (services/responder/extractive.py `texts_to_embed` without the question): each
    document's title and sentences, the site's name masked, each text once. Per document: an
    answer's pool keeps a sentence several documents hold once, under whichever of them it
    was given, so every document's own are prepared."""
    out: dict[str, None] = {}
    for document in documents:
        pool = candidates([document])
        titles = dict.fromkeys(c.title for c in pool)
        out.update(dict.fromkeys(masked(t, name) or t for t in [*titles, *(c.text for c in pool)]))
    return list(out)


class KnowledgeVectors:
    """`vectors(kv, site, texts)`: the texts' vectors from memory, else the bucket `kv`,
    else the embedder (then stored in the bucket). `kv` None (a rerun, no bus): memory and
    the embedder only."""

    def __init__(self, embedder: Embedder, memory: int = 16384):
        self.embedder = embedder
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = memory
        self._storing: set[asyncio.Task] = set()

    def _remember(self, k: str, vector: np.ndarray) -> None:
        self._memory[k] = vector
        self._memory.move_to_end(k)
        while len(self._memory) > self._size:
            self._memory.popitem(last=False)

    async def vectors(self, kv: KeyValue | None, site: str, texts: list[str]) -> np.ndarray:
        keys = [key(site, self.embedder.version, t) for t in texts]
        have: dict[str, np.ndarray] = {}  # this call's own: what other calls remember meanwhile cannot evict them
        wanted: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k in self._memory:
                self._memory.move_to_end(k)
                have[k] = self._memory[k]
            else:
                wanted[k] = t
        metrics.kb_vectors.labels("memory").inc(len(have))
        if wanted and kv is not None:
            found = await asyncio.gather(*(_get(kv, k, self.embedder.dim) for k in wanted))
            for k, vector in zip(list(wanted), found):
                if vector is not None:
                    have[k] = vector
                    self._remember(k, vector)
                    del wanted[k]
            metrics.kb_vectors.labels("bucket").inc(len(found) - len(wanted))
        if wanted:
            embedded = await self.embedder.aembed_all(list(wanted.values()))
            for k, vector in zip(wanted, embedded):
                have[k] = vector
                self._remember(k, vector)
            metrics.kb_vectors.labels("embedded").inc(len(wanted))
            if kv is not None:  # stored off the turn's path: the answer does not wait for the bucket
                task = asyncio.create_task(_put_all(kv, list(zip(wanted, embedded))), name="kb-vectors-store")
                self._storing.add(task)
                task.add_done_callback(self._storing.discard)
        return np.stack([have[k] for k in keys]) if keys else np.zeros((0, self.embedder.dim), np.float32)

    async def flush(self) -> None:
        """Until what was handed to the bucket in the background is stored."""
        await asyncio.gather(*self._storing, return_exceptions=True)


async def _get(kv: KeyValue, k: str, dim: int) -> np.ndarray | None:
    """The stored vector, or None: not stored, or the bucket not answering (then the
    answer embeds it: a cache that fails costs time, never the answer)."""
    try:
        entry = await kv.get(k)
    except KeyNotFoundError:
        return None
    except (nats.errors.Error, asyncio.TimeoutError) as exc:
        log.warning("knowledge vector not read", extra={"error": repr(exc)})
        return None
    if not entry.value or len(entry.value) != dim * 4:
        return None  # deleted, or another model's size: embedded again
    return np.frombuffer(entry.value, dtype=np.float32)


async def _put_all(kv: KeyValue, items: list[tuple[str, np.ndarray]]) -> None:
    """Store the vectors; a failure costs only a later embedding, so it is logged, not raised."""
    try:
        await asyncio.gather(*(kv.put(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items))
    except Exception as exc:  # noqa: BLE001 - a cache write, nothing depends on it
        log.warning("knowledge vectors not stored", extra={"error": repr(exc)})


async def warm(kv: KeyValue, embedder: Embedder, site: str, texts: list[str], refresh: bool = True) -> dict[str, int]:
    """Store the texts' vectors: those the bucket lacks embedded; with `refresh`, those it
    holds written again (their time to live starts over, so a site ingested now and then
    never finds them expired). `WARM_BATCH` texts at a time. {"texts", "stored": newly
    embedded}."""
    distinct = list(dict.fromkeys(texts))
    loop = asyncio.get_running_loop()
    stored = 0
    for start in range(0, len(distinct), WARM_BATCH):
        batch = distinct[start:start + WARM_BATCH]
        keys = [key(site, embedder.version, t) for t in batch]
        present = await asyncio.gather(*(_get(kv, k, embedder.dim) for k in keys))
        missing = [i for i, vector in enumerate(present) if vector is None]
        if missing:
            made = await loop.run_in_executor(None, embedder.embed_many, [batch[i] for i in missing])
            for i, vector in zip(missing, made):
                present[i] = vector
            stored += len(missing)
        written = range(len(batch)) if refresh else missing
        await asyncio.gather(*(kv.put(keys[i], np.asarray(present[i], np.float32).tobytes()) for i in written))
    return {"texts": len(distinct), "stored": stored}
