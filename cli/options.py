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


def record_id(value: str) -> str:
    """An argparse type: an account's or a report's id (a subject token), else exit status 2."""
    if not subjects.TOKEN_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r}: not an id ([A-Za-z0-9_-], ≤ 64 chars)")
    return value


def text(value: str) -> str:
    """An argparse type: text an event can carry (a shell may pass bytes that are no UTF-8)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("not valid UTF-8 text") from None
    return value


def seconds(value: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not a number of seconds") from None
    if not 0 <= number < 86400:
        raise argparse.ArgumentTypeError(f"{value!r}: 0 to 86400 seconds")
    return number


def add_bus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", default=None, help="default: $NATS_URL or nats://127.0.0.1:4222")


def bus_config(args: argparse.Namespace) -> BusConfig:
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    return config
