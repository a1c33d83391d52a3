"""`concierge cluster-rehearsal --bounded`: three clustered nats-servers and two replicas of
every service under load, while a nats-server, a gateway and a responder are SIGKILLed in
turn. Nothing is lost, nothing hangs, no lead is sent twice.

The nats-server killed here is not the conversation stream's leader (the full command
kills the leader). This run lost a turn now and then until issue #17 was fixed: nodes
read the log from R3 replicas that had not yet stored the event they were handling
(docs/benchmarks-history.md, "Cluster rehearsal"; tests/test_bus_cluster.py). About a minute and
a half; `make rehearsal` runs it alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cli.harness.supervisor import ROOT

# A gateway killed mid-stream cuts its visitors' streams; they resume them on the other
# gateway (Last-Event-ID) and send again what it cut before the turn's start frame, as the
# widget does, so nearly every turn completes (43 of 43 in the run that set this bound);
# the margin is for a loaded machine. The full command's figures are in docs/benchmarks-history.md.
MIN_COMPLETED = 0.9


@pytest.mark.timeout(240)
def test_bounded_rehearsal_loses_nothing_and_hangs_nothing():
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "cli", "cluster-rehearsal", "--bounded", "--nats-victim", "follower",
         "--sessions", "6", "--turns-per-session", "3",
         "--kill-interval", "3", "--turn-deadline-s", "15"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=230)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert last.startswith("{"), f"no figures: {out.stdout[-1500:]}\n{out.stderr[-3000:]}"
    figures = json.loads(last)
    report = f"{out.stdout[-2500:]}\n{out.stderr[-1500:]}"
    assert set(figures["killed"]) >= {"gateway-a", "responder-a"} and len(figures["killed"]) == 3, report
    assert figures["lost_events"] == 0, report
    assert figures["hung"] == 0, report
    assert figures["duplicate_side_effects"] == 0, report
    assert figures["leads"] >= 1 and figures["webhooks_recorded"] == figures["leads"], report
    assert figures["turns"] == figures["completed"] + figures["errors_shown"] + figures["hung"]
    assert figures["completed"] >= MIN_COMPLETED * figures["turns"], report
    assert time.monotonic() - started < 200, report
