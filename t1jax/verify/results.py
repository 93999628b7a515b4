"""Per-assertion verifier results, parsed from CTRF JSON, JUnit XML and reward files.

Why: the dense reward counts passing assertions, so every report format a verifier
may leave behind must reduce to the same list of named outcomes, and a malformed
report must fail loudly (naming the file) rather than silently score as zero.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.parsers import expat

STATUSES = ("passed", "failed", "error", "skipped")
MAX_MESSAGE_CHARS = 2000
MAX_REPORT_CHARS = 64 * 1024 * 1024  # a report larger than this is a runaway, not a result

# CTRF's five statuses onto ours: a pending test did not run; "other" is not a pass.
_CTRF_STATUS = {"passed": "passed", "failed": "failed", "skipped": "skipped",
                "pending": "skipped", "other": "error"}
# JUnit child element -> status, worst first: an error child wins over a failure child.
_JUNIT_CHILDREN = ("error", "failure", "skipped")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


class ResultsFormatError(ValueError):
    """A results file is malformed; the message names the file and the problem."""

    def __init__(self, source: str, message: str):
        super().__init__(f"invalid results file {source}: {message}")
        self.source, self.message = source, message


@dataclass(frozen=True)
class Assertion:
    name: str
    status: str
    message: str = ""
    duration_s: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def _check_size(text: str, source: str) -> None:
    if not isinstance(text, str):
        raise ResultsFormatError(source, f"expected text, got {type(text).__name__}")
    if len(text) > MAX_REPORT_CHARS:
        raise ResultsFormatError(source, f"report is {len(text)} chars, over {MAX_REPORT_CHARS}")


def _message(*parts) -> str:
    """Join the non-empty parts and keep the head: the cause is at the top."""
    text = "\n".join(str(p).strip() for p in parts if p is not None and str(p).strip())
    return text[:MAX_MESSAGE_CHARS]


def _dedupe(assertions: list[Assertion]) -> list[Assertion]:
    """Suffix repeated names with " [2]", " [3]"... so each outcome is counted once."""
    taken: set[str] = set()
    last: dict[str, int] = {}
    out = []
    for a in assertions:
        name, k = a.name, last.get(a.name, 1)
        while name in taken:
            k += 1
            name = f"{a.name} [{k}]"
        last[a.name] = k
        taken.add(name)
        out.append(a if name == a.name else Assertion(name, a.status, a.message, a.duration_s))
    return out


def _duration(value, scale: float, where: str, source: str) -> float:
    if value is None or value == "":
        return 0.0
    if isinstance(value, bool):
        raise ResultsFormatError(source, f"{where}: duration is a boolean")
    try:
        seconds = float(value) * scale
    except (TypeError, ValueError):
        raise ResultsFormatError(source, f"{where}: duration {value!r} is not a number") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ResultsFormatError(source, f"{where}: duration {value!r} is not a finite non-negative number")
    return seconds


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _load_json(text: str, source: str):
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:  # JSONDecodeError is a ValueError
        raise ResultsFormatError(source, f"not valid JSON: {e}") from None


def parse_ctrf(text: str, source: str) -> list[Assertion]:
    """CTRF JSON (pytest-json-ctrf in Terminal-Bench 2); durations are in milliseconds."""
    _check_size(text, source)
    doc = _load_json(text, source)
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, dict):
        raise ResultsFormatError(source, 'expected an object with a "results" object')
    tests = results.get("tests")
    if not isinstance(tests, list):
        raise ResultsFormatError(source, '"results.tests" must be a list')
    out = []
    for i, test in enumerate(tests):
        where = f"results.tests[{i}]"
        if not isinstance(test, dict):
            raise ResultsFormatError(source, f"{where} is not an object")
        name = test.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ResultsFormatError(source, f"{where}: missing or empty name")
        raw = test.get("status")
        if raw not in _CTRF_STATUS:
            raise ResultsFormatError(source, f"{where} ({name}): unknown status {raw!r}, "
                                     f"expected one of {sorted(_CTRF_STATUS)}")
        duration = _duration(test.get("duration"), 1e-3, f"{where} ({name})", source)
        out.append(Assertion(name, _CTRF_STATUS[raw],
                             _message(test.get("message"), test.get("trace")), duration))
    return _dedupe(out)


class _DtdRefused(Exception):
    pass


def _refuse_dtd(*_):
    raise _DtdRefused


def _junit_root(text: str, source: str) -> ET.Element:
    # Refuse DTDs outright: entity expansion (billion laughs) happens inside the parser.
    # A guard pass stops at the DOCTYPE itself, before any entity is declared; a text
    # search would also trip on "<!DOCTYPE html>" in a CDATA block of captured output.
    guard = expat.ParserCreate()
    guard.StartDoctypeDeclHandler = guard.EntityDeclHandler = _refuse_dtd
    try:
        guard.Parse(text, True)
        return ET.fromstring(text)
    except _DtdRefused:
        raise ResultsFormatError(source, "DOCTYPE/ENTITY declarations are not allowed") from None
    except (expat.ExpatError, ET.ParseError) as e:
        raise ResultsFormatError(source, f"not valid XML: {e}") from None


def parse_junit(text: str, source: str) -> list[Assertion]:
    """JUnit XML (pytest --junitxml and most other runners)."""
    _check_size(text, source)
    root = _junit_root(text, source)
    if root.tag not in ("testsuites", "testsuite"):
        raise ResultsFormatError(source, f"root element is <{root.tag}>, "
                                 "expected <testsuites> or <testsuite>")
    out = []
    for i, case in enumerate(root.iter("testcase")):
        name = (case.get("name") or "").strip()
        if not name:
            raise ResultsFormatError(source, f"testcase #{i + 1}: missing or empty name")
        classname = (case.get("classname") or "").strip()
        full = f"{classname}::{name}" if classname else name
        duration = _duration(case.get("time"), 1.0, f"testcase {full}", source)
        status, message = "passed", ""
        for tag in _JUNIT_CHILDREN:
            child = case.find(tag)
            if child is not None:
                status = "failed" if tag == "failure" else tag
                message = _message(child.get("message"), child.text)
                break
        out.append(Assertion(full, status, message, duration))
    return _dedupe(out)


def _finite(value, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultsFormatError(source, f"reward {value!r} is not a number")
    if not math.isfinite(value):
        raise ResultsFormatError(source, f"reward {value!r} is not finite")
    return float(value)


def parse_binary_reward(text: str, source: str) -> float:
    """reward.txt (a bare number) or reward.json ({"reward": x} or a bare number)."""
    _check_size(text, source)
    stripped = text.strip()
    if not stripped:
        raise ResultsFormatError(source, "reward file is empty")
    if _NUMBER.fullmatch(stripped):
        return _finite(float(stripped), source)
    if not (source.endswith(".json") or stripped.startswith("{")):
        raise ResultsFormatError(source, f"reward {stripped[:80]!r} is not a number")
    doc = _load_json(stripped, source)
    if isinstance(doc, dict):
        if "reward" not in doc:
            raise ResultsFormatError(source, f'no "reward" key (keys: {sorted(doc)[:10]})')
        doc = doc["reward"]
    return _finite(doc, source)


# pytest -rA "short test summary info" lines; Terminal-Bench 1 graded a run from this stdout.
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$", re.M)
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S+)(?:\s+-\s+(.*))?$")
_SUMMARY_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                   "XFAIL": "skipped", "XPASS": "passed"}


def parse_pytest_summary(text: str, source: str) -> list[Assertion]:
    """Assertions from the short test summary of `pytest -rA` output (empty if there is none).
    Skipped tests are listed there without a test id, so they are not counted."""
    _check_size(text, source)
    headers = list(_SUMMARY_HEADER.finditer(text))
    if not headers:
        return []
    assertions = []
    for line in text[headers[-1].end():].splitlines():
        match = _SUMMARY_LINE.match(line.strip())
        if match:
            status, name, message = match.groups()
            assertions.append(Assertion(name, _SUMMARY_STATUS[status], _message(message or "")))
    return _dedupe(assertions)
