"""One account from what an account manager pastes into the "paste your data" demo (issue 44):
an account as JSON, or the free text of an e-mail or a CRM note, read by the regex rules below.
No model is used: a free text the rules cannot read is refused (AccountsError, a 4xx at the
edge) naming what is missing, with a line they do read. A model-backed extraction is not part
of this step.

JSON (`kind` "json"; "" sniffs it: the first non-space character is `{` or `[`): one account
object as shared/accounts.py imports it (its `usage` a list of `{metric, current, limit,
unit}`, or a mapping `metric → {current, limit, unit}` or `metric → number`), or
`{"accounts": [one]}` (or `[one]`). Validation is shared/accounts.py's; an `id` given is
replaced (below).

Free text (`kind` "text"), e.g.

    Acme Field Services
    Tier: Growth
    ARR: $48,000
    Renewal: 2027-02-15
    Technician seats: 45 of 50
    Work orders: 8,200 / 10,000 per month
    Industry: HVAC

or "Northwind Plumbing is on the Starter plan, $12k ARR, renews on 15 March 2027. They use 19
of 20 technician seats and 300 of 5,000 SMS credits. 35 employees, owner Dana Lee."

A "label: value" line is a line whose label (up to four words) is followed by a colon. A
labelled field wins over the same field found in prose; the first labelled line of a field is
read; lines and phrases the rules do not know are left aside.

    name          an `Account:`, `Company:`, `Customer:` or `Name:` line; else the first line,
                  when it is no label line, at most eight words, holds no figure, is no
                  greeting ending in a comma ("Hi Sam,") and no "X is on / is a / has"
                  sentence; else the words before " is on ", " is a(n) " or " has " in the
                  first sentence of the first line that is no label line nor the greeting
                  ("Northwind Plumbing is on ..." → Northwind Plumbing)
    tier          `Tier:` or `Plan:`; else "<Word> plan|tier" (the Starter plan → Starter)
    arr, currency `ARR:`, "ARR of|is|at <amount>" or "<amount> ARR"; the currency from $ (read
                  as USD), € (EUR), £ (GBP) or a three-letter code in capitals beside the
                  amount (48,000 EUR); an ARR with no currency is refused
    renewal_date  `Renewal:`, `Renewal date:`, `Renews:`, or "renews (on) / renewal (date)"
                  followed by 2027-02-15, 15 March 2027, 15th of March 2027, March 15, 2027
                  (English month names or their three-letter forms), or 15/03/2027, 15.03.2027
                  and 03/15/2027 when only one reading is a date; 03/04/2027 (3 April or 4
                  March) and two-digit years are refused. Only these forms: no date library
                  guessing a missing year or the order of 03/04
    usage         a line `<metric>: N of M` or `<metric>: N / M` [a unit word] [per <period>],
                  nothing after but punctuation (Work orders: 8,200 / 10,000 per month;
                  Storage: 40 / 100 GB); in prose (any other line) "N of M <words>" or
                  "N / M <words>", up to four words, stopping at a small word such as "and"
                  (19 of 20 technician seats). The metric is the words in snake case
                  (technician_seats), its unit the words after M, else the metric's last word,
                  with " per <period>" (seats; orders per month). A metric stated twice alike
                  is one; under one name with two figures it is refused
    employees     `Employees:` or `Headcount:`; else "N employees|staff"
    owner         `Owner:`, `Account owner:` or `Account manager:`; else "owner|account
                  owner|account manager|managed by <Capitalised Name>"
    industry      `Industry:` or `Sector:`; else "in the <words> industry|sector"
    domain        `Domain:` or `Website:`; else the one bare domain in the text (acme.example,
                  www.acme.example, https://acme.example/...); not an e-mail's, not a file
                  name's (deck.pdf), none when two differ

Numbers take thousands commas (8,200), decimals with a dot and k/m suffixes (12k, 1.5m); a
dotted group of three (48.000) is refused as ambiguous. Every figure of the account is one
the text states; a field the text does not give keeps the Account's empty default (arr 0,
no renewal date, no employees). A text with no name, or with no figure at all (no ARR,
usage or employees), is refused. At most 20,000 characters either way.

The id is `pasted-` and the first 12 hex characters of the blake2b of the account's canonical
JSON without its id: the same paste gives the same id, and shared/accounts.py refuses the
prefix in an import, so a pasted account never takes a real one's place.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import msgspec

from shared import accounts
from shared import events as ev

PASTED_PREFIX = accounts.PASTED_PREFIX
MAX_CHARS = 20_000
MAX_FIGURE = 1e15  # larger is no account's figure (and past float's range, no number at all)
EXAMPLE = "Acme Field Services / ARR: $48,000 / Technician seats: 45 of 50"

# The labels of a "label: value" line, casefolded, and the field each one gives.
LABELS = {
    **dict.fromkeys(("account", "company", "customer", "name"), "name"),
    **dict.fromkeys(("tier", "plan"), "tier"),
    "arr": "arr",
    **dict.fromkeys(("renewal", "renewal date", "renews", "renews on"), "renewal_date"),
    **dict.fromkeys(("employees", "headcount"), "employees"),
    **dict.fromkeys(("owner", "account owner", "account manager"), "owner"),
    **dict.fromkeys(("industry", "sector"), "industry"),
    **dict.fromkeys(("domain", "website"), "domain"),
}
MONTHS = {name: number for number, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
    ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"),
    ("november", "nov"), ("december", "dec")), 1) for name in names}
SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP"}
NOT_CURRENCIES = {"ARR", "MRR", "ACV", "TCV", "NRR", "GRR"}  # three capitals beside an ARR that name no currency
FILE_ENDINGS = {"pdf", "doc", "docx", "xls", "xlsx", "csv", "txt", "png", "jpg", "jpeg", "gif", "ppt", "pptx",
                "zip", "json", "html", "htm"}
NOT_TIERS = {"the", "their", "this", "that", "a", "an", "our", "your", "its", "his", "her", "they", "we",
             "current", "same", "new", "next", "old", "which", "what", "no", "any"}
# Words that end a metric's words in prose: "19 of 20 technician seats and 300 of ...".
STOP_WORDS = ("and", "or", "but", "per", "in", "on", "at", "for", "of", "to", "the", "a", "an", "this", "that",
              "they", "we", "used", "left", "so", "with", "from", "by", "as", "while", "which", "last", "next")


def _num(group: str) -> str:
    """A number (48,000; 8200; 1.5) and its k/m suffix, as groups `group` and `group_k`."""
    return (rf"(?P<{group}>(?<![\w.,])(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?![.,]?\d))"
            rf"(?P<{group}_k>[kKmM]\b)?")


_WORD = rf"(?!(?:{'|'.join(STOP_WORDS)})\b)[A-Za-z][A-Za-z-]*"
_PAIR = rf"{_num('current')}\s*(?:of|out of|/)\s*{_num('limit')}(?!\s*/)"
_PER = r"(?:\s+per\s+(?P<per>[A-Za-z]+))?"
LABEL_LINE = re.compile(r"^(?P<label>[A-Za-z][\w&/().'-]*(?:[ \t]+[\w&/().'-]+){0,3})[ \t]*:[ \t]*(?P<value>.*)$")
# "<metric>: N of M [unit] [per <period>]", nothing after but punctuation: "Usage: 19 of 20
# seats and 300 of 5,000 SMS credits" is prose, each metric named by its own words.
LABELLED_USAGE = re.compile(rf"^{_PAIR}(?:\s+(?P<unit>{_WORD}))?{_PER}\s*(?:[.,;(]|$)", re.IGNORECASE)
PROSE_USAGE = re.compile(rf"(?<![/\d]){_PAIR}\s+(?P<words>{_WORD}(?:\s+{_WORD}){{0,3}}){_PER}", re.IGNORECASE)
# The codes in capitals, case-sensitive: "ARR for 48k" names no currency "FOR".
AMOUNT = (rf"(?:(?P<symbol>[$€£])\s?|(?P<before>[A-Z]{{3}})\s)?{_num('amount')}(?!\s?%)"
          rf"(?:\s(?P<after>[A-Z]{{3}})\b)?")
AMOUNT_ONLY = re.compile(AMOUNT)
ARR_THEN_AMOUNT = re.compile(rf"\b(?i:arr)\b[\s:=~–-]*(?:(?i:of|is|at|about|around)\s+)?{AMOUNT}")
AMOUNT_THEN_ARR = re.compile(rf"{AMOUNT}\s+(?:in\s+)?(?i:arr)\b")
DATE = re.compile(r"""
    (?P<iy>\d{4})-(?P<im>\d{1,2})-(?P<id>\d{1,2})\b
  | (?P<d1>\d{1,2})(?:st|nd|rd|th)?\.?\s+(?:of\s+)?(?P<m1>[A-Za-z]{3,9})\.?,?\s+(?P<y1>\d{4})\b
  | (?P<m2>[A-Za-z]{3,9})\.?\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<y2>\d{4})\b
  | (?P<a>\d{1,4})(?P<sep>[./-])(?P<b>\d{1,2})(?P=sep)(?P<c>\d{1,4})\b
""", re.VERBOSE)
RENEWAL = re.compile(r"\b(?:renewal(?:\s+date)?|renews|renewing)\b(?:\s*:|\s+(?:is|on|in|date))*\s*", re.IGNORECASE)
TIER = re.compile(r"\b(?P<tier>[A-Z][\w+-]*)\s+(?i:plan|tier)\b")
EMPLOYEES = re.compile(rf"{_num('count')}\s+(?:employees|staff)\b", re.IGNORECASE)
OWNER = re.compile(r"\b(?i:account\s+owner|account\s+manager|owner|managed\s+by)(?:\s+is)?[\s:,-]+"
                   r"(?P<owner>[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’-]*){0,3})")
INDUSTRY = re.compile(r"\bin\s+the\s+(?P<industry>[A-Za-z][\w&/-]*(?:\s+[A-Za-z][\w&/-]*){0,2}?)\s+"
                      r"(?:industry|sector)\b", re.IGNORECASE)
DOMAIN = re.compile(r"(?<![@\w.-])(?:https?://)?(?:www\.)?"
                    r"(?P<domain>(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,24})(?![\w@-]|\.\w)", re.IGNORECASE)
SENTENCE_NAME = re.compile(r"^(?P<name>[^.!?\n]+?)\s+(?:is\s+on|is\s+an?|has)\s", re.IGNORECASE)
FIGURES = (PROSE_USAGE, ARR_THEN_AMOUNT, AMOUNT_THEN_ARR, EMPLOYEES)
FIGURE_FIELDS = {"arr", "currency", "usage", "employees"}


def parse(data: bytes, kind: str = "") -> ev.Account:
    """The account in a paste: `kind` "json" or "text" ("": JSON when the first non-space
    character is `{` or `[`). Raises accounts.AccountsError naming every problem."""
    text = _decoded(data)
    sniffed = not kind
    kind = kind or ("json" if text.lstrip()[:1] in ("{", "[") else "text")
    if kind == "json":
        account = _from_json(text, sniffed)
    elif kind == "text":
        account = _validated(read_text(text), relative=True)
    else:
        raise accounts.AccountsError([{"field": "kind", "message": f"{kind!r}: give \"json\" or \"text\""}])
    return msgspec.structs.replace(account, id=pasted_id(account))


def pasted_id(account: ev.Account) -> str:
    """`pasted-` and 12 hex characters of the account's canonical JSON without its id."""
    body = msgspec.to_builtins(account)
    body.pop("id")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return PASTED_PREFIX + hashlib.blake2b(canonical).hexdigest()[:12]


def _decoded(data: bytes) -> str:
    if len(data) > 4 * MAX_CHARS:  # no UTF-8 text this long is MAX_CHARS characters
        raise accounts.AccountsError([{"field": "text", "message": f"longer than {MAX_CHARS:,} characters"}])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise accounts.AccountsError([{"field": "text", "message": f"not UTF-8 text (byte {exc.start})"}]) from None
    if len(text) > MAX_CHARS:
        raise accounts.AccountsError([{"field": "text", "message": f"longer than {MAX_CHARS:,} characters "
                                                                   f"({len(text):,}): paste one account"}])
    if not text.strip():
        raise accounts.AccountsError([{"field": "text", "message": f"empty: paste an account, e.g. {EXAMPLE}"}])
    return text


# --- JSON ------------------------------------------------------------------------------------------


def _from_json(text: str, sniffed: bool) -> ev.Account:
    try:
        data = accounts._json(text)
    except accounts.AccountsError as exc:
        hint = " (a free text that starts with { or [: send it as kind \"text\")" if sniffed else ""
        raise accounts.AccountsError([{**e, "message": e["message"] + hint} for e in exc.errors]) from None
    if isinstance(data, list):
        data = {"accounts": data}
    if not isinstance(data, dict):
        raise accounts.AccountsError([{"field": "json", "message": "an account object, or {\"accounts\": [one]}"}])
    if "accounts" not in data:
        return _validated(_without_id(data), relative=True)
    listed = data["accounts"]
    errors = []
    if not isinstance(listed, list) or len(listed) != 1:
        found = f"{len(listed)} accounts" if isinstance(listed, list) else "no list"
        errors.append({"field": "accounts", "message": f"a paste is one account ({found}): give a list of one"})
    if data.get("deals"):
        errors.append({"field": "deals", "message": "a paste is one account: leave its deals out"})
    if errors:
        raise accounts.AccountsError(errors)
    return _validated(_without_id(listed[0]), relative=False, rest={k: v for k, v in data.items() if k != "accounts"})


def _without_id(raw: Any) -> Any:
    """The account without the id it was given: a paste's id is always its own (`pasted_id`)."""
    return {k: v for k, v in raw.items() if k != "id"} if isinstance(raw, dict) else raw


def _validated(raw: Any, relative: bool, rest: dict | None = None) -> ev.Account:
    """The account as shared/accounts.py validates an import of it; `relative`: its problems
    named from the account (`usage.seats.limit`), not from an import's list."""
    try:
        return accounts.from_data({**(rest or {}), "accounts": [raw]}).accounts[0]
    except accounts.AccountsError as exc:
        if not relative:
            raise
        raise accounts.AccountsError([{**e, "field": _from_account(e["field"])} for e in exc.errors]) from None


def _from_account(field: str) -> str:
    if field == "accounts[0]":
        return "account"
    return field.removeprefix("accounts[0].")


# --- free text -------------------------------------------------------------------------------------


class _Unreadable(ValueError):
    """A value the rules found but cannot read: its field, and a message saying how to write it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


@contextmanager
def _noted(errors: list[dict[str, str]]):
    """A value the rules cannot read is a problem noted, and the reading goes on."""
    try:
        yield
    except _Unreadable as exc:
        errors.append({"field": exc.field, "message": exc.message})


def read_text(text: str) -> dict[str, Any]:
    """An account's fields (shared/accounts.py's import form) read from a free text by the
    rules of the module's docstring. Raises AccountsError: no name, no figure, or a value found
    that the rules cannot read."""
    lines = [line.strip() for line in text.replace("\u00a0", " ").splitlines() if line.strip()]
    errors: list[dict[str, str]] = []
    raw: dict[str, Any] = {}
    usage: list[dict[str, Any]] = []
    prose: list[str] = []  # the lines no known label or labelled metric took
    for line in lines:
        labelled = LABEL_LINE.match(line)
        field = LABELS.get(" ".join(labelled["label"].split()).casefold()) if labelled else None
        if field:
            if labelled["value"] and field not in raw:
                with _noted(errors):
                    _read_label(field, labelled["label"], labelled["value"], raw)
        elif labelled and (pair := LABELLED_USAGE.match(labelled["value"])):
            with _noted(errors):
                _add_metric(usage, _metric(pair, labelled["label"], pair["unit"] or ""))
        else:
            prose.append(line)
    _read_prose("\n".join(prose), raw, usage, errors)
    if "name" not in raw and (name := _name(lines)):
        raw["name"] = name
    if usage:
        raw["usage"] = usage
    if "name" not in raw:
        errors.append({"field": "name", "message": "no account name found: put it on the first line "
                                                   "(Acme Field Services) or write 'Account: Acme Field Services'"})
    if not FIGURE_FIELDS & raw.keys() and not any(e["field"] in FIGURE_FIELDS for e in errors):
        errors.append({"field": "figures", "message": "no figure found (ARR, usage or employees): e.g. "
                                                      "'ARR: $48,000', 'Technician seats: 45 of 50' or "
                                                      "'19 of 20 technician seats'"})
    if errors:
        raise accounts.AccountsError(errors)
    return raw


def _read_label(field: str, label: str, value: str, raw: dict[str, Any]) -> None:
    """A known label's value into `raw`; _Unreadable when it is not what the field takes."""
    if field == "arr":
        if not (found := AMOUNT_ONLY.match(value)):
            raise _Unreadable("arr", f"{label}: {value!r} is not an amount the rules read: write "
                                     "$48,000, €12k or 48,000 EUR")
        raw["arr"], raw["currency"] = _amount(found)
    elif field == "renewal_date":
        raw["renewal_date"] = _date(re.sub(r"^(?:on|in)\s+", "", value, flags=re.IGNORECASE), label)
    elif field == "employees":
        if not (found := re.match(_num("count"), value)):
            raise _Unreadable("employees", f"{label}: {value!r} is not a head count: write e.g. 35")
        raw["employees"] = _whole(found, "count", "employees")
    elif field == "domain":
        if not (found := DOMAIN.search(value)):
            raise _Unreadable("domain", f"{label}: {value!r} is not a domain: write e.g. acme.example")
        raw["domain"] = found["domain"].lower()
    else:
        raw[field] = value


def _read_prose(body: str, raw: dict[str, Any], usage: list[dict[str, Any]], errors: list) -> None:
    """The fields no label gave, from the sentences of `body`."""
    tiers = (m["tier"] for m in TIER.finditer(body) if m["tier"].casefold() not in NOT_TIERS)
    if "tier" not in raw and (tier := next(tiers, None)):
        raw["tier"] = tier
    if "arr" not in raw:
        found = [m for m in (ARR_THEN_AMOUNT.search(body), AMOUNT_THEN_ARR.search(body)) if m]
        with _noted(errors):
            if found:
                raw["arr"], raw["currency"] = _amount(min(found, key=lambda m: m.start()))
    if "renewal_date" not in raw:
        keyword = next((k for k in RENEWAL.finditer(body) if DATE.match(body, k.end())), None)
        with _noted(errors):
            if keyword:
                raw["renewal_date"] = _date(body[keyword.end():], "renews")
    if "employees" not in raw and (count := EMPLOYEES.search(body)):
        with _noted(errors):
            raw["employees"] = _whole(count, "count", "employees")
    if "owner" not in raw and (owner := OWNER.search(body)):
        raw["owner"] = owner["owner"]
    if "industry" not in raw and (industry := INDUSTRY.search(body)):
        raw["industry"] = industry["industry"]
    if "domain" not in raw:
        domains = {d["domain"].lower() for d in DOMAIN.finditer(body)
                   if d["domain"].rsplit(".", 1)[1].lower() not in FILE_ENDINGS}
        if len(domains) == 1:
            raw["domain"] = domains.pop()
    for pair in PROSE_USAGE.finditer(body):
        with _noted(errors):
            _add_metric(usage, _metric(pair, pair["words"], ""))


def _name(lines: list[str]) -> str:
    """The account's name when no label gives it: the first line when it reads as a name,
    else the subject of the first sentence of the first line that is no label line."""
    # A name is a few words: the sentence rule reads the start of a line only (a long line
    # of spaces would otherwise cost the pattern quadratic time).
    first = lines[0][:accounts.MAX_TEXT]
    if (not LABEL_LINE.match(first) and not SENTENCE_NAME.match(first) and len(first.split()) <= 8
            and not first.endswith(",") and not any(p.search(first) for p in FIGURES)):
        return first
    greeting = first.endswith(",")
    line = next((line for line in lines[greeting:] if not LABEL_LINE.match(line)), "")
    sentence = SENTENCE_NAME.match(re.split(r"(?<=[.!?])\s", line[:accounts.MAX_TEXT], maxsplit=1)[0])
    return sentence["name"].strip() if sentence and len(sentence["name"].split()) <= 8 else ""


def _metric(pair: re.Match, name: str, unit: str) -> dict[str, Any]:
    """A usage metric from "N of M": named by `name` in snake case, its unit the one given,
    else the name's last word, and its period."""
    unit = unit or name.split()[-1].lower()
    if pair["per"]:
        unit += f" per {pair['per']}"
    return {"metric": re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"),
            "current": _value(pair, "current", "usage"), "limit": _value(pair, "limit", "usage"), "unit": unit}


def _add_metric(usage: list[dict[str, Any]], metric: dict[str, Any]) -> None:
    """A metric once, however often the text states it the same way (a different figure under
    the same name stays: the import's check refuses the name given twice)."""
    if metric not in usage:
        usage.append(metric)


def _value(found: re.Match, group: str, field: str) -> float:
    """A number as written: thousands commas, a dot for decimals, a k or m suffix."""
    written = found[group]
    if re.fullmatch(r"\d{1,3}\.\d{3}", written) and not found[f"{group}_k"]:
        raise _Unreadable(field, f"{written!r} is ambiguous (a thousands dot or decimals?): write "
                                 f"{written.replace('.', ',')} or {written.rstrip('0').rstrip('.')}")
    suffix = (found[f"{group}_k"] or "").lower()
    value = float(Decimal(written.replace(",", "")) * {"": 1, "k": 1000, "m": 1_000_000}[suffix])
    if not math.isfinite(value) or value > MAX_FIGURE:
        raise _Unreadable(field, f"{written[:20]}… is not a figure an account has (at most {MAX_FIGURE:.0e})")
    return value


def _whole(found: re.Match, group: str, field: str) -> int:
    value = _value(found, group, field)
    if value != int(value):
        raise _Unreadable(field, f"{found[0]!r} is not a whole number")
    return int(value)


def _amount(found: re.Match) -> tuple[float, str]:
    """An ARR and its currency: from its symbol, else a three-letter code beside it."""
    codes = [c for c in (found["before"], found["after"]) if c and c not in NOT_CURRENCIES]
    currency = SYMBOLS.get(found["symbol"] or "") or (codes[0] if codes else "")
    if not currency:
        raise _Unreadable("currency", f"ARR {found[0].strip()}: which currency? write $48,000, €48,000, "
                                      "£48,000 or 48,000 EUR")
    return _value(found, "amount", "arr"), currency


def _date(text: str, label: str) -> str:
    """The date at the start of `text` as YYYY-MM-DD; _Unreadable when there is none, it is no
    calendar date, or it reads as two different dates."""
    found = DATE.match(text)
    if not found:
        raise _Unreadable("renewal_date", f"{label}: {text.strip()[:40]!r} is not a date the rules read: "
                                          "write 2027-02-15 or 15 February 2027")
    written = found[0]
    if found["iy"]:
        year, month, day = int(found["iy"]), int(found["im"]), int(found["id"])
    elif found["m1"] or found["m2"]:
        month_name = (found["m1"] or found["m2"]).lower()
        if month_name not in MONTHS:
            raise _Unreadable("renewal_date", f"{written!r}: {month_name!r} is not a month (English names)")
        year, month, day = int(found["y1"] or found["y2"]), MONTHS[month_name], int(found["d1"] or found["d2"])
    else:
        year, month, day = _numeric_date(found, written)
    try:
        return datetime.date(year, month, day).isoformat()
    except ValueError:
        raise _Unreadable("renewal_date", f"{written!r} is not a calendar date") from None


def _numeric_date(found: re.Match, written: str) -> tuple[int, int, int]:
    """2027/02/15; else day and month in either order when only one order is a date."""
    a, b, c = found["a"], int(found["b"]), found["c"]
    if len(a) == 4:
        return int(a), b, int(c)
    if len(c) != 4:
        raise _Unreadable("renewal_date", f"{written!r}: write the year in full (2027-02-15 or 15 February 2027)")
    first = int(a)
    if first != b and first <= 12 and b <= 12:
        raise _Unreadable("renewal_date", f"{written!r} could be {first} {_month(b)} or {b} {_month(first)}: "
                                          f"write it as {c}-MM-DD or with the month's name")
    day, month = (b, first) if b > 12 else (first, b)
    return int(c), month, day


def _month(number: int) -> str:
    return next(name for name, n in MONTHS.items() if n == number).capitalize()
