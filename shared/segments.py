"""Who the answer is for: the site's audience segments (`[[segments]]` in its config) matched
against the visitor's profile, so an answer can give the example of the visitor's industry,
offer the plan for the company's size and link the right booking page.

A segment names the sectors it is for (matched, case-insensitively, against the profile's
sector and sub-sector) and/or a range of employees (`employees = "51-200"`, `"1000+"`,
matched against the profile's `company_size`); a segment naming neither matches no one.
The words it adds are the site owner's own (`example`, `offer`, `cta_label` / `cta_url`,
`tone`): nothing here is written by a model, so an extractive answer can say them too.

`for_visitor` takes, field by field, the first matching segment that sets it: a site can
keep its industry examples in one segment per sector and its plans in one per size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.company_size import employees
from shared.events import UNKNOWN, VisitorProfile
from shared.site_config import Segment, SiteConfig

def matches(segment: Segment, profile: VisitorProfile) -> bool:
    """The segment names the profile's sector (or sub-sector) when it names sectors, and holds
    its company's size when it names employees; a segment naming neither matches no one."""
    if not segment.sectors and not segment.employees:
        return False
    if segment.sectors:
        known = {v.casefold() for v in (profile.sector, profile.sub_sector) if v and v != UNKNOWN}
        if not known & {s.casefold() for s in segment.sectors}:
            return False
    if segment.employees:
        wanted, size = employees(segment.employees), employees(profile.company_size)
        if wanted is None or size is None:
            return False
        # The company's range within the segment's (its low end when the provider's bands
        # are wider than the site's).
        if not wanted[0] <= size[0] <= wanted[1]:
            return False
    return True


@dataclass(frozen=True)
class ForVisitor:
    """What the visitor's segments add to an answer; empty strings: nothing."""

    segments: tuple[str, ...] = ()  # the names of the matching segments, in config order
    example: str = ""
    offer: str = ""
    cta_label: str = ""
    cta_url: str = ""
    tone: str = ""
    sources: dict[str, str] = field(default_factory=dict)  # field → the segment it came from

    def cta(self, config: SiteConfig) -> tuple[str, str]:
        """(label, url) of the call to action: the segment's when it has a link, else the site's."""
        if self.cta_url:
            return self.cta_label or config.cta.label, self.cta_url
        return config.cta.label, config.cta.booking_url or config.cta.url


FIELDS = ("example", "offer", "cta_label", "cta_url", "tone")


def for_visitor(config: SiteConfig, profile: VisitorProfile) -> ForVisitor:
    """Field by field, the first matching segment that sets it (a label travels with its link)."""
    matching = [s for s in config.segments if matches(s, profile)]
    chosen: dict[str, str] = {}
    sources: dict[str, str] = {}
    for segment in matching:
        for name in FIELDS:
            if name == "cta_label":
                continue
            value = getattr(segment, name)
            if value and name not in chosen:
                chosen[name], sources[name] = value, segment.name
                if name == "cta_url":
                    chosen["cta_label"], sources["cta_label"] = segment.cta_label, segment.name
    return ForVisitor(segments=tuple(s.name for s in matching), sources=sources, **chosen)


def said_before(text: str, earlier: list[str]) -> bool:
    """Whether an earlier assistant message already holds `text` (an example or an offer is
    said once per conversation, not at every answer)."""
    return bool(text) and any(text in message for message in earlier)
