"""What the visitor is trying to do, inferred locally from their messages: the keyword rules
of `data/profiler_rules.toml` (no network, no model), and how an inference
joins what enrichment already knows. `Inferred` is also the schema the `profiler` LLM role
answers in (visitor_profiler.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from shared.events import UNKNOWN, VisitorProfile

RULES = Path(__file__).parent / "data" / "profiler_rules.toml"


class Inferred(msgspec.Struct):
    job_to_be_done: str = UNKNOWN
    feature_list: str = UNKNOWN
    sector: str = UNKNOWN
    sub_sector: str = UNKNOWN
    sector_confidence_level: str = UNKNOWN


def load_rules(path: Path = RULES) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _score(text: str, keywords: list[str]) -> int:
    return sum(text.count(k) for k in keywords)


def infer_locally(messages: list[str], rules: dict) -> Inferred:
    text = " ".join(messages).lower()
    jobs = {job: _score(text, kws) for job, kws in rules["jobs"].items()}
    features = [name for name, kws in rules["features"].items() if _score(text, kws)]
    sectors = {name: _score(text, spec["keywords"]) for name, spec in rules["sectors"].items()}
    best_job = max(jobs, key=jobs.get) if jobs and max(jobs.values()) > 0 else UNKNOWN
    result = Inferred(job_to_be_done=best_job, feature_list=", ".join(features) if features else UNKNOWN)
    if sectors and max(sectors.values()) > 0:
        sector = max(sectors, key=sectors.get)
        subs = {n: _score(text, kws) for n, kws in rules["sectors"][sector].get("sub_sectors", {}).items()}
        hits = sectors[sector]
        result.sector = sector
        result.sub_sector = max(subs, key=subs.get) if subs and max(subs.values()) > 0 else UNKNOWN
        result.sector_confidence_level = "high" if hits >= 3 else "medium" if hits == 2 else "low"
    return result


def apply_inference(known: VisitorProfile, inferred: Inferred) -> VisitorProfile:
    """Sector and sub-sector from the conversation only where enrichment said nothing."""
    keep_sector = known.sector not in ("", UNKNOWN)
    return VisitorProfile(
        job_to_be_done=inferred.job_to_be_done,
        feature_list=inferred.feature_list,
        sector=UNKNOWN if keep_sector else inferred.sector,
        sub_sector=UNKNOWN if keep_sector else inferred.sub_sector,
        sector_confidence_level=UNKNOWN if keep_sector else inferred.sector_confidence_level,
    )
