"""When a site's team takes handoffs: its `[handoff] hours` in its `timezone`.

`hours` is "always" or a list of entries, each days then a time range:
`"mon-fri 09:00-17:30"`, `"sat 10:00-13:00"`, `"mon,wed 14:00-18:00"`. Days are
mon tue wed thu fri sat sun (a range wraps: `fri-mon`); times are 24-hour `HH:MM`, the end
after the start (`24:00` is the end of the day). An instant is open when it falls in any
entry on its local day; daylight saving is the timezone's (zoneinfo). Pure: the handoff
handler asks about the turn's own time, so a replay decides as the original turn did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALWAYS = "always"
_ENTRY_RE = re.compile(r"^\s*([a-z,\-]+)\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*\Z")


class HoursError(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    days: frozenset[int]  # 0 = Monday
    start: int  # minutes after midnight
    end: int


@dataclass(frozen=True)
class Schedule:
    windows: tuple[Window, ...] | None  # None: always open
    zone: ZoneInfo

    def open_at(self, ts: float) -> bool:
        if self.windows is None:
            return True
        local = datetime.fromtimestamp(ts, self.zone)
        minute = local.hour * 60 + local.minute
        return any(local.weekday() in w.days and w.start <= minute < w.end for w in self.windows)


def _days(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise HoursError(f"unknown day in {text!r}: days are {', '.join(DAYS)}")
        a, b = DAYS.index(first), DAYS.index(last or first)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(out)


def _minutes(hours: str, minutes: str) -> int:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and m):
        raise HoursError(f"{hours}:{minutes} is not a time of day (00:00-24:00)")
    return h * 60 + m


def window(entry: str) -> Window:
    match = _ENTRY_RE.match(entry.lower())
    if not match:
        raise HoursError(f"{entry!r} is not 'DAYS HH:MM-HH:MM' (e.g. 'mon-fri 09:00-17:30')")
    days, start, end = match.group(1), _minutes(*match.group(2, 3)), _minutes(*match.group(4, 5))
    if end <= start:
        raise HoursError(f"{entry!r}: the end must be after the start (a night shift: two entries)")
    return Window(_days(days), start, end)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "Europe" is a directory, a name too long
        raise HoursError(f"{name!r} is not a time zone (an IANA name such as Europe/Paris or UTC)") from None


def schedule(hours: str | list[str], timezone: str = "UTC") -> Schedule:
    """The schedule `hours` describes, or `HoursError` saying what is wrong."""
    if isinstance(hours, str):
        if hours != ALWAYS:
            raise HoursError(f"hours is {ALWAYS!r} or a list such as [\"mon-fri 09:00-17:30\"]")
        return Schedule(None, zone(timezone))
    if not hours:
        raise HoursError(f"an empty list never opens: write {ALWAYS!r} for any hour")
    return Schedule(tuple(window(entry) for entry in hours), zone(timezone))


def describe(hours: str | list[str], timezone: str) -> str:
    """The hours as the visitor is told them: "mon-fri 09:00-17:30 (Europe/Paris)"."""
    if isinstance(hours, str):
        return hours
    return f"{', '.join(' '.join(entry.split()) for entry in hours)} ({timezone})"
