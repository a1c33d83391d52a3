"""Fetching what an operator pointed Concierge at (a knowledge source's pages: the
retriever's sources; a site's account pull connector: shared/accounts.py), without becoming
a way into the network Concierge runs in.

Every connection's address is checked where it is made: host names resolve through
`GuardedResolver`, which refuses loopback, private, link-local, multicast, reserved and
unspecified addresses (so a name that resolves, or re-resolves, to 10.0.0.5 or 169.254.169.254
is refused at connect time, not only when first looked at); literal IP hosts are checked
before the request. Redirects are followed here, one hop at a time, each hop checked the
same way (and at most MAX_REDIRECTS). `allow_private` (CRAWL_ALLOW_PRIVATE_NETWORKS=1) turns
the refusal off, for tests and for sites on an internal network.

A response's body is read up to `max_bytes`; a bigger one is cut there and said so.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

MAX_REDIRECTS = 5


class RefusedAddress(Exception):
    """The URL leads to an address this deployment may not fetch from."""


class FetchError(Exception):
    """The URL could not be fetched (connection, timeout, too many redirects)."""


def refused(address: str) -> str | None:
    """Why `address` may not be fetched from (None: it may)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    for what, bad in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local), ("private", ip.is_private),
                      ("multicast", ip.is_multicast), ("reserved", ip.is_reserved),
                      ("unspecified", ip.is_unspecified), ("not globally routable", not ip.is_global)):
        if bad:
            return f"{address} is a {what} address" if what != "not globally routable" else f"{address} is {what}"
    return None


class GuardedResolver(AbstractResolver):
    """The system resolver, keeping only addresses that may be fetched from."""

    def __init__(self):
        self._inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if refused(r["host"]) is None]
        if not allowed:
            reason = refused(found[0]["host"]) if found else "no address"
            raise RefusedAddress(f"{host}: {reason} (set CRAWL_ALLOW_PRIVATE_NETWORKS=1 to allow)")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


@dataclass
class Response:
    url: str  # after redirects
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    def text(self) -> str:
        charset = "utf-8"
        for part in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset" and value:
                charset = value.strip('"')
        try:
            return self.body.decode(charset, errors="replace")
        except LookupError:
            return self.body.decode("utf-8", errors="replace")


@dataclass
class WebClient:
    user_agent: str
    allow_private: bool = False
    timeout_s: float = 15.0
    max_bytes: int = 5 * 1024 * 1024
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=None if self.allow_private else GuardedResolver(),
                                             limit=32, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": self.user_agent},
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  auto_decompress=True)
        return self._session

    def check(self, url: str) -> None:
        """Refuse what no request may go to: not http(s), or a literal address not allowed."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RefusedAddress(f"{url}: only http and https URLs are fetched")
        if self.allow_private:
            return
        try:
            reason = refused(parts.hostname)
        except ValueError:
            return  # a name: checked where it resolves (GuardedResolver)
        if reason:
            raise RefusedAddress(f"{url}: {reason} (set CRAWL_ALLOW_PRIVATE_NETWORKS=1 to allow)")

    async def get(self, url: str, headers: dict[str, str] | None = None) -> Response:
        session = self._open()
        for _ in range(MAX_REDIRECTS + 1):
            self.check(url)
            try:
                async with session.get(url, headers=headers or {}, allow_redirects=False) as resp:
                    if resp.status in (301, 302, 303, 307, 308) and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    body = await resp.content.read(self.max_bytes + 1)
                    return Response(url=str(resp.url), status=resp.status,
                                    headers={k.lower(): v for k, v in resp.headers.items()},
                                    body=body[:self.max_bytes], truncated=len(body) > self.max_bytes)
            except RefusedAddress:
                raise
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, RefusedAddress):
                    raise exc.os_error from None
                raise FetchError(f"{url}: {exc}") from None
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise FetchError(f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        raise FetchError(f"{url}: more than {MAX_REDIRECTS} redirects")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
