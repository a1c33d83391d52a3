"""`concierge first-run`: what a newcomer waits for, measured. Clones this repository into a
temporary directory, runs `make run` there as a new user would (no LLM_BASE_URL: extractive
answers from the knowledge base, nothing compiled), and times the `Ready` line, the first
streamed token of "Do you integrate with QuickBooks?" and the end of that answer; then
stops it with Ctrl-C.

`--cache-dir DIR` points CONCIERGE_CACHE_DIR somewhere else (an empty directory measures a
machine without the cached ONNX export; pip's own cache still applies). `--local-llm`
measures `LLM=local make run` instead (the embedded llama.cpp model). The gateway must be
free to listen on 127.0.0.1:8000. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from cli.harness.supervisor import ROOT
from cli.measure import machine

QUESTION = "Do you integrate with QuickBooks?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge first-run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default="", help="CONCIERGE_CACHE_DIR for the run (default: the usual one)")
    parser.add_argument("--timeout", type=float, default=3000)
    parser.add_argument("--local-llm", action="store_true", help="LLM=local make run (the embedded model)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="concierge-first-run-") as tmp:
        clone = Path(tmp) / "concierge"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "VIRTUAL_ENV"))}
        if args.cache_dir:
            env["CONCIERGE_CACHE_DIR"] = args.cache_dir
        env.pop("LLM", None)
        if args.local_llm:
            env["LLM"] = "local"
        started = time.monotonic()
        proc = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            ready = None
            for line in proc.stdout:
                if "WARNING: Location" not in line:
                    print(f"[{time.monotonic() - started:7.1f}s] {line.rstrip()}", flush=True)
                if line.startswith("Ready in"):
                    ready = time.monotonic() - started
                    break
                if time.monotonic() - started > args.timeout:
                    break
            if ready is None:
                print(json.dumps({"ready_s": None, "error": "make run did not get ready"}))
                return 1
            first, text, sources = None, "", 0
            request = urllib.request.Request("http://127.0.0.1:8000/v1/chat", headers={"content-type": "application/json"},
                                             data=json.dumps({"site": "demo", "message": QUESTION}).encode())
            with urllib.request.urlopen(request, timeout=300) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if event["type"] == "sources":
                        sources = len(event["sources"])
                    elif event["type"] == "token":
                        text += event["content"]
                        first = first or time.monotonic() - started
                    elif event["type"] in ("complete", "error"):
                        break
            done = time.monotonic() - started
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
    print(json.dumps({"ready_s": round(ready, 1), "first_token_s": round(first, 1) if first else None,
                      "answer_s": round(done, 1), "sources": sources, "answer": text[:300],
                      "machine_gauge_ms": machine.gauge_ms()}))
    return 0 if first else 1
