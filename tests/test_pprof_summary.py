"""nats-server's CPU profile as `concierge bench --profile DIR` reads it (cli/measure/bench/pprof_summary.py)."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import tempfile
from pathlib import Path

import nats

from cli.harness.supervisor import free_port, nats_server_binary, wait_port
from cli.measure.bench import NatsProfiler, pprof_summary


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(*values: int) -> bytes:
    return b"".join(_varint(v) for v in values)


def test_a_profile_is_read_into_self_and_inclusive_shares():
    """Two functions: `main` calls `write`; 30 ms of samples in `write`, 10 ms in `main`."""
    strings = [b"", b"cpu", b"nanoseconds", b"main", b"write"]
    profile = b"".join([
        _field(2, _field(1, _packed(2, 1)) + _field(2, _packed(3, 30_000_000))),  # write <- main
        _field(2, _field(1, 1) + _field(2, 1) + _field(2, 10_000_000)),  # unpacked fields, main alone
        _field(4, _field(1, 1) + _field(4, _field(1, 1))),  # location 1: function 1
        _field(4, _field(1, 2) + _field(4, _field(1, 2))),
        _field(5, _field(1, 1) + _field(2, 3)),  # function 1: "main"
        _field(5, _field(1, 2) + _field(2, 4)),
        *[_field(6, s) for s in strings],
    ])
    assert pprof_summary.samples(gzip.compress(profile)) == [(["write", "main"], 30_000_000), (["main"], 10_000_000)]
    text = pprof_summary.summary([gzip.compress(profile), profile])  # two windows add up
    assert text.splitlines()[:4] == ["CPU sampled: 0.08 s", "-- self", " 75.0% write", " 25.0% main"]
    assert "100.0% main" in text and " 75.0% write" in text.split("-- inclusive")[1]


def test_nats_server_profiles_are_collected_and_summed_while_it_works(tmp_path: Path):
    """A real nats-server with its profiling port: windows collected while it stores a burst
    of messages, then read."""
    port, profile_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="concierge-nats-") as store:
        proc = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store,
                                 "--profile", str(profile_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, 20, proc)
            wait_port(profile_port, 20, proc)
            profiler = NatsProfiler(profile_port, tmp_path, window_s=1)
            profiler.start()

            async def burst():
                nc = await nats.connect(f"nats://127.0.0.1:{port}")
                js = nc.jetstream()
                await js.add_stream(name="T", subjects=["t.>"])
                for i in range(3000):
                    await js.publish(f"t.{i % 50}", b"x" * 200)
                await nc.close()

            asyncio.run(burst())
            summary = profiler.stop()
        finally:
            proc.terminate()
            proc.wait(10)
    assert sorted(p.name for p in tmp_path.glob("nats-*.pprof"))[0] == "nats-0.pprof"
    assert (tmp_path / "nats.txt").read_text() == summary
    seconds = float(summary.splitlines()[0].split()[2])
    assert seconds > 0 and "nats-server" in summary
