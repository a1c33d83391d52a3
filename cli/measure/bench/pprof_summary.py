"""nats-server's CPU profile, read: which functions its samples were in.

nats-server serves Go's CPU profiles (`--profile PORT`, `/debug/pprof/profile?seconds=N`)
as gzipped protocol buffers in pprof's format (github.com/google/pprof, proto/profile.proto).
`concierge bench --profile DIR` collects them during the measured turns and writes what is
here to DIR/nats.txt, as it writes py-spy's samples of the services: Go's own reader
(`go tool pprof`) is not on this machine, and this needs only the few fields below, read
off the protobuf wire format (varints and length-delimited fields):

    Profile  1 sample_type, 2 sample, 4 location, 5 function, 6 string_table
    Sample   1 location_id (packed), 2 value (packed): the last value is CPU nanoseconds
    Location 1 id, 4 line
    Line     1 function_id
    Function 1 id, 2 name (a string_table index)
"""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Iterable, Iterator


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message: an int for varints, bytes for
    length-delimited fields (fixed-width fields are skipped over as bytes)."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _ints(value: int | bytes, wire: int) -> list[int]:
    """A repeated integer field: one varint, or a packed run of them."""
    if wire == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        item, i = _varint(value, i)
        out.append(item)
    return out


def samples(raw: bytes) -> list[tuple[list[str], int]]:
    """Each sample's stack (innermost function first) and its CPU nanoseconds."""
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    found: list[tuple[list[int], int]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    strings: list[str] = []
    for number, wire, value in _fields(data):
        if number == 2:
            ids: list[int] = []
            values: list[int] = []
            for n, w, v in _fields(value):
                if n == 1:
                    ids += _ints(v, w)
                elif n == 2:
                    values += _ints(v, w)
            found.append((ids, values[-1] if values else 0))
        elif number == 4:
            location, lines = 0, []
            for n, w, v in _fields(value):
                if n == 1:
                    location = v
                elif n == 4:
                    lines += [f for m, _, f in _fields(v) if m == 1]
            locations[location] = lines
        elif number == 5:
            function, name = 0, 0
            for n, w, v in _fields(value):
                if n == 1:
                    function = v
                elif n == 2:
                    name = v
            functions[function] = name
        elif number == 6:
            strings.append(value.decode("utf-8", "replace"))

    def name(function: int) -> str:
        index = functions.get(function, 0)
        return strings[index] if index < len(strings) else "?"

    return [([name(f) for location in ids for f in locations.get(location, [])], value) for ids, value in found]


def summary(profiles: Iterable[bytes], top: int = 40) -> str:
    """Self and inclusive shares of the samples of one or more profiles, as text."""
    own: Counter[str] = Counter()
    within: Counter[str] = Counter()
    total = 0
    for raw in profiles:
        for stack, nanoseconds in samples(raw):
            total += nanoseconds
            if stack:
                own[stack[0]] += nanoseconds
            for function in set(stack):
                within[function] += nanoseconds
    lines = [f"CPU sampled: {total / 1e9:.2f} s"]
    for title, counts in (("self", own), ("inclusive", within)):
        lines.append(f"-- {title}")
        lines += [f"{100 * ns / max(total, 1):5.1f}% {function}" for function, ns in counts.most_common(top)]
    return "\n".join(lines) + "\n"
