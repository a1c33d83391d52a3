"""Plain data as TOML text: what `concierge sites export` prints, so that a site edited
through the API can go back into `sites/<site>.toml`. The standard library reads TOML
(tomllib) but does not write it; a site config needs only tables, arrays of tables, strings,
numbers, booleans and arrays, so this is the whole writer. `tomllib.loads(dumps(d)) == d`
for such data (tests/test_sites.py). TOML has no null: a key whose value is None is left
out (for a site config, the same thing: the key's default).
"""

from __future__ import annotations

import math
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")


def dumps(data: dict[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines).strip("\n") + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    table = {k: v for k, v in table.items() if v is not None}
    plain = {k: v for k, v in table.items() if not isinstance(v, dict) and not _is_table_array(v)}
    if path and (plain or not table):
        lines.append(f"\n[{'.'.join(_key(p) for p in path)}]")
    for key, value in plain.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _table(lines, [*path, key], value)
        elif _is_table_array(value):
            for item in value:
                lines.append(f"\n[[{'.'.join(_key(p) for p in [*path, key])}]]")
                for k, v in item.items():
                    if v is not None:
                        lines.append(f"{_key(k)} = {_value(v)}")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key, multiline=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _string(value, multiline="\n" in value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _string(text: str, multiline: bool) -> str:
    """A basic string (multi-line when it has line breaks, for instructions to stay
    readable): backslashes and quotes escaped, so no `\"\"\"` can end it early, and every
    control character TOML forbids as \\uXXXX."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n" and multiline:
            out.append("\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    body = "".join(out)
    # A line break right after the opening quotes is not part of the string.
    return f'"""\n{body}"""' if multiline else f'"{body}"'
