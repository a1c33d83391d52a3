"""Every request Concierge makes to an address an operator's input chose (a knowledge
source's pages and robots.txt: the retriever's sources; a site's account pull connector:
shared/accounts.py; a site's lead and handoff webhooks: services/responder/webhooks.py),
without becoming a way into the network Concierge runs in.

One guard, `Outbound`: loopback, private, link-local, shared (CGNAT), multicast, reserved and
unspecified addresses are refused unless OUTBOUND_ALLOW_PRIVATE_NETWORKS=1 (tests, sites on an
internal network) or the address (and port) is listed in OUTBOUND_ALLOWED
(`10.1.2.3:8080,192.168.0.0/24`: an internal webhook relay, say). It is applied where the
connection is made, to the address the socket connects to, so however the host was spelled
(Unicode digits `①②⑦.0.0.1`, full-width dots `127。0。0。1`, `0x7f.1`, a name that resolves,
or re-resolves, to 10.0.0.5) the check sees what the HTTP client saw: names through
`GuardedResolver`, and every socket, IP literals included (aiohttp never resolves those),
through the connector's socket factory. A URL is also looked at before the request, its host
normalised as the client (yarl: IDNA/UTS-46) will, for an early, clear refusal. Redirects are
followed here, one hop at a time, each hop through the same connector (at most MAX_REDIRECTS).

A refusal names the address and the rule, never a body. A response's body is streamed up to
`max_bytes` (after Content-Encoding is undone, so a gzip bomb stops there too); a bigger one is
cut there and marked `truncated`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from shared.config import Settings, env_bool, env_str, invalid

MAX_REDIRECTS = 5
NO_PUBLIC_ADDRESS = ("no public address (the name does not resolve, or only to addresses this deployment does not "
                     "fetch from: OUTBOUND_ALLOWED)")
HOW_TO_ALLOW = "OUTBOUND_ALLOW_PRIVATE_NETWORKS=1 or OUTBOUND_ALLOWED allows it"
# Not globally routable, though this Python's is_private/is_global miss them: shared (CGNAT,
# RFC 6598), IETF protocol assignments (192.0.0.0/24), IPv6 site-local and documentation.
NOT_PUBLIC = {"shared (CGNAT)": ipaddress.ip_network("100.64.0.0/10"),
              "reserved": ipaddress.ip_network("192.0.0.0/24"),
              "site-local": ipaddress.ip_network("fec0::/10"),
              "documentation": ipaddress.ip_network("3fff::/20")}
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # an IPv4 address in its last 32 bits


def origin(url: str) -> str:
    """`scheme://host[:port]` of a URL, in lower case: what a page's origin is compared by."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), "", "", ""))


class RefusedAddress(OSError):
    """The URL leads to an address this deployment may not fetch from. An OSError, as the
    connect it stops: aiohttp reports it as the connection's failure."""


class FetchError(Exception):
    """The URL could not be fetched (connection, timeout, too many redirects)."""


class CannotConnect(FetchError):
    """No connection was made: nothing was sent (a request that failed later may have been
    received)."""


def refused(address: str) -> str | None:
    """Why `address` (an IP literal) may not be fetched from (None: it may)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            ip = embedded
        elif ip in NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    for what, bad in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local), ("private", ip.is_private),
                      ("multicast", ip.is_multicast), ("reserved", ip.is_reserved),
                      ("unspecified", ip.is_unspecified),
                      *((name, ip.version == net.version and ip in net) for name, net in NOT_PUBLIC.items())):
        if bad:
            return f"{address} is a {what} address"
    if not ip.is_global:
        return f"{address} is not globally routable"
    return None


class Outbound(Settings):
    """Which addresses outbound requests may reach besides public ones: all of them
    (`allow_private`), or those listed in `allowed` (an address, `address:port`, `[v6]:port`
    or a network in CIDR form)."""

    allow_private: bool = False
    allowed: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> "Outbound":
        if os.environ.get("CRAWL_ALLOW_PRIVATE_NETWORKS"):  # its name until every fetch shared the guard
            invalid("CRAWL_ALLOW_PRIVATE_NETWORKS is now OUTBOUND_ALLOW_PRIVATE_NETWORKS (crawler, account pulls "
                    "and webhooks alike), or name the addresses in OUTBOUND_ALLOWED", None)
        listed = tuple(p.strip() for p in env_str("OUTBOUND_ALLOWED", "").split(",") if p.strip())
        outbound = cls(allow_private=env_bool("OUTBOUND_ALLOW_PRIVATE_NETWORKS", False), allowed=listed)
        try:
            outbound._rules()  # a wrong entry stops the process at start, naming it
        except ValueError as exc:
            return invalid(f"OUTBOUND_ALLOWED: {exc}", cls(allow_private=outbound.allow_private))
        return outbound

    def _rules(self) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]]:
        rules = []
        for entry in self.allowed:
            host, port = entry, None
            if entry.startswith("["):
                host, _, rest = entry[1:].partition("]")
                if rest and not rest.startswith(":"):
                    raise ValueError(f"{entry!r}: only `:port` may follow `[address]`")
                port = rest[1:] or None
            elif entry.count(":") == 1:
                host, _, port = entry.partition(":")
            if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
                raise ValueError(f"{entry!r}: the port must be 1 to 65535")
            try:
                rules.append((ipaddress.ip_network(host, strict=False), None if port is None else int(port)))
            except ValueError:
                raise ValueError(f"{entry!r} is not an address, address:port, [v6]:port or network") from None
        return rules

    def why_refused(self, address: str, port: int | None = None) -> str | None:
        """Why a connection to `address` (an IP literal) on `port` is refused (None: it may go)."""
        if self.allow_private:
            return None
        reason = refused(address)
        if reason is None:
            return None
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        for network, allowed_port in self._rules():
            if ip.version == network.version and ip in network and allowed_port in (None, port):
                return None
        return f"{reason} ({HOW_TO_ALLOW})"


class GuardedResolver(AbstractResolver):
    """The system resolver, keeping only addresses that may be fetched from."""

    def __init__(self, outbound: Outbound):
        self._inner = ThreadedResolver()
        self._outbound = outbound

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        try:
            found = await self._inner.resolve(host, port, family)
        except OSError:
            found = []
        allowed = [r for r in found if self._outbound.why_refused(r["host"], port) is None]
        if not allowed:
            # One answer whether the name does not resolve or resolves inside: a tenant learns
            # neither which internal names exist nor the addresses behind them.
            raise RefusedAddress(f"{host}: {NO_PUBLIC_ADDRESS}")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket(outbound: Outbound):
    """The connector's socket factory: the last word on every connection, IP literals too."""

    def make(addr_info) -> socket.socket:
        family, type_, proto, _, address = addr_info
        if outbound.why_refused(address[0], address[1]):
            raise RefusedAddress(NO_PUBLIC_ADDRESS)
        return socket.socket(family=family, type=type_, proto=proto)

    return make


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
    outbound: Outbound = field(default_factory=Outbound)
    timeout_s: float = 15.0
    max_bytes: int = 5 * 1024 * 1024
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            guarded = not self.outbound.allow_private
            connector = aiohttp.TCPConnector(resolver=GuardedResolver(self.outbound) if guarded else None,
                                             socket_factory=guarded_socket(self.outbound) if guarded else None,
                                             limit=32, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": self.user_agent},
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  auto_decompress=True)
        return self._session

    def check(self, url: str) -> None:
        """Refuse what no request may go to: not http(s), credentials in it, or a host that
        is (once normalised as the client will) a literal address not allowed."""
        try:
            parsed = yarl.URL(url)
            host = parsed.host
        except (ValueError, UnicodeError):
            raise RefusedAddress(f"{url[:200]}: not a valid URL") from None
        if parsed.scheme not in ("http", "https") or not host:
            raise RefusedAddress(f"{url[:200]}: only http and https URLs are fetched")
        if parsed.user or parsed.password:
            raise RefusedAddress(f"{url[:200]}: no user name or password in the URL")
        try:
            reason = self.outbound.why_refused(host.strip("[]"), parsed.port)
        except ValueError:
            return  # a name: checked where it resolves (GuardedResolver) and where it connects
        if reason:
            raise RefusedAddress(f"{url[:200]}: {reason}")

    async def get(self, url: str, headers: dict[str, str] | None = None, max_bytes: int | None = None) -> Response:
        """GET `url`, following redirects one checked hop at a time; the body read up to
        `max_bytes` (default the client's)."""
        return await self.request("GET", url, headers=headers, max_bytes=max_bytes)

    async def request(self, method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None,
                      max_bytes: int | None = None, follow: bool = True) -> Response:
        session, limit = self._open(), self.max_bytes if max_bytes is None else max_bytes
        headers = dict(headers or {})
        for _ in range(MAX_REDIRECTS + 1):
            self.check(url)
            try:
                async with session.request(method, yarl.URL(url), headers=headers, data=body,
                                           allow_redirects=False) as resp:
                    if follow and resp.status in (301, 302, 303, 307, 308) and "location" in resp.headers:
                        location = urljoin(url, resp.headers["location"])
                        if yarl.URL(location).origin() != yarl.URL(url).origin():
                            # A key given for one host never goes to another.
                            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                        url = location
                        continue
                    data, truncated = await _read(resp, limit)
                    return Response(url=str(resp.url), status=resp.status,
                                    headers={k.lower(): v for k, v in resp.headers.items()},
                                    body=data, truncated=truncated)
            except RefusedAddress:
                raise
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, RefusedAddress):
                    raise RefusedAddress(f"{url[:200]}: {exc.os_error}") from None
                raise CannotConnect(f"{url[:200]}: cannot connect") from None
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeError) as exc:
                # The kind only: an exception's text may quote what the other side sent (a
                # service's banner in a "bad status line").
                raise FetchError(f"{url[:200]}: {type(exc).__name__}") from None
        raise FetchError(f"{url[:200]}: more than {MAX_REDIRECTS} redirects")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _read(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body, streamed whole up to `limit` bytes (decoded: a Content-Encoding undone);
    (the first `limit` bytes, True) when there is more."""
    body = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False
