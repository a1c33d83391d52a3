"""The retriever's settings, read once at start (main.py; `concierge ingest` reads the knowledge
base's and the snapshots' part): the search's deployment defaults from RETRIEVAL_* variables,
overridden per site by the `[retrieval]` table of its config file (shared/site_config.py),
and what the search runs on (the knowledge base, its snapshots, the rerankers, the keywords)."""

from __future__ import annotations

import msgspec

from shared.config import (LLMRoleConfig, Settings, env_bool, env_choice, env_float, env_int, env_str,
                           invalid)
from shared.embeddings import EmbeddingSettings
from shared.web import Outbound
from shared.site_config import RERANK_PROVIDERS, RETRIEVAL_MODES, SiteConfig


class RetrievalSettings(Settings):
    mode: str = "mix"
    rerank_enabled: bool = False
    limiter_enabled: bool = True
    rerank_top_k: int = 20  # the number of documents kept, by the reranker or the limiter
    rerank_provider: str = "cohere"
    rerank_model: str = "rerank-v3.5"
    relationships_enabled: bool = True
    # Entities / relationships LightRAG retrieves from the graph: 20 finds what 60 did on the
    # retrieval eval, in less time per query (docs/benchmarks-history.md).
    graph_top_k: int = 20
    chunk_top_k: int = 20  # text chunks LightRAG retrieves by vector search
    rerank_timeout_s: float = 3.0
    # The pages whose best chunk comes first are read whole (their other chunks appended to
    # it, up to page_rest_chars): a page found by one section often answers in another.
    page_rest_pages: int = 2
    page_rest_chars: int = 6000

    @classmethod
    def from_env(cls) -> "RetrievalSettings":
        settings = cls(
            mode=env_str("RETRIEVAL_MODE", "mix"),
            rerank_enabled=env_bool("RETRIEVAL_RERANK_ENABLED", False),
            limiter_enabled=env_bool("RETRIEVAL_LIMITER_ENABLED", True),
            rerank_top_k=env_int("RETRIEVAL_RERANK_TOP_K", 20),
            rerank_provider=env_str("RETRIEVAL_RERANK_PROVIDER", "cohere"),
            rerank_model=env_str("RETRIEVAL_RERANK_MODEL", "rerank-v3.5"),
            relationships_enabled=env_bool("RETRIEVAL_RELATIONSHIPS_ENABLED", True),
            graph_top_k=env_int("RETRIEVAL_GRAPH_TOP_K", 20),
            chunk_top_k=env_int("RETRIEVAL_CHUNK_TOP_K", 20),
            rerank_timeout_s=env_float("RETRIEVAL_RERANK_TIMEOUT_S", 3.0),
            page_rest_pages=env_int("RETRIEVAL_PAGE_REST_PAGES", 2),
            page_rest_chars=env_int("RETRIEVAL_PAGE_REST_CHARS", 6000),
        )
        if settings.mode not in RETRIEVAL_MODES:
            invalid(f"RETRIEVAL_MODE={settings.mode!r}: use one of {', '.join(RETRIEVAL_MODES)}", None)
        if settings.rerank_provider not in RERANK_PROVIDERS:
            invalid(f"RETRIEVAL_RERANK_PROVIDER={settings.rerank_provider!r}: use cohere or jina", None)
        return settings

    def for_site(self, config: SiteConfig) -> "RetrievalSettings":
        overrides = {k: v for k, v in msgspec.structs.asdict(config.retrieval).items() if v is not None}
        return msgspec.structs.replace(self, **overrides) if overrides else self



class KnowledgeBaseSettings(Settings):
    """Where the sites' knowledge bases live (knowledge.py), for the retriever and ingestion."""

    SECRETS = ("qdrant_api_key",)

    kb_dir: str = ".data/kb"
    qdrant_url: str = ""  # a Qdrant server; empty: qdrant-client's local mode under kb_dir/qdrant
    qdrant_api_key: str = ""
    extraction: str = "offline"  # `llm`: ingestion through LightRAG's pipeline and the `extraction` role
    cosine_threshold: float = 0.2  # vector matches below this similarity are dropped
    # What the retriever process may take in memory; the sites it holds open get what it
    # does not take when it starts, least recently used closed first (pool.py).
    memory_budget_mb: int = 1024
    open_sites: int = 0  # also at most this many sites open; 0: the memory budget alone
    llm: dict[str, LLMRoleConfig] = {}  # the `extraction` role, read when extraction is `llm`

    @classmethod
    def from_env(cls) -> "KnowledgeBaseSettings":
        d = cls()
        extraction = env_choice("RETRIEVAL_EXTRACTION", d.extraction, ("offline", "llm"))
        settings = cls(
            kb_dir=env_str("KB_DIR", d.kb_dir),
            qdrant_url=env_str("QDRANT_URL", d.qdrant_url),
            qdrant_api_key=env_str("QDRANT_API_KEY", d.qdrant_api_key),
            extraction=extraction,
            cosine_threshold=env_float("RETRIEVAL_COSINE_THRESHOLD", d.cosine_threshold),
            memory_budget_mb=env_int("KB_MEMORY_BUDGET_MB", d.memory_budget_mb),
            open_sites=env_int("KB_OPEN_SITES", d.open_sites),
            llm={"extraction": LLMRoleConfig.from_env("extraction")} if extraction == "llm" else {},
        )
        if settings.memory_budget_mb < 256:
            settings = invalid(f"KB_MEMORY_BUDGET_MB={settings.memory_budget_mb}: at least 256 (the retriever's "
                               "models and libraries take about 400 MiB before any site is open)", d)
        if settings.open_sites < 0:
            settings = invalid(f"KB_OPEN_SITES={settings.open_sites}: 0 (the memory budget alone) or more", d)
        return settings


class SnapshotSettings(Settings):
    """The knowledge bases on the bus (snapshots.py): KB_SNAPSHOTS, KB_SNAPSHOT_*."""

    enabled: bool = False
    history: int = 3  # archives kept per site
    poll_s: float = 5.0  # how often a retriever looks for a new version

    @classmethod
    def from_env(cls, server: bool) -> "SnapshotSettings":
        """KB_SNAPSHOTS: `bus` or `off`; unset, `bus` with a Qdrant `server` (QDRANT_URL: the
        vectors are shared there) and `off` in the embedded default (Qdrant's local files sit
        in KB_DIR beside the graph, one process owns them all, nothing to hand over)."""
        d = cls()
        value = env_str("KB_SNAPSHOTS", "").strip().lower()
        if value and value not in ("bus", "off"):
            value = invalid(f"KB_SNAPSHOTS={value!r}: use bus or off", "")
        if value == "bus" and not server:
            value = invalid("KB_SNAPSHOTS=bus needs QDRANT_URL: a snapshot carries the graph, not the vectors, "
                            "which only a Qdrant server shares between processes", "")
        if not (value == "bus" if value else server):
            return cls(enabled=False)  # KB_SNAPSHOT_* not read: nothing uses them
        return cls(enabled=True, history=max(1, env_int("KB_SNAPSHOT_HISTORY", d.history)),
                   poll_s=env_float("KB_SNAPSHOT_POLL_S", d.poll_s))


class RerankerSettings(Settings):
    """The rerank providers' credentials (rerank.py): a provider is usable with its key (Jina:
    or a URL of its own)."""

    SECRETS = ("cohere_api_key", "jina_api_key")

    cohere_api_key: str = ""
    cohere_base_url: str = ""
    jina_api_key: str = ""
    jina_url: str = ""

    @classmethod
    def from_env(cls) -> "RerankerSettings":
        return cls(cohere_api_key=env_str("COHERE_API_KEY", ""), cohere_base_url=env_str("COHERE_BASE_URL", ""),
                   jina_api_key=env_str("JINA_API_KEY", ""), jina_url=env_str("JINA_RERANK_URL", ""))


MIN_CONVERT_MEMORY_MB = 768


class ConvertLimits(Settings):
    """CONVERT_*: what one conversion of a page or file to text may take
    (services/retriever/sources/converter.py)."""

    workers: int = 1
    timeout_s: float = 60.0
    memory_mb: int = 1536  # the worker's address space: its imports take about 450 MB of it
    max_html_bytes: int = 5 * 1024 * 1024
    max_unzipped_bytes: int = 100 * 1024 * 1024

    @classmethod
    def from_env(cls) -> "ConvertLimits":
        d = cls()
        limits = cls(workers=max(1, env_int("CONVERT_WORKERS", d.workers)),
                     timeout_s=env_float("CONVERT_TIMEOUT_S", d.timeout_s),
                     memory_mb=env_int("CONVERT_MEMORY_MB", d.memory_mb),
                     max_html_bytes=env_int("CONVERT_MAX_HTML_BYTES", d.max_html_bytes),
                     max_unzipped_bytes=env_int("CONVERT_MAX_UNZIPPED_BYTES", d.max_unzipped_bytes))
        # No setting turns a limit off: each is what keeps one tenant's file from the others.
        if limits.timeout_s <= 0:
            return invalid(f"CONVERT_TIMEOUT_S={limits.timeout_s:g}: a conversion's time limit, above 0", d)
        if limits.memory_mb < MIN_CONVERT_MEMORY_MB:
            return invalid(f"CONVERT_MEMORY_MB={limits.memory_mb}: at least {MIN_CONVERT_MEMORY_MB} (the converters' "
                           "imports alone take about 450)", d)
        if min(limits.max_html_bytes, limits.max_unzipped_bytes) <= 0:
            return invalid("CONVERT_MAX_HTML_BYTES and CONVERT_MAX_UNZIPPED_BYTES: above 0", d)
        return limits


class CrawlSettings(Settings):
    """How the knowledge sources' runs fetch (services/retriever/sources): CRAWL_*, SYNC_*."""

    outbound: Outbound = msgspec.field(default_factory=Outbound)  # which non-public addresses (shared/web.py)
    user_agent: str = "ConciergeBot/1.0 (+https://github.com/concierge; knowledge sync)"
    timeout_s: float = 15.0
    max_page_bytes: int = 5 * 1024 * 1024
    # Pages fetched at once across the deployment (the page fetcher's durable's max ack
    # pending, however many replicas): polite to the sites, whatever the scale.
    concurrency: int = 8
    schedule_poll_s: float = 60.0  # how often the schedules are looked at (0: no scheduler here)

    @classmethod
    def from_env(cls) -> "CrawlSettings":
        d = cls()
        return cls(outbound=Outbound.from_env(),
                   user_agent=env_str("CRAWL_USER_AGENT", d.user_agent),
                   timeout_s=env_float("CRAWL_TIMEOUT_S", d.timeout_s),
                   max_page_bytes=env_int("CRAWL_MAX_PAGE_BYTES", d.max_page_bytes),
                   concurrency=max(1, env_int("CRAWL_CONCURRENCY", d.concurrency)),
                   schedule_poll_s=env_float("SYNC_SCHEDULE_POLL_S", d.schedule_poll_s))


class RetrieverSettings(Settings):
    retrieval: RetrievalSettings = msgspec.field(default_factory=RetrievalSettings)
    knowledge_base: KnowledgeBaseSettings = msgspec.field(default_factory=KnowledgeBaseSettings)
    snapshots: SnapshotSettings = msgspec.field(default_factory=SnapshotSettings)
    rerankers: RerankerSettings = msgspec.field(default_factory=RerankerSettings)
    keywords: str = "offline"  # `llm`: the `classifier` role extracts the query keywords
    llm: dict[str, LLMRoleConfig] = {}  # the `classifier` role, read when keywords is `llm`
    embeddings: EmbeddingSettings = msgspec.field(default_factory=EmbeddingSettings)
    crawl: CrawlSettings = msgspec.field(default_factory=CrawlSettings)
    convert: ConvertLimits = msgspec.field(default_factory=ConvertLimits)
    # > 0: the retrieval node's questions split by site into this many partitions, each
    # replica answering (and holding open) only its partitions' sites (shared/partitions.py);
    # 0: every replica answers any site.
    partitions: int = 0

    @classmethod
    def from_env(cls) -> "RetrieverSettings":
        knowledge_base = KnowledgeBaseSettings.from_env()
        keywords = env_choice("RETRIEVAL_KEYWORDS", "offline", ("offline", "llm"))
        partitions = env_int("RETRIEVER_PARTITIONS", 0)
        if not 0 <= partitions <= 1024:
            partitions = invalid(f"RETRIEVER_PARTITIONS={partitions}: 0 (not partitioned) to 1024", 0)
        return cls(
            partitions=partitions,
            retrieval=RetrievalSettings.from_env(),
            knowledge_base=knowledge_base,
            snapshots=SnapshotSettings.from_env(server=bool(knowledge_base.qdrant_url)),
            rerankers=RerankerSettings.from_env(),
            keywords=keywords,
            llm={"classifier": LLMRoleConfig.from_env("classifier")} if keywords == "llm" else {},
            embeddings=EmbeddingSettings.from_env(),
            crawl=CrawlSettings.from_env(),
            convert=ConvertLimits.from_env(),
        )
