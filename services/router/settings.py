"""The router's settings, read once at start (main.py) and handed to its parts."""

from __future__ import annotations

import msgspec

from services.router.routing import STRIKE_CONFIDENCE
from shared.config import LLMRoleConfig, Settings, env_choice, env_float, env_str
from shared.embeddings import EmbeddingSettings

CLASSIFIERS = ("local", "llm", "cascade")
BACKENDS = ("local", "llm")


class RouterSettings(Settings):
    sites_dir: str = "sites"  # the site config files the router keeps the `site_config` bucket on
    sites_poll_s: float = 1.0
    classifier: str = "local"  # the intent backend: local, llm or cascade (a site may override it)
    cascade_threshold: float = 0.5  # cascade: local confidence below which the LLM is asked
    strike_confidence: float = STRIKE_CONFIDENCE  # a HACK strikes at or above it
    fast_path_confidence: float = 0.6  # the n-gram-only stage decides alone at or above it (1.01: never)
    signals_backend: str = "local"
    skills_backend: str = "local"
    llm: dict[str, LLMRoleConfig] = {}  # the `classifier` role
    embeddings: EmbeddingSettings = msgspec.field(default_factory=EmbeddingSettings)

    @classmethod
    def from_env(cls) -> "RouterSettings":
        d = cls()
        return cls(
            sites_dir=env_str("SITES_DIR", d.sites_dir),
            sites_poll_s=env_float("SITES_POLL_S", d.sites_poll_s),
            classifier=env_choice("ROUTER_CLASSIFIER", d.classifier, CLASSIFIERS, "must be local, llm or cascade"),
            cascade_threshold=env_float("ROUTER_CASCADE_THRESHOLD", d.cascade_threshold),
            strike_confidence=env_float("ROUTER_HACK_STRIKE_CONFIDENCE", d.strike_confidence),
            fast_path_confidence=env_float("ROUTER_FAST_PATH_CONFIDENCE", d.fast_path_confidence),
            signals_backend=env_choice("ROUTER_SIGNALS_BACKEND", d.signals_backend, BACKENDS, "must be local or llm"),
            skills_backend=env_choice("ROUTER_SKILLS_BACKEND", d.skills_backend, BACKENDS, "must be local or llm"),
            llm={"classifier": LLMRoleConfig.from_env("classifier")},
            embeddings=EmbeddingSettings.from_env(),
        )
