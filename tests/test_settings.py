"""Settings read once: each service's `from_env` reads its defaults, takes overrides and stops
the process on a bad value naming the variable; nothing else in services/ or shared/ reads the
environment (an AST check, and the nodes and the app made from settings read nothing); every
variable the code reads is in docs/operations.md."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from services.enricher.settings import EnricherSettings, RemoteSource
from services.gateway.settings import GatewaySettings
from services.responder.settings import AnswerSettings, LeadSettings, ResponderSettings
from services.retriever.settings import (KnowledgeBaseSettings, RerankerSettings, RetrievalSettings,
                                         RetrieverSettings, SnapshotSettings)
from services.router.settings import RouterSettings
from shared.config import LLM_ROLES, BusConfig, ConfigError, LLMRoleConfig
from shared.embeddings import EmbeddingSettings
from shared.llm import LLMClient
from shared.privacy import PrivacySettings
from shared.service import ProcessSettings
from shared.webhook_secret import WebhookSecrets
from tests.variables import SWITCHED_ON, every_variable, read_by, service_nodes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch):
    """An environment with none of the code's variables set; `env.set(...)` sets some."""
    for name in every_variable() | set(SWITCHED_ON):
        monkeypatch.delenv(name, raising=False)

    class Env:
        @staticmethod
        def set(**values: str) -> None:
            for name, value in values.items():
                monkeypatch.setenv(name, value)

    return Env()


def role(name: str) -> LLMRoleConfig:
    return LLMRoleConfig.from_env(name)


# --- defaults ------------------------------------------------------------------------------

def test_unset_variables_give_each_services_defaults(env):
    assert ProcessSettings.from_env() == ProcessSettings()
    assert GatewaySettings.from_env() == GatewaySettings()
    assert RouterSettings.from_env() == RouterSettings(llm={"classifier": role("classifier")})
    responder = ResponderSettings.from_env()
    assert responder.lead.secrets.deployment == ""  # its `variables` are the environment's, whatever they are
    lead = msgspec.structs.replace(responder.lead, secrets=WebhookSecrets())
    assert msgspec.structs.replace(responder, lead=lead) == ResponderSettings(
        llm={r: role(r) for r in ("answer", "redirect", "suggestions")})
    assert RetrieverSettings.from_env() == RetrieverSettings()
    assert EnricherSettings.from_env() == EnricherSettings(llm={"briefs": role("briefs")})
    assert role("answer") == LLMRoleConfig(role="answer", base_url="", api_key="not-needed", model="default")


def test_the_defaults_are_the_documented_ones():
    process, gateway, router = ProcessSettings(), GatewaySettings(), RouterSettings()
    assert (process.ops_port, process.ops_check_s, process.start_lookback_s, process.site_config_ttl_s) == (
        9000, 5.0, 300.0, 2.0)
    assert (gateway.host, gateway.port, gateway.turn_deadline_s, gateway.max_body_bytes, gateway.keepalive_s) == (
        "127.0.0.1", 8000, 60.0, 524288, 15.0)
    assert gateway.turn_stall_s == 8.0
    assert gateway.privacy.raw_ip_ttl_s == 900.0 and gateway.redis_url == "redis://127.0.0.1:6379/0"
    assert (router.classifier, router.cascade_threshold, router.strike_confidence, router.fast_path_confidence) == (
        "local", 0.5, 0.8, 0.6)
    answer = AnswerSettings()
    assert (answer.wait_s, answer.retrieval_wait_s, answer.max_sources, answer.extractive_threshold) == (
        0.15, 2.0, 10, 0.35)
    assert ResponderSettings().finalize_wait_s == 0.5 and LeadSettings().attempts == 4
    enricher = EnricherSettings()
    assert (enricher.deadline_s, enricher.cache_ttl_s, enricher.profiler_route_wait_s) == (1.5, 600.0, 2.0)
    assert RetrievalSettings().mode == "mix" and KnowledgeBaseSettings().kb_dir == ".data/kb"


# --- overrides ----------------------------------------------------------------------------

def test_process_and_gateway_overrides(env):
    env.set(NATS_URL="nats://a:4222", NODES="finalize", OPS_PORT="0", OPS_CHECK_S="0.5", SITE_CONFIG_TTL_S="9",
            CONSUMER_START_LOOKBACK_S="60", TURN_DEADLINE_S="30", TURN_STALL_S="12", TRUSTED_PROXY_HOPS="1", REDIS_URL="redis://r:1/0",
            IP_HASH_SECRET="ip-secret", RAW_IP_TTL_S="60", SESSION_TOKEN_SECRET="s" * 16,
            SESSION_TOKEN_PREVIOUS="0:old-secret-0123456789,1b:other-secret-012345", ADMIN_TOKEN="a" * 16,
            GATEWAY_PORT="9001")
    process = ProcessSettings.from_env()
    assert process == ProcessSettings(bus=BusConfig(url="nats://a:4222"), nodes="finalize", ops_port=0,
                                      ops_check_s=0.5, start_lookback_s=60.0, site_config_ttl_s=9.0)
    gateway = GatewaySettings.from_env()
    assert (gateway.turn_deadline_s, gateway.turn_stall_s, gateway.trusted_proxy_hops, gateway.redis_url,
            gateway.port) == (30.0, 12.0, 1, "redis://r:1/0", 9001)
    assert gateway.privacy == PrivacySettings(ip_hash_secret="ip-secret", raw_ip_ttl_s=60.0)
    assert gateway.session_token_previous == {"0": "old-secret-0123456789", "1b": "other-secret-012345"}
    assert gateway.admin_token == "a" * 16 and gateway.site_config_ttl_s == 9.0
    assert "ip-secret" not in repr(gateway) and "old-secret" not in repr(gateway) and "a" * 16 not in repr(gateway)


def test_router_overrides(env):
    env.set(SITES_DIR="/etc/sites", ROUTER_CLASSIFIER="cascade", ROUTER_CASCADE_THRESHOLD="0.4",
            ROUTER_HACK_STRIKE_CONFIDENCE="0.9", ROUTER_SKILLS_BACKEND="llm", LLM_BASE_URL="http://llm",
            EMBEDDINGS_QUANTIZE="0", CONCIERGE_CACHE_DIR="/cache")
    router = RouterSettings.from_env()
    assert (router.sites_dir, router.classifier, router.cascade_threshold, router.strike_confidence) == (
        "/etc/sites", "cascade", 0.4, 0.9)
    assert (router.signals_backend, router.skills_backend) == ("local", "llm")
    assert router.llm["classifier"].base_url == "http://llm"
    assert router.embeddings == EmbeddingSettings(quantize=False, cache_dir="/cache")


def test_responder_overrides(env):
    own = "acme:whsec_" + "A" * 40
    env.set(ANSWER_BACKEND="extractive", ANSWER_MAX_SOURCES="5", ANSWER_WAIT_S="0.3", FINALIZE_WAIT_S="0.1",
            LEAD_WEBHOOK_URL="http://crm", LEAD_WEBHOOK_ATTEMPTS="2", LEAD_WEBHOOK_SECRET="deployment",
            LEAD_WEBHOOK_SECRET_ACME=own, POSTHOG_HOST="http://ph", LLM_ANSWER_MODEL="big")
    responder = ResponderSettings.from_env()
    assert responder.answer == AnswerSettings(backend="extractive", max_sources=5, wait_s=0.3)
    assert responder.finalize_wait_s == 0.1 and responder.llm["answer"].model == "big"
    lead = responder.lead
    assert (lead.webhook_url, lead.attempts, lead.posthog_host) == ("http://crm", 2, "http://ph")
    assert lead.secrets.deployment == "deployment" and lead.secrets.variables["LEAD_WEBHOOK_SECRET_ACME"] == own
    assert own not in repr(responder)


def test_retriever_overrides(env):
    env.set(KB_DIR="/kb", QDRANT_URL="http://q:6333", KB_SNAPSHOT_POLL_S="1", RETRIEVAL_MODE="local",
            RETRIEVAL_RERANK_ENABLED="yes", RETRIEVAL_COSINE_THRESHOLD="0.3", RETRIEVAL_KEYWORDS="llm",
            COHERE_API_KEY="co-key")
    retriever = RetrieverSettings.from_env()
    assert retriever.knowledge_base == KnowledgeBaseSettings(kb_dir="/kb", qdrant_url="http://q:6333",
                                                             cosine_threshold=0.3)
    assert retriever.snapshots == SnapshotSettings(enabled=True, poll_s=1.0)  # on: a Qdrant server
    assert retriever.retrieval.mode == "local" and retriever.retrieval.rerank_enabled
    assert retriever.keywords == "llm" and set(retriever.llm) == {"classifier"}
    assert retriever.rerankers == RerankerSettings(cohere_api_key="co-key") and "co-key" not in repr(retriever)


def test_enricher_overrides(env):
    env.set(ENRICH_IP_API_URL="http://ip", ENRICH_IP_API_TIMEOUT_S="0.2", ENRICH_DEADLINE_S="1",
            PROFILER_BACKEND="llm", PROFILER_ROUTE_WAIT_S="0.5", LLM_PROFILER_BASE_URL="http://llm")
    enricher = EnricherSettings.from_env()
    assert enricher.ip_api == RemoteSource(url="http://ip", timeout_s=0.2) and enricher.session_provider is None
    assert (enricher.deadline_s, enricher.profiler_backend, enricher.profiler_route_wait_s) == (1.0, "llm", 0.5)
    assert enricher.llm["profiler"].base_url == "http://llm"


def test_the_enrichment_vendors_and_the_sites_own_keys(env):
    """Snitcher and PDL by their formats; the sites' key variables (ENRICH_KEY_…) kept as
    the process started, hidden in the repr, and no other variable a site config could name."""
    env.set(ENRICH_SESSION_PROVIDER_URL="https://api.snitcher.com", ENRICH_SESSION_PROVIDER_FORMAT="snitcher",
            ENRICH_SESSION_PROVIDER_ACCOUNT="script-1", ENRICH_PERSON_API_URL="https://api.peopledatalabs.com",
            ENRICH_PERSON_API_FORMAT="pdl", ENRICH_PERSON_API_KEY="pdl-key", ENRICH_KEY_ACME_PDL="acme-key",
            ENRICH_KEY_lower="no", IP_HASH_SECRET="ip-secret")
    enricher = EnricherSettings.from_env()
    assert enricher.session_provider == RemoteSource(url="https://api.snitcher.com", format="snitcher",
                                                     account="script-1")
    assert enricher.person_api == RemoteSource(url="https://api.peopledatalabs.com", format="pdl", key="pdl-key")
    assert enricher.site_keys["ENRICH_KEY_ACME_PDL"] == "acme-key"
    assert "ENRICH_KEY_lower" not in enricher.site_keys and "IP_HASH_SECRET" not in enricher.site_keys
    assert "acme-key" not in repr(enricher) and "pdl-key" not in repr(enricher)
    env.set(ENRICH_PERSON_API_FORMAT="clearbit")
    with pytest.raises(ConfigError, match="ENRICH_PERSON_API_FORMAT"):
        EnricherSettings.from_env()


def test_optional_parts_are_read_only_when_switched_on(env):
    """As before settings were read at start: a source's or a backend's variables are read
    when it is configured, so a stray value elsewhere stops nothing."""
    env.set(ENRICH_IP_API_TIMEOUT_S="soon", LLM_PROFILER_TIMEOUT_S="soon", KB_SNAPSHOT_POLL_S="soon")
    assert EnricherSettings.from_env().ip_api is None
    assert RetrieverSettings.from_env().snapshots == SnapshotSettings()


# --- a bad value stops the process, naming the variable -----------------------------------------

BAD = [
    (ProcessSettings.from_env, "OPS_PORT", "ninety"),
    (ProcessSettings.from_env, "NATS_REQUEST_TIMEOUT_S", "soon"),
    (GatewaySettings.from_env, "TURN_DEADLINE_S", "a minute"),
    (GatewaySettings.from_env, "TRUSTED_PROXY_HOPS", "one"),
    (GatewaySettings.from_env, "SESSION_TOKEN_PREVIOUS", "no-colon"),
    (GatewaySettings.from_env, "RAW_IP_TTL_S", "15m"),
    (RouterSettings.from_env, "ROUTER_CLASSIFIER", "magic"),
    (RouterSettings.from_env, "ROUTER_SIGNALS_BACKEND", "gpt"),
    (RouterSettings.from_env, "ROUTER_CASCADE_THRESHOLD", "half"),
    (RouterSettings.from_env, "SITES_POLL_S", "often"),
    (RouterSettings.from_env, "EMBEDDINGS_WORKERS", "two"),
    (ResponderSettings.from_env, "ANSWER_BACKEND", "oracle"),
    (ResponderSettings.from_env, "ANSWER_MAX_SOURCES", "many"),
    (ResponderSettings.from_env, "FINALIZE_WAIT_S", "soon"),
    (ResponderSettings.from_env, "LEAD_WEBHOOK_ATTEMPTS", "some"),
    (ResponderSettings.from_env, "LLM_HISTORY_TOKENS", "lots"),
    (RetrieverSettings.from_env, "RETRIEVAL_MODE", "fuzzy"),
    (RetrieverSettings.from_env, "RETRIEVAL_RERANK_ENABLED", "maybe"),
    (RetrieverSettings.from_env, "RETRIEVAL_KEYWORDS", "regex"),
    (RetrieverSettings.from_env, "RETRIEVAL_EXTRACTION", "manual"),
    (RetrieverSettings.from_env, "RETRIEVAL_COSINE_THRESHOLD", "high"),
    (RetrieverSettings.from_env, "KB_SNAPSHOTS", "sometimes"),
    (EnricherSettings.from_env, "PROFILER_BACKEND", "oracle"),
    (EnricherSettings.from_env, "ENRICH_DEADLINE_S", "soon"),
    (EnricherSettings.from_env, "PROFILER_ROUTE_WAIT_S", "soon"),
]


@pytest.mark.parametrize("load, variable, value", BAD, ids=[f"{v}={x}" for _, v, x in BAD])
def test_a_bad_value_is_refused_naming_the_variable(env, load, variable, value):
    env.set(**{variable: value})
    with pytest.raises(ConfigError, match=variable):
        load()


def test_a_bad_value_of_a_switched_on_part_is_refused_naming_it(env):
    env.set(ENRICH_SESSION_PROVIDER_URL="http://p", ENRICH_SESSION_PROVIDER_RETRIES="twice")
    with pytest.raises(ConfigError, match="ENRICH_SESSION_PROVIDER_RETRIES"):
        EnricherSettings.from_env()
    env.set(KB_SNAPSHOTS="bus")
    with pytest.raises(ConfigError, match="KB_SNAPSHOTS=bus needs QDRANT_URL"):
        RetrieverSettings.from_env()


@pytest.mark.parametrize("module, variable", [("services.responder", "ANSWER_MAX_SOURCES"),
                                              ("services.gateway", "GATEWAY_PORT")])
def test_a_service_stops_at_start_with_the_variable_in_its_message(module, variable):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), variable: "lots", "OPS_PORT": "0"}
    out = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=environment, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert f"{variable}='lots' is not an integer" in out.stderr.strip().splitlines()[-1]


# --- nothing else reads the environment ---------------------------------------------------------

READERS = {"env_str", "env_float", "env_int", "env_bool", "env_choice"}
# Reads outside a `from_env`, each start-up only, with why (the comment beside each says so too).
ALLOWED = {
    ("shared/config.py", "env_str"): "the helpers the from_env constructors read with",
    ("shared/config.py", "env_float"): "the helpers the from_env constructors read with",
    ("shared/config.py", "env_int"): "the helpers the from_env constructors read with",
    ("shared/config.py", "env_bool"): "the helpers the from_env constructors read with",
    ("shared/config.py", "env_choice"): "the helpers the from_env constructors read with",
    ("shared/logs.py", "setup"): "LOG_LEVEL: logging is set up before the settings are read",
    ("shared/telemetry.py", "setup"): "OTEL_TRACES_EXPORTER: tracing set-up, beside logging",
    ("services/retriever/lightrag_functions.py", "quiet_lightrag"): "LOG_LEVEL for LightRAG's logger, when "
                                                                     "the knowledge base opens at start",
    ("shared/embeddings.py", "model_dir"): "sets HF_HUB_OFFLINE for the Hugging Face libraries: no setting",
}


def environment_reads(source: str, path: str = "<test>") -> list[tuple[str, int, str]]:
    """(enclosing function, line, what) for every read of the environment in `source` outside a
    `from_env` (or a nested function of one): os.environ, os.getenv, `from os import environ`,
    and the env_* helpers. Module-level reads are named `<module>`."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, functions: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions = (*functions, node.name)
        what = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "getenv", "environb", "getenvb"):
            what = f"os.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "os" \
                and {a.name for a in node.names} & {"environ", "getenv", "environb", "getenvb"}:
            what = "from os import environ"
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in READERS:
                what = f"{name}()"
        if what and "from_env" not in functions:
            found.append((functions[-1] if functions else "<module>", node.lineno, what))
        for child in ast.iter_child_nodes(node):
            visit(child, functions)

    visit(ast.parse(source, path), ())
    return found


def test_the_check_finds_reads_at_import_per_call_and_by_alias():
    source = '''
import os
from os import getenv
from shared.config import env_float

WAIT_S = env_float("X_WAIT_S", 1.0)

class Thing:
    @classmethod
    def from_env(cls):
        def pick(name):
            return os.environ.get(name)
        return cls(pick("X"), env_float("Y", 0.0))

    def handle(self):
        return os.environ["Z"], os.getenv("W")
'''
    assert environment_reads(source) == [("<module>", 3, "from os import environ"), ("<module>", 6, "env_float()"),
                                         ("handle", 16, "os.environ"), ("handle", 16, "os.getenv")]


def test_nothing_in_services_or_shared_reads_the_environment_outside_the_settings():
    found, allowed_seen = [], set()
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("shared/**/*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        for function, line, what in environment_reads(path.read_text(encoding="utf-8"), relative):
            if (relative, function) in ALLOWED:
                allowed_seen.add((relative, function))
            else:
                found.append(f"{relative}:{line} {function}: {what}")
    assert not found, "read the variable in a settings Struct's from_env instead:\n" + "\n".join(found)
    assert allowed_seen == set(ALLOWED), f"allowed reads that are gone: {set(ALLOWED) - allowed_seen}"


def test_the_nodes_and_the_app_made_from_settings_read_nothing():
    from services.enricher.main import enricher_nodes
    from services.gateway.app import create_app
    from services.responder.main import responder_nodes
    from services.retriever.main import retriever_nodes
    from services.router.main import router_nodes
    from tests.variables import _Anything

    answer = LLMRoleConfig(role="answer", base_url="http://llm.invalid", api_key="k", model="m")
    settings = ResponderSettings(answer=AnswerSettings(backend="llm"))  # the extractive one would load a model
    builds = {
        "gateway": lambda: create_app(GatewaySettings()),
        "router": lambda: router_nodes(_Anything()),
        "responder": lambda: responder_nodes(LLMClient({"answer": answer}), None, settings),
        "retriever": lambda: retriever_nodes(None),
        "enricher": lambda: enricher_nodes(None, None, EnricherSettings()),
    }
    for name, build in builds.items():
        assert read_by(build, {}) & every_variable() == set(), name  # libraries may look up their own


def test_every_role_and_node_is_covered_by_the_recorded_variables():
    names = every_variable()
    assert {f"LLM_{r.upper()}_BASE_URL" for r in LLM_ROLES} <= names
    assert {f"CONSUMER_{n.upper()}_ACK_WAIT_S" for nodes in service_nodes().values() for n in nodes} <= names


# --- documented -----------------------------------------------------------------------------------

def test_docs_operations_lists_every_variable_the_code_reads():
    """A name is listed in full (`NAME`), or by a documented pattern: `LLM_<ROLE>_<FIELD>`,
    `CONSUMER_<NODE>_<FIELD>`, `ENRICH_<SOURCE>_TIMEOUT_S`, whose placeholders name a role, a
    node, or another backticked word of the page."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    words = set(re.findall(r"`([A-Za-z0-9_.]+)`", text))
    values = {"ROLE": {r.upper() for r in LLM_ROLES},
              "NODE": {n.upper() for nodes in service_nodes().values() for n in nodes}}

    def alternatives(placeholder: re.Match) -> str:
        return "(?:" + "|".join(map(re.escape, sorted(values.get(placeholder.group(1), words)))) + ")"

    patterns = [re.compile(re.sub(r"<([A-Z]+)>", alternatives, pattern))
                for pattern in set(re.findall(r"`([A-Z0-9_]*<[A-Z]+>[A-Z0-9_<>]*)`", text))]
    missing = sorted(name for name in every_variable()
                     if name not in words and not any(p.fullmatch(name) for p in patterns))
    assert not missing, f"docs/operations.md does not list: {missing}"


def test_webhook_secrets_keep_the_variables_a_site_may_name(env):
    env.set(LEAD_WEBHOOK_SECRET_ACME="acme:whsec_x", lowercase_name="acme:whsec_y", LEAD_WEBHOOK_SECRET_BARE="whsec_z")
    secrets = WebhookSecrets.from_env()
    assert secrets.variables["LEAD_WEBHOOK_SECRET_ACME"] == "acme:whsec_x" and "lowercase_name" not in secrets.variables
    assert "LEAD_WEBHOOK_SECRET_BARE" not in secrets.variables  # not bound to a site: never a site's secret


def test_settings_are_frozen_once_read(env):
    settings = ResponderSettings.from_env()
    with pytest.raises(AttributeError):
        settings.finalize_wait_s = 1.0  # type: ignore[misc]
    assert msgspec.structs.replace(settings, finalize_wait_s=1.0).finalize_wait_s == 1.0


def test_a_service_process_runs_numpy_on_one_blas_thread():
    """shared/service.one_blas_thread: OpenBLAS's spinning pool cost tens of CPU ms per small
    product; every service (and replay serve) limits it to one thread at start."""
    code = ("import numpy, json; from threadpoolctl import threadpool_info; "
            "from shared.service import one_blas_thread; before = [p['num_threads'] for p in threadpool_info() "
            "if p['user_api'] == 'blas']; one_blas_thread(); after = [p['num_threads'] for p in threadpool_info() "
            "if p['user_api'] == 'blas']; print(json.dumps([before, after]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "", "OMP_NUM_THREADS": ""})
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert after and set(after) == {1}
    assert before != after or os.cpu_count() == 1  # the pool had more than one thread to begin with
