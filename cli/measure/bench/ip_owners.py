"""How fast the keyless IP source answers (services/enricher/ip_owners.py): its start (the
module imported, the wheel's table mapped), then random IPv4 addresses asked twice, cold (each
block of the table decoded on first use) and warm.

    PYTHONPATH=. python -m cli.measure.bench.ip_owners [--count 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import random
import time


async def measure(count: int) -> None:
    started = time.perf_counter()
    from services.enricher.ip_owners import IpOwnerSource
    from services.enricher.sources import Lookup

    source = IpOwnerSource()
    print(f"start: {(time.perf_counter() - started) * 1000:.0f} ms (imports and the table mapped)")
    rng = random.Random(7)
    queries = [Lookup("bench", "s", None, str(ipaddress.IPv4Address(rng.getrandbits(32))), None, None, None)
               for _ in range(count)]
    for label in ("cold", "warm"):
        started = time.perf_counter()
        named = [await source.lookup(q) for q in queries]
        took = time.perf_counter() - started
        print(f"{label}: {count} lookups in {took * 1000:.0f} ms, {took / count * 1e6:.1f} µs each; "
              f"{sum(p is not None for p in named)} named an owner")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    asyncio.run(measure(parser.parse_args().count))


if __name__ == "__main__":
    main()
