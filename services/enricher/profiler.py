"""visitor_profiler: what the visitor is trying to do, from the conversation so far.

Runs after this turn's enrichment. Infers `job_to_be_done` and `feature_list`, and
`sector` / `sub_sector` only when enrichment left them unknown. The local method
matches the keyword rules in `data/profiler_rules.toml` (no network, well under a
millisecond); `PROFILER_BACKEND=llm` asks the `profiler` LLM role for structured JSON
instead, with one repair retry, and falls back to the local method if that fails.

The LLM gets the site's guardrails (the meta-template) and the conversation within the
role's budget, HACK turns' text withheld. This node runs beside the router, so it first
waits (up to `PROFILER_ROUTE_WAIT_S`) for this turn's route: a turn not routed by then is
not known to be safe, and its message is withheld too.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import msgspec

from shared import awaiter, history, loader, prompts
from shared import events as ev
from shared.config import env_float
from shared.node import Context, Node
from shared.events import UNKNOWN, VisitorProfile
from shared.llm import LLMClient, LLMError
from shared.site_config import SiteConfig, SiteConfigs
from shared.state import ConversationState

log = logging.getLogger(__name__)

NAME = "visitor_profiler"
RULES = Path(__file__).parent / "data" / "profiler_rules.toml"
PROMPT = Path(__file__).parent / "prompts" / "profiler_system.md"
ROUTE_WAIT_S = env_float("PROFILER_ROUTE_WAIT_S", 2.0)


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


def withheld_turns(state: ConversationState, turn: int) -> set[int]:
    """The turns whose visitor text the LLM may not see: HACK turns, and this turn when it
    is not routed yet."""
    record = state.turns.get(turn)
    unrouted = {turn} if record is None or record.route is None else set()
    return history.hack_turns(state) | unrouted


async def infer_with_llm(llm: LLMClient, ctx: Context, state: ConversationState, turn: int, system: str) -> Inferred:
    shown = history.window(state, turn, llm.history_tokens("profiler"), withheld_turns(state, turn))
    transcript = "\n".join(f"{m.role}: {m.content}" for m in shown)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Known profile: {msgspec.json.encode(state.visitor_profile).decode()}\n\n"
                                    f"Conversation:\n{transcript}"},
    ]
    return await llm.structured("profiler", messages, ctx.record_llm, Inferred, temperature=0)


def make_node(llm: LLMClient | None = None, rules: dict | None = None, configs: SiteConfigs | None = None) -> Node:
    rules = rules or load_rules()

    async def handle(event: ev.EnrichmentCompleted, ctx: Context) -> list[ev.Envelope]:
        method = "local"
        inferred = None
        if llm is None:
            state = await loader.load(ctx.bus, event.site, event.session_id)
        else:
            state = await awaiter.turn_state(ctx.bus, event.site, event.session_id, event.turn, {"route_decided"},
                                             ROUTE_WAIT_S)
            config = await configs.get(event.site) if configs else SiteConfig()
            try:
                inferred = await infer_with_llm(llm, ctx, state, event.turn, prompts.compose(PROMPT, event.site, config))
                method = "llm"
            except (LLMError, msgspec.MsgspecError) as exc:
                log.warning("LLM profiling failed; local method used", extra={"error": str(exc)})
        if inferred is None:
            inferred = infer_locally([m.content for m in state.messages if m.role == "user"], rules)
        profile = apply_inference(state.visitor_profile, inferred)
        return [ctx.follow(ev.ProfileInferred, profile=profile, method=method)]

    return Node(name=NAME, consumes=("enrichment_completed",), handle=handle)
