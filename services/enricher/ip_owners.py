"""The keyless IP source: which organisation's network announces the visitor's address, from
the routing table the `whereip-network` wheel ships (RIPE RIS routes, the RIRs' delegations,
CAIDA and PeeringDB, built by its author; version pinned in pyproject.toml, its age and
terms in docs/operations.md). It names the network's owner, not necessarily the visitor's
company, so its profile is "partial" and the chain goes on.

| the address | answer |
|---|---|
| not global: private, loopback, link-local, shared (100.64/10), documentation, reserved | miss, not looked up |
| announced by nobody | miss |
| its network's category is not one of an organisation's own (`OWN_NETWORKS`): an ISP, a mobile carrier, hosting, transit, an exchange, `content` (CDNs, clouds, hosters and platforms alike: Google's 8.8.8.8 and Cloudflare's 1.1.1.1 are there) or none | miss: the address carries or serves other people's traffic |
| an organisation's own, but its company name says carrier or host (`CARRIER_NAME`), or it is a cloud the data files as an enterprise (`CLOUD_ASNS`) | miss |
| otherwise | partial: `company_name` the registered company, `company_domain` its website's domain, `sector` for education, government and non-profits |
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shared.events import VisitorProfile
from services.enricher.sources import Lookup, ip_of

# whereip-network's categories of a network that is an organisation's own, by the sector it says.
OWN_NETWORKS = {"enterprise": None, "education": "Education", "government": "Government", "non-profit": "Non-profit"}

# Networks filed as an organisation's own whose company names a carrier or a host (a small
# ISP or a hoster registered as an "enterprise"). "Network(s)" is left out: Juniper, Arista
# and Palo Alto Networks are companies a B2B site wants to see.
CARRIER_NAME = re.compile(
    r"(?i)hosting|host\b|cloud|servers?\b|data ?cent(er|re)|colocation|\bvps\b|\bvpn\b|\bcdn\b|proxy"
    r"|telecom|telekom|telco\b|broadband|cable|wireless|\bmobile\b|fib(er|re)\b|internet|\bisp\b|\bdsl\b")

# Clouds, CDNs and VPN exits the data files as an enterprise under a name that does not say so.
CLOUD_ASNS = {
    16509,   # Amazon (AWS)
    16625,   # Akamai
    15395,   # Rackspace
    212238,  # Datacamp (CDN77, VPN exits)
}

# Second-level labels under a country code that are not a registrant's (bbc.co.uk, jisc.ac.uk).
SECOND_LEVEL = {"ac", "co", "com", "edu", "go", "gob", "gov", "gouv", "govt", "mil", "ne", "net", "or", "org"}


@dataclass
class IpOwnerSource:
    """The owner of the network announcing an address (module docstring), as a partial profile."""

    table: Any = None  # a whereip_network.Table: the wheel's own when None, mapped once here
    name: str = "ip_owner"

    def __post_init__(self):
        if self.table is None:
            import whereip_network

            self.table = whereip_network.table()

    async def lookup(self, q: Lookup) -> VisitorProfile | None:
        address = ip_of(q)
        return None if address is None else self.owner(address)

    def owner(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> VisitorProfile | None:
        if address.version == 6 and address.ipv4_mapped:
            address = address.ipv4_mapped
        if not address.is_global:
            return None
        # The table keys IPv6 by its routed half (the top 64 bits).
        ipv6 = address.version == 6
        facts = self.table.lookup(int(address) >> 64 if ipv6 else int(address), ipv6)[0]
        return owner_profile(facts, self.name)


def owner_profile(facts: Any, source: str) -> VisitorProfile | None:
    """One network's facts (whereip_network.Facts) → the profile its owner gives, or a miss."""
    if not facts.asn or facts.category not in OWN_NETWORKS or facts.asn in CLOUD_ASNS:
        return None
    company = facts.company or facts.brand
    if not company or CARRIER_NAME.search(company):
        return None
    fields = {"company_name": company[:200]}
    if domain := website_domain(facts.website):
        fields["company_domain"] = domain
    if sector := OWN_NETWORKS[facts.category]:
        fields["sector"] = sector
    return VisitorProfile(**fields, source=source, status="partial")


def website_domain(website: str) -> str | None:
    """The registrable domain of a website's address (`https://www.jisc.ac.uk/janet` → jisc.ac.uk,
    `https://blink.ucsd.edu/…` → ucsd.edu). Only the website: the data's fallback, the abuse
    mailbox's host, is often the network's ISP (att.net, gmail.com), not the company."""
    host = (urlsplit(website if "//" in website else f"//{website}").hostname or "").rstrip(".")
    labels = host.split(".")
    if len(labels) < 2 or not all(labels) or labels[-1].isdigit():
        return None
    keep = 3 if len(labels[-1]) == 2 and labels[-2] in SECOND_LEVEL else 2
    return ".".join(labels[-keep:])[:253]
