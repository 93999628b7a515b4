"""The collectives a compiled step runs, read from XLA's HLO text: per kind, how many run per
step and the bytes they produce per chip, loop bodies multiplied by their trip counts.

Separate from aot.py, which compiles the steps and prices them: this is plain text parsing of
HLO (no JAX), tested on hand-written HLO snippets in tests/jobs/test_aot.py.
"""

from __future__ import annotations

import collections
import math
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def _computations(hlo: str):
    """{computation: [instruction lines]} and the ENTRY computation's name."""
    comps, entry, name = {}, None, None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(2)
            comps[name] = []
            entry = name if head.group(1) else entry
        elif name is not None and line.strip() and line.strip() != "}":
            comps[name].append(line)
    return comps, entry


def _condition_trips(lines) -> int | None:
    """Trips of a while loop whose condition is `counter < N` (or <=) on a constant N, the form
    lax.scan and fori_loop compile to (counter from 0 by 1); None for any other condition."""
    consts = dict(re.findall(r"%?([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", " ".join(lines)))
    for line in lines:
        m = re.search(r"ROOT .* compare\(%?[\w.\-]+, %?([\w.\-]+)\), direction=(LT|LE)", line)
        if m and m.group(1) in consts:
            return int(consts[m.group(1)]) + (m.group(2) == "LE")
    return None


def _multipliers(comps, entry):
    """How many times each computation runs per step: while bodies by their trip count (XLA's
    known_trip_count, else read from the loop's condition; 1 when neither says)."""
    calls = collections.defaultdict(list)
    for name, lines in comps.items():
        for line in lines:
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            cond = re.search(r"condition=%?([\w.\-]+)", line)
            n = (int(trips.group(1)) if trips
                 else cond and _condition_trips(comps.get(cond.group(1), ())) or 1)
            for kind, callee in re.findall(r"(body|condition|calls|to_apply|branch_computations)"
                                           r"=\{?%?([\w.\-]+)", line):
                calls[name].append((callee, n if kind == "body" else 1))
    times = collections.Counter()

    def visit(name, n):
        times[name] += n
        for callee, k in calls.get(name, ()):
            visit(callee, n * k)
    visit(entry, 1)
    return times


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def _shape_bytes(text: str) -> int:
    return sum(_DTYPE_BYTES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text))


def collectives(hlo: str) -> dict[str, dict[str, float]]:
    """Per collective kind: how many run per step and the bytes they produce per chip. Async
    pairs count once (at -start; the produced buffer is the last element of its tuple).
    libtpu writes a reduce-scatter as an `all-reduce-scatter` fusion (pad -> all-reduce ->
    this chip's dynamic-slice): its all-reduce counts as the reduce-scatter it is, by the
    fusion's result (the shard)."""
    comps, entry = _computations(hlo)
    times = _multipliers(comps, entry)
    out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for name, lines in comps.items():
        for line in lines:
            m = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = (.+?) (" + "|".join(COLLECTIVES)
                         + r")(-start)?\(", line)
            if not m or times[name] == 0:
                continue
            kind, shape = m.group(2), m.group(1)
            if m.group(3):  # (operands..., outputs...): take the output half
                parts = re.findall(r"[a-z]+\d*\[[\d,]*\]", shape)
                shape = " ".join(parts[len(parts) // 2:])
            if kind == "all-reduce" and name.startswith("all-reduce-scatter"):
                root = next((x for x in lines if x.lstrip().startswith("ROOT ")), line)
                kind, shape = "reduce-scatter", root.split(" = ", 1)[1].split(" ", 1)[0]
            out[kind]["count"] += times[name]
            out[kind]["bytes"] += times[name] * _shape_bytes(shape)
    return out
