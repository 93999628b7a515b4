"""Decontamination: find training tasks that overlap held-out benchmark tasks.

Why: a training pool that contains (a copy or a close variant of) a Terminal-Bench task makes
every score on that benchmark meaningless, and generated tasks drift toward benchmark tasks
unnoticed. Three independent signals are checked, each against an index of the benchmark
built once, so the cost is linear in the total size of both pools:

- name: task ids (or ``[task] name``, or its last path part) equal after lowercasing and
  dropping every non-alphanumeric character;
- instruction: word 13-grams (lowercased, punctuation as word breaks, whitespace collapsed);
  score = distinct 13-grams shared / distinct 13-grams of the *training* instruction, flagged
  at >= 0.1. Instructions shorter than 13 words are flagged only if identical;
- tests: each test file, with comments, blank lines and whitespace runs removed, matched by
  exact hash or by Jaccard similarity of its 5-word shingles (flagged at >= 0.8). The runner
  script (tests/test.sh, run-tests.sh) is harness boilerplate shared across whole benchmarks,
  so it is compared only when it is a task's sole test file; files under 20 words, binary or
  over 1 MiB carry no evidence and are skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from t1jax.tasks.pool import find_task_dirs, load_pool

KINDS = ("name", "instruction", "tests")
RUNNERS = frozenset({"test.sh", "run-tests.sh"})
MIN_TEST_WORDS = 20
MAX_TEST_BYTES = 1 << 20
_WORD = re.compile(r"[^\W_]+")
_TRAILING_COMMENT = re.compile(r"\s+(?:#|//).*$")


@dataclass
class Overlap:
    train_task: str
    bench_task: str
    bench_dir: str
    kind: str  # "name" | "instruction" | "tests"
    score: float
    detail: str

    def __str__(self) -> str:
        return (f"train {self.train_task} ~ {self.bench_dir}/{self.bench_task}: "
                f"{self.kind} (score {self.score:.3f}) {self.detail}")


class ContaminationError(ValueError):
    """The training pool overlaps a held-out benchmark; the message lists every pair."""

    def __init__(self, overlaps):
        super().__init__(list(overlaps))  # full args keep it picklable
        self.overlaps = list(overlaps)

    def __str__(self) -> str:
        pairs = {(o.train_task, o.bench_dir, o.bench_task) for o in self.overlaps}
        return (f"training pool overlaps held-out benchmarks: {len(self.overlaps)} overlap(s) "
                f"in {len(pairs)} task pair(s):\n"
                + "\n".join(f"  - {' '.join(str(o).splitlines())}" for o in self.overlaps))


def normalize_id(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def instruction_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def normalize_code(text: str) -> str:
    """Drop comment lines, trailing ``#``/``//`` comments, blank lines; collapse whitespace."""
    lines = []
    for line in text.splitlines():
        line = _TRAILING_COMMENT.sub("", line).strip()
        if line and not line.startswith(("#", "//")):
            lines.append(" ".join(line.split()))
    return "\n".join(lines)


def _grams(words: list[str], n: int) -> frozenset:
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


@dataclass
class _Loose:
    """A benchmark task our loader rejects (docker-compose, missing files...): still checked."""

    task_id: str
    path: Path
    name: str | None
    instruction: str

    def test_files(self) -> dict[str, Path]:
        tests = self.path / "tests"
        files = {p.relative_to(tests).as_posix(): p for p in sorted(tests.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts} if tests.is_dir() else {}
        if (self.path / "run-tests.sh").is_file():
            files["run-tests.sh"] = self.path / "run-tests.sh"
        return files


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _load_loose(path: Path) -> _Loose:
    name, instruction = None, _read(path / "instruction.md")
    try:
        if (path / "task.toml").is_file():
            name = tomllib.loads(_read(path / "task.toml")).get("task", {}).get("name")
        elif (path / "task.yaml").is_file():
            instruction = (yaml.safe_load(_read(path / "task.yaml")) or {}).get("instruction")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, AttributeError):
        pass
    return _Loose(path.name, path, name if isinstance(name, str) else None,
                  instruction if isinstance(instruction, str) else "")


def load_benchmark(root: str | os.PathLike) -> list:
    """Every task under a benchmark root: valid ones via load_pool, the rest read leniently
    (a task we cannot run is still one we must not train on)."""
    tasks = list(load_pool(root, skip_invalid=True).tasks)
    loaded = {t.path for t in tasks}
    tasks += [_load_loose(d) for d in find_task_dirs(root) if d not in loaded]
    return sorted(tasks, key=lambda t: str(t.path))


@dataclass
class _Print:
    """What is compared of one task, computed once."""

    task_id: str
    keys: dict = field(default_factory=dict)  # normalised key -> the raw value it came from
    text: str = ""
    grams: frozenset = frozenset()
    files: list = field(default_factory=list)  # (rel, sha256, shingles)


def _fingerprint(task, ngram: int, shingle: int) -> _Print:
    p = _Print(task.task_id)
    raw = [(task.task_id, f"id {task.task_id}")]
    if getattr(task, "name", None):  # "org/task-name": the whole name and its last part
        label = f"name {task.name}"
        raw += [(task.name, label), (task.name.rsplit("/", 1)[-1], label)]
    for value, label in raw:
        if normalize_id(value):
            p.keys.setdefault(normalize_id(value), label)
    words = instruction_words(task.instruction or "")
    p.text, p.grams = " ".join(words), _grams(words, ngram)
    files = task.test_files()
    if set(files) - RUNNERS:
        files = {rel: path for rel, path in files.items() if rel not in RUNNERS}
    for rel, path in files.items():
        try:
            if path.stat().st_size > MAX_TEST_BYTES:
                continue
        except OSError:
            continue
        code = normalize_code(_read(path))
        tokens = code.split()
        if len(tokens) >= MIN_TEST_WORDS:
            p.files.append((rel, hashlib.sha256(code.encode()).hexdigest(),
                            _grams(tokens, shingle)))
    return p


def _check_thresholds(ngram, instruction_threshold, tests_threshold, shingle):
    for label, v in (("instruction_threshold", instruction_threshold),
                     ("tests_threshold", tests_threshold)):
        if not 0 < v <= 1:
            raise ValueError(f"{label} must be in (0, 1], got {v!r}")
    for label, v in (("ngram", ngram), ("shingle", shingle)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {v!r}")


def find_overlaps(train_tasks, bench_tasks, *, ngram: int = 13,
                  instruction_threshold: float = 0.1, tests_threshold: float = 0.8,
                  shingle: int = 5, bench_dir: str | None = None) -> list[Overlap]:
    """Every (training task, benchmark task, kind) overlap, sorted. ``bench_dir`` labels the
    benchmark (default: each benchmark task's parent directory)."""
    _check_thresholds(ngram, instruction_threshold, tests_threshold, shingle)
    bench = list(bench_tasks)
    prints = [_fingerprint(t, ngram, shingle) for t in bench]
    by_key, by_text, by_gram = defaultdict(list), defaultdict(list), defaultdict(list)
    by_hash, by_shingle, bench_files = defaultdict(list), defaultdict(list), []
    for b, p in enumerate(prints):
        for key in p.keys:
            by_key[key].append(b)
        if p.text:
            by_text[p.text].append(b)
        for g in p.grams:
            by_gram[g].append(b)
        for rel, digest, shingles in p.files:
            f = len(bench_files)
            bench_files.append((b, rel, len(shingles)))
            by_hash[digest].append(f)
            for s in shingles:
                by_shingle[s].append(f)

    found: list[Overlap] = []
    for task in train_tasks:
        p = _fingerprint(task, ngram, shingle)

        def add(b: int, kind: str, score: float, detail: str) -> None:
            found.append(Overlap(p.task_id, bench[b].task_id,
                                 bench_dir or str(bench[b].path.parent), kind, score, detail))

        names: dict[int, list[str]] = defaultdict(list)
        for key, value in p.keys.items():
            for b in by_key.get(key, ()):
                names[b].append(f"{value} ~ {prints[b].keys[key]}")
        for b, why in names.items():
            add(b, "name", 1.0, "; ".join(dict.fromkeys(why)))

        if p.grams:
            shared: dict[int, int] = defaultdict(int)
            for g in p.grams:
                for b in by_gram.get(g, ()):
                    shared[b] += 1
            for b, n in shared.items():
                if n / len(p.grams) >= instruction_threshold:
                    add(b, "instruction", n / len(p.grams),
                        f"{n}/{len(p.grams)} distinct {ngram}-grams of the training "
                        "instruction appear in the benchmark instruction")
        elif p.text:
            for b in by_text.get(p.text, ()):
                add(b, "instruction", 1.0, f"identical short instruction ({len(p.text.split())}"
                    f" words < {ngram})")

        matches: dict[int, list[tuple[float, str]]] = defaultdict(list)
        for rel, digest, shingles in p.files:
            exact = set(by_hash.get(digest, ()))
            for f in exact:
                matches[bench_files[f][0]].append((1.0, f"{rel} = {bench_files[f][1]} (exact)"))
            common: dict[int, int] = defaultdict(int)
            for s in shingles:
                for f in by_shingle.get(s, ()):
                    common[f] += 1
            for f, n in common.items():
                sim = n / (len(shingles) + bench_files[f][2] - n)
                if f not in exact and sim >= tests_threshold:
                    matches[bench_files[f][0]].append(
                        (sim, f"{rel} ~ {bench_files[f][1]} (jaccard {sim:.3f})"))
        for b, hits in matches.items():
            add(b, "tests", max(s for s, _ in hits), "; ".join(d for _, d in sorted(hits)[::-1]))

    found.sort(key=lambda o: (o.train_task, o.bench_dir, o.bench_task, KINDS.index(o.kind)))
    return found


def check_pool(train_tasks, heldout_dirs, **thresholds) -> dict[str, int]:
    """Raise ContaminationError listing every overlap with any held-out benchmark; returns
    {benchmark dir: tasks checked}. A held-out dir with no tasks is an error, not a pass."""
    if isinstance(heldout_dirs, (str, os.PathLike)):
        heldout_dirs = [heldout_dirs]
    train_tasks, checked, overlaps = list(train_tasks), {}, []
    for d in heldout_dirs:
        bench = load_benchmark(d)
        if not bench:
            raise ValueError(f"held-out benchmark {d} contains no tasks; check the path")
        checked[str(d)] = len(bench)
        overlaps += find_overlaps(train_tasks, bench, bench_dir=str(d), **thresholds)
    if overlaps:
        raise ContaminationError(overlaps)
    return checked


def report_markdown(overlaps) -> str:
    overlaps = list(overlaps)
    pairs = {(o.train_task, o.bench_dir, o.bench_task) for o in overlaps}
    lines = ["# Decontamination report", ""]
    if not overlaps:
        return "\n".join(lines + ["No overlaps found.", ""])
    lines += [f"{len(overlaps)} overlap(s) in {len(pairs)} training/benchmark task pair(s).", "",
              "| train task | benchmark | benchmark task | kind | score | detail |",
              "|---|---|---|---|---|---|"]
    for o in overlaps:
        cells = (o.train_task, o.bench_dir, o.bench_task, o.kind, f"{o.score:.3f}", o.detail)
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"

