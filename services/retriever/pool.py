"""The sites a retriever keeps open: a bounded pool of LightRAG instances (knowledge.py).

A site's knowledge base is opened on its first query (its graph, key-value tables and,
in Qdrant's local mode, its vectors read into memory) and kept for the next ones; a
retriever serving thousands of sites cannot keep them all. The pool holds open sites
within a memory budget (KB_MEMORY_BUDGET_MB, what the retriever process may take, less
what it took before any site was open) and, when set, a count (KB_OPEN_SITES); past
either, the least recently used sites that are idle are closed. A site in use (a query
reading it, an ingest or a snapshot swap holding its lock) is never closed; one being
opened or closed is waited for, so several requests racing for a site open it once.

What an open site takes is estimated from its files when it is opened (`estimate`): the
constants below were measured with tracemalloc (tests/test_kb_pool.py measures it again for
two sizes of site and checks the estimate against it).

Open sites are most of the process's objects, and Python's cyclic garbage collector, each
time it collects its oldest generation, goes through every one of them while every query
of the process waits (hundreds of milliseconds with a few hundred sites open: the slowest
first answers of a retriever whose sites come and go). So a site just opened is moved out
of the collector's generations (`keep_out_of_collector`: the young garbage of its opening
collected, then everything alive frozen, `gc.freeze`), and a site closed is taken apart
(lightrag_functions.dismantle) so that reference counting frees it, frozen or not. What
would escape both (cyclic garbage frozen while it was young, a few objects an open) is
collected by a full collection every `FULL_COLLECTION_OPENS` opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from shared import metrics

log = logging.getLogger(__name__)

# An open site's cost (bytes), fitted to tracemalloc's count of what opening a site and its
# first query left allocated, for sites of 4, 40, 400 and 1,000 chunks in Qdrant's local mode
# (within 5 % of each): its LightRAG instance and storages' fixed part; so much per byte of
# its files (JSON tables, the GraphML graph, documents.json, read into Python objects); and
# per dimension of each vector it indexes in this process (two float32 rows and its
# payload's objects).
SITE_FIXED_BYTES = 150 * 1024
# The open sites' share of the budget the process does not take without them: the rest is
# room for the estimate's error, the allocator's fragmentation and a turn's own memory.
POOL_SHARE = 0.8
MIN_POOL_BYTES = 64 << 20
# The share rests on an estimate; the process's own resident memory is the truth the budget
# is about. Past this part of the budget, the open sites' share is lowered by the excess (for
# good: what the estimate misses here, the allocator's fragmentation after thousands of opens
# and closes, does not go away), and the least recently used sites close to fit it.
HIGH_WATER = 0.98
BYTES_PER_FILE_BYTE = 3.0
BYTES_PER_VECTOR_DIM = 9.6


FULL_COLLECTION_OPENS = 10_000


def keep_out_of_collector(opens: int) -> None:
    """After a site opened: the young cyclic garbage collected (its opening's: LightRAG's
    discarded wrappers and flag classes), then everything alive frozen; every
    FULL_COLLECTION_OPENS opens, a full collection first (what was frozen and died in a
    cycle since)."""
    if opens % FULL_COLLECTION_OPENS == 0:
        gc.unfreeze()
        found = gc.collect()
        log.info("full garbage collection", extra={"opens": opens, "collected": found})
    else:
        gc.collect(1)
    gc.freeze()


def resident_bytes() -> int:
    """This process's resident memory (Linux; 0 where /proc is not there)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _malloc_trim() -> None:
    """Give the C heap's free pages back to the system (glibc; nothing elsewhere): what a
    closed site freed is then no longer counted in the process's resident memory, which
    the budget is about, rather than held for the allocator's reuse."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc = None


def estimate(directory: Path, vectors: int, dim: int) -> int:
    """What opening the site in `directory` takes in memory, by the measured constants:
    `vectors` is how many of its vectors this process indexes (0 with a Qdrant server)."""
    files = 0
    with contextlib.suppress(OSError):
        files = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    return int(SITE_FIXED_BYTES + BYTES_PER_FILE_BYTE * files + BYTES_PER_VECTOR_DIM * vectors * dim)


@dataclass
class Opened:
    """A site's open LightRAG, the directory it reads, what it is estimated to take, and
    the queries using it."""
    rag: Any
    directory: Path
    mtime: float
    cost: int = 0
    users: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self):
        self.idle.set()

    @contextlib.contextmanager
    def use(self):
        self.users += 1
        self.idle.clear()
        try:
            yield self.rag
        finally:
            self.users -= 1
            if self.users == 0:
                self.idle.set()


class Pool:
    """Open sites, least recently used first. `close(site, opened)` closes one the pool
    lets go; `busy(site)` says whether its writers hold it (kept open whatever its age)."""

    def __init__(self, close: Callable[[str, Opened], Awaitable[None]], busy: Callable[[str], bool],
                 budget_bytes: int, max_sites: int = 0):
        """`budget_bytes`: what the whole process may take; the sites get a share of what it
        does not take when the first one opens (`limit_bytes`)."""
        self._close = close
        self._busy = busy
        self.budget_bytes = budget_bytes
        self.limit_bytes: int | None = None
        self.max_sites = max_sites
        self._open: OrderedDict[str, Opened] = OrderedDict()
        self._moving: dict[str, asyncio.Future] = {}  # sites being opened or closed
        self.opens = 0
        self.evictions = 0

    def __contains__(self, site: str) -> bool:
        return site in self._open

    def __len__(self) -> int:
        return len(self._open)

    def sites(self) -> list[str]:
        return list(self._open)

    def peek(self, site: str) -> Opened | None:
        return self._open.get(site)

    @property
    def used_bytes(self) -> int:
        return sum(o.cost for o in self._open.values())

    async def get(self, site: str, opener: Callable[[], Awaitable[Opened]]) -> Opened:
        """The site open, opened by `opener` when it is not (once, however many ask at the
        same time); sites past the budget closed after."""
        while True:
            opened = self._open.get(site)
            if opened is not None:
                self._open.move_to_end(site)
                return opened
            moving = self._moving.get(site)
            if moving is None:
                break
            with contextlib.suppress(Exception):  # an open that failed: this request tries on its own
                await asyncio.shield(moving)
        if self.limit_bytes is None:
            self.limit_bytes = self.share(resident_bytes())
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._moving[site] = done
        try:
            opened = await opener()
            self.opens += 1
            metrics.kb_opens.inc()
            self._open[site] = opened
            keep_out_of_collector(self.opens)
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: waiters try again
            raise
        finally:
            if self._moving.get(site) is done:
                del self._moving[site]
            if not done.done():
                done.set_result(None)
        await self.trim(keep=site)
        return opened

    async def settled(self, site: str) -> None:
        """Wait until the site is neither being opened nor closed."""
        while (moving := self._moving.get(site)) is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(moving)

    def put(self, site: str, opened: Opened) -> Opened | None:
        """Serve `site` with `opened` from now on (a snapshot swapped in): the one it
        replaces, for the caller to close, or None."""
        old = self._open.pop(site, None)
        self._open[site] = opened
        return old

    def pop(self, site: str) -> Opened | None:
        return self._open.pop(site, None)

    def share(self, resident: int) -> int:
        """What the open sites may take: POOL_SHARE of the budget the process does not take
        already (`resident`: its models, libraries and buffers, read when the first site
        opens, once the process has started), at least MIN_POOL_BYTES."""
        return max(int(POOL_SHARE * (self.budget_bytes - resident)), MIN_POOL_BYTES)

    def _over(self) -> bool:
        limit = self.limit_bytes if self.limit_bytes is not None else self.share(resident_bytes())
        return (self.used_bytes > limit and len(self._open) > 1) or (
            0 < self.max_sites < len(self._open))

    def lower_to_fit(self, resident: int) -> None:
        """When `resident` (the process's memory now) is past HIGH_WATER of the budget, the
        open sites' share lowered by the excess (at least MIN_POOL_BYTES)."""
        excess = resident - int(HIGH_WATER * self.budget_bytes)
        if excess <= 0 or self.limit_bytes is None or self.limit_bytes <= MIN_POOL_BYTES:
            return
        lowered = max(min(self.limit_bytes, self.used_bytes) - excess, MIN_POOL_BYTES)
        log.warning("resident memory past the budget's high-water mark: the open sites' share lowered",
                    extra={"resident_mb": resident >> 20, "budget_mb": self.budget_bytes >> 20,
                           "limit_mb_before": self.limit_bytes >> 20, "limit_mb": lowered >> 20})
        self.limit_bytes = lowered

    async def trim(self, keep: str = "") -> None:
        """Close the least recently used idle sites until the pool is within its budget
        (`keep`, just asked for, stays): the estimated share, lowered first when the
        process's resident memory is past the high-water mark."""
        evicted = False
        self.lower_to_fit(resident_bytes())
        while self._over():
            victim = next((s for s in self._open if s != keep and self._idle(s)), None)
            if victim is None:
                log.warning("knowledge bases over their memory budget: every open site is in use",
                            extra={"open_sites": len(self._open), "used_mb": self.used_bytes >> 20,
                                   "limit_mb": (self.limit_bytes or 0) >> 20})
                break
            await self._evict(victim)
            evicted = True
        self._closed(evicted)

    async def close_where(self, drop: Callable[[str], bool]) -> int:
        """Close the idle open sites `drop` names (ones this replica no longer serves); those
        in use stay until the budget closes them. How many were closed."""
        closed = 0
        for site in [site for site in self._open if drop(site)]:
            if self._idle(site):  # asked now: closing the ones before it took time
                await self._evict(site)
                closed += 1
        self._closed(closed > 0)
        return closed

    def _idle(self, site: str) -> bool:
        opened = self._open.get(site)
        return opened is not None and opened.users == 0 and site not in self._moving and not self._busy(site)

    async def _evict(self, site: str) -> None:
        opened = self._open.pop(site)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._moving[site] = done
        try:
            await self._close(site, opened)
        finally:
            del self._moving[site]
            done.set_result(None)
        self.evictions += 1
        metrics.kb_evictions.inc()

    def _closed(self, any_closed: bool) -> None:
        if any_closed:
            _malloc_trim()
        metrics.kb_open_sites.set(len(self._open))
        metrics.kb_open_bytes.set(self.used_bytes)

    async def close_all(self) -> None:
        while self._open:
            site, opened = self._open.popitem(last=False)
            await self._close(site, opened)
