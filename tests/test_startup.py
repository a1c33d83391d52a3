"""Starting up as a newcomer and an operator meet it: every bad setting named before anything
starts (`concierge check`, `make run`), a process that stops at start says why in one line,
and readiness that means "can serve": no process is ready before the site registry is
loaded, and until then a site the gateway cannot find is 503, not 404."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from cli import preflight
from cli.harness.supervisor import ROOT, free_port, make_system
from shared.config import ConfigError, env_float, every_problem
from shared.site_store import SiteConfigSync


# --- every problem, before anything starts --------------------------------------------------

def test_every_bad_setting_is_listed_once_with_the_processes_it_stops(monkeypatch):
    monkeypatch.setenv("NATS_REQUEST_TIMEOUT_S", "soon")
    monkeypatch.setenv("RETRIEVAL_MODE", "sideways")
    monkeypatch.setenv("ADMIN_TOKEN", "my-admin-token1")
    monkeypatch.setenv("SESSION_TOKEN_SECRET", "s" * 32)
    found = preflight.problems()
    assert found == [
        "every process: NATS_REQUEST_TIMEOUT_S='soon' is not a number",
        "retriever: RETRIEVAL_MODE='sideways': use one of global, local, hybrid, mix, naive",
        "gateway: ADMIN_TOKEN must be at least 16 characters (got 15): it guards every site's data",
    ]


def test_a_good_configuration_has_no_problem_and_reading_one_raises_outside_a_check(monkeypatch):
    monkeypatch.setenv("ADMIN_TOKEN", "a" * 16)
    monkeypatch.setenv("SESSION_TOKEN_SECRET", "s" * 32)
    assert preflight.problems() == []
    monkeypatch.setenv("TURN_DEADLINE_S", "x")
    with pytest.raises(ConfigError, match="TURN_DEADLINE_S='x' is not a number"):
        env_float("TURN_DEADLINE_S", 60.0)  # a process's own start still stops at the first
    assert every_problem({"one": lambda: env_float("TURN_DEADLINE_S", 60.0),
                          "two": lambda: (_ for _ in ()).throw(ConfigError("a check's own error"))}) == [
        "one: TURN_DEADLINE_S='x' is not a number", "two: a check's own error"]


def test_the_environment_the_processes_will_have_is_checked_and_this_ones_left_as_it_was(monkeypatch):
    monkeypatch.delenv("ADMIN_TOKEN", raising=False)
    before = dict(os.environ)
    found = preflight.problems({"PATH": os.environ.get("PATH", ""), "ADMIN_TOKEN": "short",
                                "SESSION_TOKEN_SECRET": "s" * 32})
    assert found == ["gateway: ADMIN_TOKEN must be at least 16 characters (got 5): it guards every site's data"]
    assert dict(os.environ) == before  # `make run` says where the token came from by this one


def test_concierge_check_exits_1_naming_each_problem(monkeypatch, capsys):
    monkeypatch.setenv("ANSWER_BACKEND", "llm")
    monkeypatch.delenv("LLM_BASE_URL", raising=False)
    monkeypatch.delenv("LLM_ANSWER_BASE_URL", raising=False)
    assert preflight.main([]) == 1
    assert "responder: ANSWER_BACKEND=llm needs LLM_BASE_URL or LLM_ANSWER_BASE_URL" in capsys.readouterr().out


def test_make_run_with_a_bad_setting_says_which_and_starts_nothing(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ADMIN_TOKEN": "my-admin-token1",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "cli", "run", "--data-dir", str(tmp_path / "data"),
                          "--port", str(free_port()), "--nats-port", str(free_port())],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "gateway: ADMIN_TOKEN must be at least 16 characters (got 15)" in out.stderr
    assert not list((tmp_path / "data" / "logs").iterdir()), "a process was started"


# --- a process that stops at start says why --------------------------------------------------

def test_a_process_that_exits_at_start_is_named_with_the_line_it_exited_with(tmp_path):
    system = make_system(tmp_path, free_port(), free_port(), {})
    system.spawn("router", [sys.executable, "-c", "import json, sys; print(json.dumps({'level': 'info', 'msg': "
                                                  "'starting'})); sys.exit('router: NATS_URL is empty')"])
    system.procs["router"].wait(10)
    assert system.exit_reason("router") == "router: NATS_URL is empty"
    traceback = "Traceback (most recent call last):\\n  ...\\nOSError: [Errno 98] address already in use"
    system.spawn("gateway", [sys.executable, "-c", "import json; print(json.dumps({'level': 'error', 'msg': "
                                                   f"'{traceback}'}})); raise SystemExit(3)"])
    system.procs["gateway"].wait(10)
    assert system.exit_reason("gateway") == "gateway: OSError: [Errno 98] address already in use"


def test_waiting_for_the_services_stops_at_the_first_that_exits_with_its_reason(tmp_path):
    system = make_system(tmp_path, free_port(), free_port(), {})
    for name in ("router", "retriever", "enricher", "responder", "gateway"):
        code = "import sys; sys.exit('enricher: ENRICH_CACHE_TTL_S=\\'x\\' is not a number')" if name == "enricher" \
            else "import time; time.sleep(30)"
        system.spawn(name, [sys.executable, "-c", code])
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"enricher: ENRICH_CACHE_TTL_S='x' is not a number \(exit status 1"):
            system.wait_services(20)
        assert time.monotonic() - started < 10, "waited for a timeout rather than the exit"
    finally:
        system.stop(timeout=2)


def test_a_start_waits_for_what_it_builds_and_giving_up_says_what_each_was_doing(tmp_path):
    """Issue 54: the wait is derived from what the start has to do (each artifact the cache
    lacks adds its build time, cli/prepare.py), and a timeout names each service still
    waited for with its log's last line and its age, the cache and the machine's load."""
    from cli.harness.supervisor import BUILD_S, READY_S

    cold = make_system(tmp_path / "cold", free_port(), free_port(), {"CONCIERGE_CACHE_DIR": str(tmp_path / "empty")})
    assert cold.to_build() == ["the embedding model's ONNX export", "the router's intent model"]
    assert cold.start_wait(cold.to_build()) == READY_S + 2 * BUILD_S
    assert make_system(tmp_path / "remote", free_port(), free_port(), {
        "EMBEDDINGS_BASE_URL": "http://embeddings.example/v1"}).to_build() == []

    system = make_system(tmp_path / "slow", free_port(), free_port(), {})
    for name in ("router", "retriever", "enricher", "responder", "gateway"):
        code = ("import json, time; print(json.dumps({'level': 'info', 'msg': 'training the intent model'}), "
                "flush=True); time.sleep(30)") if name == "router" else "import time; time.sleep(30)"
        system.spawn(name, [sys.executable, "-c", code])
    try:
        with pytest.raises(TimeoutError) as caught:
            system.wait_services(2, ["the router's intent model"])
    finally:
        system.stop(timeout=2)
    why = str(caught.value)
    assert "not ready after 2s (the cache lacked the router's intent model; load average" in why
    assert "router: 'training the intent model', " in why and "gateway: nothing logged" in why


# --- ready means "can serve" -------------------------------------------------------------------

def test_the_gateway_is_not_ready_and_answers_503_until_the_site_registry_is_loaded(tmp_path):
    """A fresh store: nats, redis and the gateway, no router yet. /readyz (its HTTP port and
    its ops port) is 503 and a configured site's request 503 with Retry-After; once the
    registry is loaded (what the router does at start), ready, the site served and an
    unknown site 404."""
    import asyncio

    from shared.bus import connect
    from shared.config import BusConfig

    system = make_system(tmp_path, free_port(), free_port(), {"OPS_CHECK_S": "0.5"})
    try:
        system.start_nats()
        system.start_redis()
        system.start_service("gateway")
        ops = f"http://127.0.0.1:{system.ops_ports['gateway']}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{ops}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        read = f"{system.gateway_url}/v1/sites/demo/conversations/s1"
        assert httpx.get(f"{system.gateway_url}/readyz").status_code == 503
        assert httpx.get(f"{ops}/readyz").status_code == 503
        early = httpx.get(read)
        assert early.status_code == 503 and early.headers["retry-after"] == "2", early.text
        assert "not loaded yet" in early.json()["detail"]
        assert httpx.get(f"{system.gateway_url}/v1/sites/nowhere/conversations/s1").status_code == 503

        async def load_registry() -> None:
            bus = await connect(BusConfig(url=system.nats_url), name="test-router")
            try:
                await SiteConfigSync(bus, ROOT / "sites").sync_once()
            finally:
                await bus.close()

        asyncio.run(load_registry())
        assert httpx.get(f"{system.gateway_url}/readyz").status_code == 200
        assert httpx.get(read).status_code == 403  # found; the conversation needs its token
        assert httpx.get(f"{system.gateway_url}/v1/sites/nowhere/conversations/s1").status_code == 404
        deadline = time.monotonic() + 5
        while httpx.get(f"{ops}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the ops port's /readyz did not follow"
            time.sleep(0.1)
        metrics = httpx.get(f"{ops}/metrics")
        assert metrics.status_code == 200 and "concierge_" in metrics.text
        assert httpx.get(f"{system.gateway_url}/metrics").status_code == 404  # not on the published port
    finally:
        system.stop(timeout=5)
