"""The vectors of a site's knowledge-base texts (sentences, section titles) that extractive
answers compare with the question, kept on the bus so a turn does not embed them.

An extractive answer embeds its question, and every sentence and title of the retrieved
sources it has not embedded before: 50 to 100 sentences for sources seen the first time,
a few hundred milliseconds of CPU on the turn's path (the slowest answers of `concierge
bench --answer-backend extractive`). Those texts are the knowledge base's, the same for
every visitor, so they are prepared once, ahead:

- `concierge ingest` embeds every sentence and title the site's knowledge base can hand an
  answer (`warm`) and stores them in the JetStream key-value bucket `kb_vectors`;
- a responder reads what it misses in memory from the bucket, and stores in it what it
  had to embed itself (a text the ingest did not foresee, a site ingested without a bus),
  so every replica, and the next process after a restart, finds it there.

Keys: `<site>.<sha256 of the embedding version and the text>`: a site's vectors are
found only by the texts it holds, all under `<site>.` (one subject filter purges a site's);
vectors of another model are other keys. Values: the float32 vector's bytes,
as the embedder returns them. Only knowledge-base texts are stored, never a visitor's
words (the question is embedded in the process, as before). The bucket's entries expire
after `KB_VECTORS_TTL_S` (30 days by default; an expired one is embedded and stored
again on first use).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from typing import Iterable

import nats.errors
import numpy as np
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.responder import extractive
from shared import events as ev
from shared.embeddings import Embedder
from shared import metrics

log = logging.getLogger(__name__)

WARM_BATCH = 256  # texts embedded and stored at a time by `warm`


def key(site: str, version: str, text: str) -> str:
    digest = hashlib.sha256(version.encode() + b"\n" + text.encode()).hexdigest()
    return f"{site}.{digest[:48]}"


def texts(documents: list[ev.RetrievedDocument], name: str) -> list[str]:
    """Every knowledge-base text an extractive answer over any of `documents` may embed
    (extractive.py `texts_to_embed` without the question): each document's title and
    sentences, the site's name masked, each text once. Per document: an answer's pool
    keeps a sentence several documents hold once, under whichever of them it was given,
    so every document's own are prepared."""
    asked = extractive.Question(text="", name=name)
    out: dict[str, None] = {}
    for document in documents:
        embedded, _, _ = extractive.texts_to_embed(asked, extractive.candidates([document]))
        out.update(dict.fromkeys(embedded[1:]))
    return list(out)


class KnowledgeVectors:
    """`vectors(kv, site, texts)`: the texts' vectors from memory, else the bucket `kv`,
    else the embedder (then stored in the bucket). `kv` None (a rerun, no bus): memory and
    the embedder only."""

    def __init__(self, embedder: Embedder, memory: int = 16384):
        self.embedder = embedder
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._size = memory

    def _remember(self, k: str, vector: np.ndarray) -> None:
        self._memory[k] = vector
        self._memory.move_to_end(k)
        while len(self._memory) > self._size:
            self._memory.popitem(last=False)

    async def vectors(self, kv: KeyValue | None, site: str, texts: list[str]) -> np.ndarray:
        keys = [key(site, self.embedder.version, t) for t in texts]
        wanted = {k: t for k, t in zip(keys, texts) if k not in self._memory}
        metrics.kb_vectors.labels("memory").inc(len(set(keys)) - len(wanted))
        if wanted and kv is not None:
            found = await asyncio.gather(*(_get(kv, k, self.embedder.dim) for k in wanted))
            for k, vector in zip(list(wanted), found):
                if vector is not None:
                    self._remember(k, vector)
                    del wanted[k]
            metrics.kb_vectors.labels("bucket").inc(len(found) - len(wanted))
        if wanted:
            embedded = await self.embedder.aembed_all(list(wanted.values()))
            for k, vector in zip(wanted, embedded):
                self._remember(k, vector)
            metrics.kb_vectors.labels("embedded").inc(len(wanted))
            if kv is not None:
                await _put_all(kv, zip(wanted, embedded))
        return np.stack([self._memory[k] for k in keys]) if keys else np.zeros((0, self.embedder.dim), np.float32)


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


async def _put_all(kv: KeyValue, items: Iterable[tuple[str, np.ndarray]]) -> None:
    """Store the vectors; a failure costs only a later embedding, so it is logged, not raised."""
    try:
        await asyncio.gather(*(kv.put(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items))
    except Exception as exc:  # noqa: BLE001 - a cache write, nothing depends on it
        log.warning("knowledge vectors not stored", extra={"error": repr(exc)})


async def warm(kv: KeyValue, embedder: Embedder, site: str, texts: list[str]) -> dict[str, int]:
    """Embed and store the texts the bucket does not hold yet; {"texts", "stored"}."""
    distinct = list(dict.fromkeys(texts))
    present = await asyncio.gather(*(_get(kv, key(site, embedder.version, t), embedder.dim) for t in distinct))
    missing = [t for t, vector in zip(distinct, present) if vector is None]
    loop = asyncio.get_running_loop()
    for start in range(0, len(missing), WARM_BATCH):
        batch = missing[start:start + WARM_BATCH]
        vectors = await loop.run_in_executor(None, embedder.embed_many, batch)
        await asyncio.gather(*(kv.put(key(site, embedder.version, t), np.asarray(v, np.float32).tobytes())
                               for t, v in zip(batch, vectors)))
    return {"texts": len(distinct), "stored": len(missing)}
