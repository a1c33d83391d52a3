"""Rerankers: Cohere (the `cohere` package) or Jina (its HTTP API) score every retrieved
document, of all three types together, against the query; the best `top_n` are kept.

A reranker that fails or times out raises `RerankError`; the retrieval node then falls
back to the type-based limiter and records why.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import httpx

from services.retriever.settings import RerankerSettings

JINA_URL = "https://api.jina.ai/v1/rerank"  # JINA_RERANK_URL's default


class RerankError(Exception):
    pass


class Reranker(Protocol):
    provider: str

    async def rerank(self, query: str, documents: list[str], top_n: int, model: str) -> list[tuple[int, float]]:
        """(index into `documents`, relevance score), best first, at most `top_n`."""


class CohereReranker:
    provider = "cohere"

    def __init__(self, api_key: str, base_url: str | None = None, timeout_s: float = 3.0):
        import cohere

        self._client = cohere.AsyncClientV2(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
        self._timeout_s = timeout_s

    async def rerank(self, query, documents, top_n, model):
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.rerank(model=model, query=query, documents=documents, top_n=top_n)
        except TimeoutError:
            raise RerankError(f"cohere: no answer within {self._timeout_s}s") from None
        except Exception as exc:  # noqa: BLE001 - any provider failure means: use the limiter
            raise RerankError(f"cohere: {type(exc).__name__}: {exc}"[:300]) from exc
        return [(r.index, float(r.relevance_score)) for r in response.results]


class JinaReranker:
    provider = "jina"

    def __init__(self, api_key: str, url: str = "https://api.jina.ai/v1/rerank", timeout_s: float = 3.0,
                 client: httpx.AsyncClient | None = None):
        self._url = url
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._timeout_s = timeout_s

    async def rerank(self, query, documents, top_n, model):
        body = {"model": model, "query": query, "documents": documents, "top_n": top_n}
        try:
            response = await self._client.post(self._url, json=body, headers=self._headers, timeout=self._timeout_s)
            response.raise_for_status()
            results = response.json()["results"]
            ranked = [(int(r["index"]), float(r["relevance_score"])) for r in results]
        except httpx.TimeoutException:
            raise RerankError(f"jina: no answer within {self._timeout_s}s") from None
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise RerankError(f"jina: {type(exc).__name__}: {exc}"[:300]) from exc
        if any(not 0 <= i < len(documents) for i, _ in ranked):
            raise RerankError("jina: an index outside the documents sent")
        return sorted(ranked, key=lambda r: -r[1])[:top_n]


def configured(settings: RerankerSettings, timeout_s: float) -> dict[str, Reranker]:
    """The rerankers this deployment can use (a provider needs its key, or a URL for Jina)."""
    rerankers: dict[str, Reranker] = {}
    if settings.cohere_api_key:
        rerankers["cohere"] = CohereReranker(settings.cohere_api_key, settings.cohere_base_url or None, timeout_s)
    if settings.jina_api_key or settings.jina_url:
        rerankers["jina"] = JinaReranker(settings.jina_api_key, settings.jina_url or JINA_URL, timeout_s)
    return rerankers
