"""What the operator commands that talk to the bus share: a site id checked as it is parsed,
and the bus they reach (NATS_URL, or `--nats-url`)."""

from __future__ import annotations

import argparse

from shared import subjects
from shared.config import BusConfig


def site_id(value: str) -> str:
    """An argparse type: a site id (a subject token), else a usage error (exit status 2)."""
    if not subjects.TOKEN_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r}: not a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    return value


def add_bus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", default=None, help="default: $NATS_URL or nats://127.0.0.1:4222")


def bus_config(args: argparse.Namespace) -> BusConfig:
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    return config
