"""A site's existing customers: its accounts (ARR, renewal, tier, usage metrics) and its
historical deals, as account managers import them and as the account reports read them.

One place for every way in: `concierge accounts import|list|pull` (cli/accounts.py), the
operator API (services/gateway/routes/accounts.py) and a site's pull connector (`[accounts]
pull_url` in its config: an HTTP endpoint of its CRM or warehouse answering the same JSON).

    accounts  <site>.account.<id>   an account (`Account`, JSON)
              <site>.deal.<id>      a historical deal (`Deal`, JSON)
              <site>.pulled         when the pull connector last fetched (`Pulled`): its cache

Every key starts with the site, so one site's records are read under `$KV.accounts.<site>.>`
and no other's. An import is an upsert: a record whose id is in the file replaces the stored
one when it differs, and nothing else changes (a record left out of the file stays). Ids
derive from what they name when the file gives none (an account's from its domain or
name, a deal's from its account, date, outcome and value), so importing the same file
again changes nothing. An import that changed something is audited as `AccountsImported`
in the site's log (`conv.<site>._accounts.accounts_imported`): who, from where, how many
records were added, changed and unchanged.

File formats (docs/operations.md, "Accounts"): JSON `{"accounts": [...], "deals": [...]}`
(or a list of accounts), an account's `usage` either a list of `{metric, current, limit,
unit}` or a mapping `metric → {current, limit, unit}` or `metric → number`; CSV, one file
of accounts (columns `name`, `arr`, ... and `usage:<metric>`, `usage:<metric>:limit`,
`usage:<metric>:unit`) or of deals (a column `outcome`).
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import io
import json
import re
import time
from typing import Any, Iterable, Literal, NoReturn
from urllib.parse import urlsplit

import msgspec

from shared import events as ev
from shared import subjects
from shared.bus import Bus

MAX_ACCOUNTS = 5000  # an import's accounts at most (and deals)
# A site's accounts (and deals) stored at most, all imports and pulls together: an import that
# would take it past is refused whole (422 naming the cap), nothing stored.
MAX_SITE_RECORDS = 10_000
MAX_METRICS = 50  # an account's usage metrics at most
MAX_TEXT = 200  # a name, domain, tier, owner, industry, metric or unit
MAX_NOTES = 4000  # an account's notes, a deal's summary and its lessons
MAX_IMPORT_BYTES = 8 * 1024 * 1024
USER_AGENT = "ConciergeAccounts/1.0 (account pull connector)"
ACCOUNTS_SESSION = "_accounts"  # the site's log of imports (a name no widget session has)
OUTCOMES = ("won", "lost", "churned", "expanded")
ACCOUNT_COLUMNS = ("id", "name", "domain", "tier", "arr", "currency", "renewal_date", "owner", "industry",
                   "employees", "notes")
DEAL_COLUMNS = ("id", "account", "tier", "outcome", "value", "currency", "date", "summary", "lessons")
RESERVED_IDS = frozenset({"opportunities", "paste", "import", "pull", "reports"})  # accounts/<these> are paths
USAGE_COLUMN = re.compile(r"^usage:([^:]+?)(?::(limit|unit))?\Z")
_SLUG = re.compile(r"[^a-z0-9]+")
# The ids of the paste-your-data demo's accounts (services/gateway/account_paste.py): no import gives
# one, so a pasted account never takes a real one's place.
PASTED_PREFIX = "pasted-"


# The records themselves are part of the event contract (a report's gathered inputs hold
# them): shared/events.py.
Metric, Account, Deal = ev.Metric, ev.Account, ev.Deal


class Portfolio(msgspec.Struct, kw_only=True):
    accounts: list[Account] = []
    deals: list[Deal] = []


class Pulled(msgspec.Struct, kw_only=True):
    """The pull connector's last fetch: when, from where, and how it went ("" ok)."""

    at: float
    url: str
    error: str = ""


class AccountsError(ValueError):
    """Account data refused: `errors` is [{"field", "message"}], one per problem, the field
    as `accounts[3].usage[0].current` (JSON) or `line 4: arr` (CSV)."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


# --- reading a file ---------------------------------------------------------------------------


def parse(data: bytes, kind: str = "") -> Portfolio:
    """Accounts and deals from a file's bytes: `kind` "json" or "csv" (""; JSON when the text
    starts with `{` or `[`). Raises AccountsError naming every problem."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AccountsError([{"field": "file", "message": f"not UTF-8 text (byte {exc.start})"}]) from None
    if len(data) > MAX_IMPORT_BYTES:
        raise AccountsError([{"field": "file", "message": f"larger than {MAX_IMPORT_BYTES} bytes"}])
    kind = kind or ("json" if text.lstrip()[:1] in ("{", "[") else "csv")
    return from_data(_json(text)) if kind == "json" else from_csv(text)


def _json(text: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AccountsError([{"field": f"line {exc.lineno}", "message": f"not valid JSON: {exc.msg}"}]) from None
    except RecursionError:
        raise AccountsError([{"field": "file", "message": "nested too deeply"}]) from None
    try:  # a "\ud800" escape decodes to a lone surrogate: no text an event can carry
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise AccountsError([{"field": "file", "message": "a string holds a lone surrogate (\\ud800-\\udfff): "
                                                          "not valid Unicode text"}]) from None
    return data


def from_data(data: Any) -> Portfolio:
    """A portfolio from plain data (a JSON file, an API body, a pull's answer)."""
    if isinstance(data, list):
        data = {"accounts": data}
    if not isinstance(data, dict):
        raise AccountsError([{"field": "file", "message": "an object {\"accounts\": [...], \"deals\": [...]} "
                                                          "or a list of accounts"}])
    errors: list[dict[str, str]] = []
    if unknown := sorted(set(data) - {"accounts", "deals"}):
        errors.append({"field": unknown[0], "message": "unknown key: give `accounts` and `deals`"})
    rows: dict[str, list] = {}
    for name in ("accounts", "deals"):
        value = data.get(name, [])
        if not isinstance(value, list):
            errors.append({"field": name, "message": "must be a list"})
            value = []
        elif len(value) > MAX_ACCOUNTS:
            errors.append({"field": name, "message": f"at most {MAX_ACCOUNTS}"})
            value = []
        rows[name] = value
    accounts = [a for i, raw in enumerate(rows["accounts"])
                if (a := _record(Account, _account_data(raw), f"accounts[{i}]", errors)) is not None]
    deals = [d for i, raw in enumerate(rows["deals"]) if (d := _record(Deal, raw, f"deals[{i}]", errors)) is not None]
    try:
        return _checked(Portfolio(accounts=accounts, deals=deals), errors)
    except AccountsError as exc:
        raise AccountsError([_by_metric_name(e, rows["accounts"]) for e in exc.errors]) from None


_USAGE_AT = re.compile(r"^accounts\[(\d+)\]\.usage\[(\d+)\]")


def _by_metric_name(error: dict[str, str], raw_accounts: list) -> dict[str, str]:
    """A problem of a metric given in the mapping form, named as it was given:
    `accounts[0].usage.seats.limit`, not the index it got in the list."""
    match = _USAGE_AT.match(error["field"] or "")
    if match is None:
        return error
    raw = raw_accounts[int(match.group(1))]
    usage = raw.get("usage") if isinstance(raw, dict) else None
    if not isinstance(usage, dict) or int(match.group(2)) >= len(usage):
        return error
    name = list(usage)[int(match.group(2))]
    return {**error, "field": f"accounts[{match.group(1)}].usage.{name}" + error["field"][match.end():]}


def _account_data(raw: Any) -> Any:
    """An account's fields with its `usage` as a list of metrics, whichever form it came in;
    its id derived when it has none."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    usage = out.get("usage")
    if isinstance(usage, dict):
        out["usage"] = [{"metric": name, **value} if isinstance(value, dict) else {"metric": name, "current": value}
                        for name, value in usage.items()]
    if not out.get("id") and isinstance(out.get("name"), str):
        out["id"] = account_id(out["name"], out.get("domain") if isinstance(out.get("domain"), str) else "")
    return out


def _record(cls: type, raw: Any, where: str, errors: list[dict[str, str]]) -> Any:
    if cls is Deal and isinstance(raw, dict) and not raw.get("id"):
        raw = {**raw, "id": deal_id(raw)}
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        errors.append(_type_error(exc, where))
        return None


_AT = re.compile(r" - at `\$\.?([^`]*)`\Z")
_NAMED = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def _type_error(exc: msgspec.ValidationError, where: str) -> dict[str, str]:
    """msgspec's "Expected `float`, got `str` - at `$.usage[0].current`" as a field and a message."""
    text = str(exc)
    at = _AT.search(text)
    path = at.group(1) if at else ""
    message = text[:at.start()] if at else text
    named = _NAMED.search(message)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return {"field": field_at(where, path), "message": message}


def field_at(where: str, path: str) -> str:
    """A record's field as a problem names it: `accounts[3].arr` (JSON), `line 4: arr` (CSV)."""
    if where.startswith("line "):
        return f"{where}: {path or 'row'}"
    return where if not path else f"{where}{path}" if path.startswith("[") else f"{where}.{path}"


def from_csv(text: str) -> Portfolio:
    """A CSV file of accounts, or of deals (it has an `outcome` column): numbers and dates in
    their cells, usage metrics in columns `usage:<metric>` (current), `usage:<metric>:limit`
    and `usage:<metric>:unit`. Problems name the line and the column."""
    reader = csv.DictReader(io.StringIO(text), strict=True)
    try:
        header = [h.strip() for h in reader.fieldnames or []]
    except csv.Error as exc:
        raise AccountsError([{"field": "line 1", "message": f"not valid CSV: {exc}"}]) from None
    if not header:
        raise AccountsError([{"field": "line 1", "message": "no header line (the columns' names)"}])
    reader.fieldnames = header
    deals = "outcome" in header
    known = DEAL_COLUMNS if deals else ACCOUNT_COLUMNS
    errors = [{"field": f"line 1: {h}", "message": f"unknown column (known: {', '.join(known)}"
                                                  f"{'' if deals else ', usage:<metric>[:limit|:unit]'})"}
              for h in header if h not in known and (deals or not USAGE_COLUMN.match(h))]
    if len(set(header)) != len(header):
        errors.append({"field": "line 1", "message": "a column is named twice"})
    if errors:
        raise AccountsError(errors)
    found: list[tuple[Any, str]] = []
    try:
        for row_ in reader:
            where = f"line {reader.line_num}"
            if len(found) >= MAX_ACCOUNTS:
                errors.append({"field": where, "message": f"at most {MAX_ACCOUNTS} rows"})
                break
            if None in row_:
                errors.append({"field": where, "message": "more cells than columns"})
                continue
            cells = {k: (v or "").strip() for k, v in row_.items()}
            if not any(cells.values()):
                continue
            raw = _deal_cells(cells, where, errors) if deals else _account_cells(cells, where, errors)
            record = _record(Deal if deals else Account, raw if deals else _account_data(raw), where, errors)
            if record is not None:
                found.append((record, where))
    except csv.Error as exc:
        errors.append({"field": f"line {reader.line_num}", "message": f"not valid CSV: {exc}"})
    records = [r for r, _ in found]
    portfolio = Portfolio(deals=records) if deals else Portfolio(accounts=records)
    return _checked(portfolio, errors, [w for _, w in found])


def _number(cells: dict[str, str], column: str, where: str, errors: list, integer: bool = False
            ) -> float | int | None:
    value = cells.get(column, "").replace(",", "").replace("_", "")
    if not value:
        return None
    try:
        return int(value) if integer else float(value)
    except ValueError:
        errors.append({"field": f"{where}: {column}", "message": f"{cells[column]!r} is not a "
                                                                 f"{'whole number' if integer else 'number'}"})
        return None


def _account_cells(cells: dict[str, str], where: str, errors: list) -> dict:
    """An account's fields from its row (a cell that is no number: its problem noted, left out)."""
    raw: dict[str, Any] = {k: cells[k] for k in ACCOUNT_COLUMNS if cells.get(k)}
    for column, integer in (("arr", False), ("employees", True)):
        if column in raw:
            raw[column] = _number(cells, column, where, errors, integer)
            if raw[column] is None:
                del raw[column]
    usage: dict[str, dict[str, Any]] = {}
    for column, value in cells.items():
        match = USAGE_COLUMN.match(column)
        if not match or not value:
            continue
        name, part = match.group(1).strip(), match.group(2) or "current"
        entry = usage.setdefault(name, {})
        entry[part] = value if part == "unit" else _number(cells, column, where, errors)
    for name, entry in usage.items():
        if "current" not in entry:
            errors.append({"field": f"{where}: usage:{name}", "message": "a metric's limit or unit without "
                                                                            "its current value"})
    raw["usage"] = {name: entry for name, entry in usage.items() if entry.get("current") is not None}
    return raw


def _deal_cells(cells: dict[str, str], where: str, errors: list) -> dict:
    raw: dict[str, Any] = {k: cells[k] for k in DEAL_COLUMNS if cells.get(k)}
    if "value" in raw:
        raw["value"] = _number(cells, "value", where, errors)
    return {k: v for k, v in raw.items() if v is not None}


def _checked(portfolio: Portfolio, errors: list[dict[str, str]], wheres: list[str] | None = None) -> Portfolio:
    """The portfolio, or AccountsError with every problem of its types (`errors`) and values;
    `wheres`: each record's place in a CSV file (its line), else its place in the lists."""
    for name, records, check in (("accounts", portfolio.accounts, account_problems),
                                 ("deals", portfolio.deals, deal_problems)):
        seen: dict[str, str] = {}
        for i, record in enumerate(records):
            where = wheres[i] if wheres else f"{name}[{i}]"
            errors.extend(check(record, where))
            if record.id in seen:
                errors.append({"field": field_at(where, "id"), "message": f"{record.id!r} is also the id of "
                                                                          f"{seen[record.id]} (give each its own)"})
            seen.setdefault(record.id, where)
    if errors:
        raise AccountsError(errors)
    return portfolio


def _text(value: str, limit: int = MAX_TEXT) -> bool:
    return len(value) <= limit and "\x00" not in value


def _date(value: str) -> bool:
    try:
        datetime.date.fromisoformat(value)
        return len(value) == 10
    except ValueError:
        return False


def account_problems(account: Account, where: str) -> list[dict[str, str]]:
    out = []

    def bad(field: str, message: str) -> None:
        out.append({"field": field_at(where, field), "message": message})

    if not subjects.TOKEN_RE.match(account.id):
        bad("id", "letters, digits, '-' or '_' (1-64)")
    elif account.id.startswith(PASTED_PREFIX):
        bad("id", f"ids starting with {PASTED_PREFIX!r} are reserved for the paste-your-data demo: give another")
    elif account.id in RESERVED_IDS:
        bad("id", f"{account.id!r} names an operator API path (accounts/{account.id}): give another")
    if not account.name.strip() or not _text(account.name):
        bad("name", f"1 to {MAX_TEXT} characters")
    for key in ("domain", "tier", "owner", "industry"):
        if not _text(getattr(account, key)):
            bad(key, f"at most {MAX_TEXT} characters")
    if not 0 <= account.arr < 1e12:
        bad("arr", "a yearly amount, 0 or more")
    if not re.fullmatch(r"[A-Z]{3}", account.currency):
        bad("currency", "a three-letter currency code such as USD or EUR")
    if account.renewal_date and not _date(account.renewal_date):
        bad("renewal_date", f"{account.renewal_date!r} is not a date YYYY-MM-DD")
    if account.employees is not None and not 0 <= account.employees < 10_000_000:
        bad("employees", "a head count, 0 or more")
    if not _text(account.notes, MAX_NOTES):
        bad("notes", f"at most {MAX_NOTES} characters")
    if len(account.usage) > MAX_METRICS:
        bad("usage", f"at most {MAX_METRICS} metrics")
    names: set[str] = set()
    for i, metric in enumerate(account.usage):
        if not metric.metric.strip() or not _text(metric.metric) or not _text(metric.unit):
            bad(f"usage[{i}].metric", f"a metric's name (and unit) of 1 to {MAX_TEXT} characters")
        elif metric.metric in names:
            bad(f"usage[{i}].metric", f"{metric.metric!r} is named twice")
        names.add(metric.metric)
        for key in ("current", "limit"):
            value = getattr(metric, key)
            if value is not None and not -1e15 < value < 1e15:
                bad(f"usage[{i}].{key}", "a finite number")
    return out


def deal_problems(deal: Deal, where: str) -> list[dict[str, str]]:
    out = []

    def bad(field: str, message: str) -> None:
        out.append({"field": field_at(where, field), "message": message})

    if not subjects.TOKEN_RE.match(deal.id):
        bad("id", "letters, digits, '-' or '_' (1-64)")
    if not deal.account.strip() or not _text(deal.account):
        bad("account", f"the customer's name, 1 to {MAX_TEXT} characters")
    if not _text(deal.tier):
        bad("tier", f"at most {MAX_TEXT} characters")
    if not 0 <= deal.value < 1e12:
        bad("value", "an amount, 0 or more")
    if not re.fullmatch(r"[A-Z]{3}", deal.currency):
        bad("currency", "a three-letter currency code such as USD or EUR")
    if deal.date and not _date(deal.date):
        bad("date", f"{deal.date!r} is not a date YYYY-MM-DD")
    for key in ("summary", "lessons"):
        if not _text(getattr(deal, key), MAX_NOTES):
            bad(key, f"at most {MAX_NOTES} characters")
    return out


def account_id(name: str, domain: str = "") -> str:
    """An account's id from its domain (else its name): `acme-com`, the same in every import;
    never one with the paste demo's reserved prefix (`Pasted Media` → `a-pasted-media`)."""
    slug = _SLUG.sub("-", (domain or name).lower()).strip("-")
    if slug.startswith(PASTED_PREFIX) or slug in RESERVED_IDS:
        slug = "a-" + slug
    slug = slug[:64].strip("-")
    return slug or "a-" + hashlib.blake2b(name.encode(), digest_size=6).hexdigest()


def deal_id(raw: dict) -> str:
    """A deal's id from its account, date, outcome and value."""
    value = raw.get("value", 0)
    try:
        value = f"{float(value):g}"  # 100, 100.0 and "100" are one value
    except (TypeError, ValueError):
        pass
    key = "|".join(str(part) for part in (raw.get("account", ""), raw.get("date", ""), raw.get("outcome", ""), value))
    return "d-" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


# --- the store --------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_decoders = {"account": msgspec.json.Decoder(Account), "deal": msgspec.json.Decoder(Deal)}
_pulled = msgspec.json.Decoder(Pulled)


def key(site: str, kind: Literal["account", "deal"], record_id: str) -> str:
    return f"{site}.{kind}.{record_id}"


async def store(bus: Bus, site: str, portfolio: Portfolio, actor: str, source: str) -> ev.AccountsImported | None:
    """Store the portfolio's records that are new or differ, and audit the import in the
    site's log; None when nothing changed (no event either: the same file again is a no-op)."""
    kv = bus.bucket(subjects.ACCOUNTS_BUCKET)
    await _room_for(bus, site, portfolio)
    counts = {name: {"account": 0, "deal": 0} for name in ("added", "changed", "unchanged")}
    written = hashlib.blake2b(digest_size=16)
    for kind, records in (("account", portfolio.accounts), ("deal", portfolio.deals)):
        for record in records:
            name, data = key(site, kind, record.id), _encoder.encode(record)
            stored = await _get(kv, name)
            if stored == data:
                counts["unchanged"][kind] += 1
                continue
            await kv.put(name, data)
            counts["changed" if stored else "added"][kind] += 1
            written.update(name.encode() + b"\0" + data + b"\0")
    if not counts["added"]["account"] + counts["added"]["deal"] + counts["changed"]["account"] + counts["changed"]["deal"]:
        return None
    plural = {k: {f"{kind}s": n for kind, n in v.items()} for k, v in counts.items()}
    event = ev.AccountsImported(event_id=ev.derived_id(f"{site}/{written.hexdigest()}", "accounts", actor), site=site,
                                session_id=ACCOUNTS_SESSION, turn=0, ts=ev.now(), producer="accounts", actor=actor,
                                source=source, **plural)
    await bus.publish(event)
    return event


async def stored_keys(bus: Bus, site: str, kind: Literal["account", "deal"]) -> set[str]:
    """The keys of the site's records of `kind`, as the stream counts its subjects: nothing read."""
    prefix = f"$KV.{subjects.ACCOUNTS_BUCKET}."
    info = await bus.js.stream_info(f"KV_{subjects.ACCOUNTS_BUCKET}", subjects_filter=prefix + key(site, kind, ">"))
    return {subject[len(prefix):] for subject in info.state.subjects or {}}


async def _room_for(bus: Bus, site: str, portfolio: Portfolio) -> None:
    errors = []
    for kind, records in (("account", portfolio.accounts), ("deal", portfolio.deals)):
        if not records:
            continue
        stored = await stored_keys(bus, site, kind)
        have, new = len(stored), len({key(site, kind, r.id) for r in records} - stored)
        if have + new > MAX_SITE_RECORDS:
            errors.append({"field": f"{kind}s", "message": f"the site has {have} {kind}s; {new} more would pass "
                                                            f"its {MAX_SITE_RECORDS}"})
    if errors:
        raise AccountsError(errors)


def counts_of(portfolio: Portfolio, event: ev.AccountsImported | None) -> dict[str, dict[str, int]]:
    """An import's counts: the event's, or all unchanged when there was none."""
    if event is not None:
        return {"added": event.added, "changed": event.changed, "unchanged": event.unchanged}
    zero = {"accounts": 0, "deals": 0}
    return {"added": zero, "changed": dict(zero),
            "unchanged": {"accounts": len(portfolio.accounts), "deals": len(portfolio.deals)}}


async def _get(kv, name: str) -> bytes | None:
    from nats.js.errors import KeyNotFoundError, NotFoundError

    try:
        entry = await kv.get(name)
    except (KeyNotFoundError, NotFoundError):
        return None
    return entry.value or None


async def _read(bus: Bus, site: str, kind: str) -> list:
    out = []
    async for _seq, _subject, data in bus.read_raw(f"$KV.{subjects.ACCOUNTS_BUCKET}.{site}.{kind}.>",
                                                   stream=f"KV_{subjects.ACCOUNTS_BUCKET}"):
        if data:
            out.append(_decoders[kind].decode(data))
    return out


async def accounts(bus: Bus, site: str) -> list[Account]:
    """The site's accounts, by name."""
    return sorted(await _read(bus, site, "account"), key=lambda a: (a.name.casefold(), a.id))


async def deals(bus: Bus, site: str) -> list[Deal]:
    """The site's deals, newest first."""
    return sorted(await _read(bus, site, "deal"), key=lambda d: (d.date, d.id), reverse=True)


async def account(bus: Bus, site: str, account_id_: str) -> Account | None:
    data = await _get(bus.bucket(subjects.ACCOUNTS_BUCKET), key(site, "account", account_id_))
    return _decoders["account"].decode(data) if data else None


async def imports(bus: Bus, site: str) -> list[ev.AccountsImported]:
    """The site's audited imports, oldest first."""
    return [r.event for r in await bus.read(subjects.conv(site, ACCOUNTS_SESSION, "accounts_imported"))]


def row(account_: Account) -> dict[str, Any]:
    """One account as a line of a list."""
    return {"id": account_.id, "name": account_.name, "tier": account_.tier, "arr": account_.arr,
            "currency": account_.currency, "renewal_date": account_.renewal_date, "owner": account_.owner,
            "industry": account_.industry, "metrics": len(account_.usage),
            "near_limit": [m.metric for m in account_.usage if m.limit and m.current >= 0.9 * m.limit]}


def as_data(records: Iterable[msgspec.Struct]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(r) for r in records]


# --- the pull connector's cache ------------------------------------------------------------------


async def last_pull(bus: Bus, site: str) -> Pulled | None:
    data = await _get(bus.bucket(subjects.ACCOUNTS_BUCKET), f"{site}.pulled")
    return _pulled.decode(data) if data else None


async def note_pull(bus: Bus, site: str, pulled: Pulled) -> None:
    await bus.bucket(subjects.ACCOUNTS_BUCKET).put(f"{site}.pulled", _encoder.encode(pulled))


def due(last: Pulled | None, url: str, ttl_s: float, now: float | None = None) -> bool:
    """Whether a site's pull is to be made again: never made, made from another URL, or
    older than its TTL."""
    now = time.time() if now is None else now
    return last is None or last.url != url or now - last.at >= ttl_s


class PullError(Exception):
    """The site's pull connector could not bring its accounts: refused address, no answer,
    a status other than 200, or data that does not validate (`errors`, as an import's)."""

    def __init__(self, message: str, errors: list[dict[str, str]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class PullResult(msgspec.Struct, kw_only=True):
    """What `pull` did: fetched now (`fetched`) or served from the cache (the last fetch,
    `at`, younger than the TTL), and the import's counts when it fetched."""

    fetched: bool
    at: float
    url: str
    error: str = ""
    counts: dict[str, dict[str, int]] | None = None


async def pull(bus: Bus, site: str, config, client, keys: dict[str, str], force: bool = False,
               now: float | None = None) -> PullResult | None:
    """Bring the site's accounts from its pull connector (`config`: its `[accounts]`) unless
    the last fetch is younger than `pull_ttl_s` (`force`: fetch all the same). `client` is a
    shared/web.py WebClient: an address the deployment may not fetch from is refused there
    (OUTBOUND_ALLOW_PRIVATE_NETWORKS). `keys`: the ACCOUNTS_KEY_* variables the process keeps.
    None when the site has no connector. A failed fetch is noted too (so replicas do not ask
    again and again within the TTL) and raised as PullError; what was stored stays."""
    from shared.web import FetchError, RefusedAddress

    if not config.pull_url:
        return None
    now = time.time() if now is None else now
    last = await last_pull(bus, site)
    if not force and not due(last, config.pull_url, config.pull_ttl_s, now):
        return PullResult(fetched=False, at=last.at, url=last.url, error=last.error)
    headers = {"Accept": "application/json"}
    if config.pull_key_env:
        # The variable's value is `<site id>:<key>`: a key serves only the site it names, so a
        # config naming another site's variable (with a URL of its choosing) gets no key.
        bound, _, key_ = keys.get(config.pull_key_env, "").partition(":")
        if bound != site or not key_.strip():
            return await _pull_failed(bus, site, config.pull_url, now,
                                      "no key for this site in the variable accounts.pull_key_env names "
                                      "(its value: <site id>:<key>)")
        headers["Authorization"] = f"Bearer {key_.strip()}"
    try:
        response = await client.get(config.pull_url, headers=headers)
    except (RefusedAddress, FetchError) as exc:
        return await _pull_failed(bus, site, config.pull_url, now, str(exc))
    if response.status != 200:
        return await _pull_failed(bus, site, config.pull_url, now, f"{config.pull_url} answered {response.status}")
    if response.truncated:
        return await _pull_failed(bus, site, config.pull_url, now, f"{config.pull_url}: larger than {MAX_IMPORT_BYTES} bytes")
    try:
        portfolio = parse(response.body, "json")
    except AccountsError as exc:
        await note_pull(bus, site, Pulled(at=now, url=config.pull_url, error=f"invalid data: {exc}"[:1000]))
        raise PullError(f"{config.pull_url} answered data that does not validate", exc.errors) from None
    try:
        event = await store(bus, site, portfolio, f"pull:{urlsplit(config.pull_url).hostname or ''}", "pull")
    except AccountsError as exc:  # past the site's cap: noted like any failed pull, not asked again within the TTL
        await note_pull(bus, site, Pulled(at=now, url=config.pull_url, error=str(exc)[:1000]))
        raise PullError(f"{config.pull_url} answered more records than the site may hold", exc.errors) from None
    await note_pull(bus, site, Pulled(at=now, url=config.pull_url))
    return PullResult(fetched=True, at=now, url=config.pull_url, counts=counts_of(portfolio, event))


async def _pull_failed(bus: Bus, site: str, url: str, now: float, why: str) -> NoReturn:
    await note_pull(bus, site, Pulled(at=now, url=url, error=why[:1000]))
    raise PullError(why)
