"""free_port: a port handed out is not handed out again by another search on this machine
(test workers and benches start servers at the same time), until its reservation is old."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from cli.harness import supervisor
from cli.harness.supervisor import ROOT, free_port

PICK = "import json; from cli.harness.supervisor import free_port; print(json.dumps([free_port() for _ in range(150)]))"


def test_searches_in_two_processes_never_hand_out_the_same_port(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", PICK], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    picked = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    assert all(len(set(ports)) == 150 for ports in picked)
    assert not set(picked[0]) & set(picked[1])


def test_a_reservation_older_than_its_time_is_taken_anew(tmp_path, monkeypatch):
    port = free_port()  # free on this machine now
    monkeypatch.setattr(supervisor, "RESERVATIONS", tmp_path)
    monkeypatch.setattr(supervisor, "PORTS", range(port, port + 1))
    held = tmp_path / str(port)
    held.touch()
    assert not supervisor._reserved(port), "held by another search"
    old = time.time() - supervisor.RESERVE_S - 1
    os.utime(held, (old, old))
    assert free_port() == port
    assert held.stat().st_mtime > old
