"""What a process the harness started has used, from Linux's /proc: its CPU seconds (user +
system, every thread) and its peak resident memory, which can be reset so each measured
window has its own peak.

A process's own CPU time is the cost figure that holds on a shared machine: other work
slows the process down but does not add to its CPU seconds."""

from __future__ import annotations

import os
import time


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The most resident memory process `pid` has held (since start, or since `reset_peak_rss`), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"/proc/{pid}/status has no VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Start the peak over from the current resident memory (Linux ≥ 4.0: `5` to clear_refs).
    False where the kernel refuses: the peak then stays the peak since start."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def wait_quiet(pid: int, timeout_s: float, busy_fraction: float = 0.05, every_s: float = 0.5) -> bool:
    """Until process `pid` uses less than `busy_fraction` of a core over `every_s` (its backlog
    from an earlier rate worked off), at most `timeout_s`; False when it never went quiet."""
    deadline = time.monotonic() + timeout_s
    before = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = cpu_s(pid)
        if now - before < busy_fraction * every_s:
            return True
        before = now
    return False
