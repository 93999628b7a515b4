"""Where the suite's time goes (a per-file table, written as the run goes, and a guard), and
the order that makes two workers finish together.

Each finished test's time (set-up + call + tear-down, so shared fixtures are charged to the first
test that builds them) is appended to `.pytest_cache/t1jax/test-times.jsonl` as it happens (tail
it to watch a long run), and at the end `test-times.md` ranks the files by time with their
share of the wall clock. The terminal summary prints the top files and warns when the suite ran
past WARN_AFTER_S: CI's limit is 90 minutes and the suite's target is 30. `file-costs.json`
beside them holds each file's seconds: copy it over tests/file_costs.json after a full run.

Files run most expensive first (by tests/file_costs.json; unknown files count as cheap): with
scripts/test.sh's one-file-at-a-time xdist scheduling, that is longest-processing-time-first, so
the long files start at once and the short ones fill in around them.
"""

import json
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

WARN_AFTER_S = 45 * 60
TOP_FILES = 15
COSTS = Path(__file__).with_name("file_costs.json")


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    costs = json.loads(COSTS.read_text()) if COSTS.exists() else {}
    first = {}
    for i, item in enumerate(items):
        first.setdefault(file_of(item.nodeid), i)
    # stable: a file's tests keep their order (and their module fixtures' set-up order)
    items.sort(key=lambda item: (-costs.get(file_of(item.nodeid), 0.0),
                                 first[file_of(item.nodeid)]))


class SuiteTiming:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.stream = (out_dir / "test-times.jsonl").open("w")
        self.start = time.time()
        self.write_error = ""
        # free disk where the suite writes, at the start and at its lowest (after which test):
        # CI machines differ in disk, and a full one fails whatever test is writing then
        self.free_start = self.free_low = shutil.disk_usage(out_dir).free
        self.free_low_after = ""
        self.per_test: dict[str, float] = defaultdict(float)
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        self.per_test[report.nodeid] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcome.setdefault(report.nodeid, report.outcome)
        if report.when == "teardown":
            free = shutil.disk_usage(self.out_dir).free
            if free < self.free_low:
                self.free_low, self.free_low_after = free, report.nodeid
        if report.when == "teardown" and self.stream is not None:
            try:
                self.stream.write(json.dumps({
                    "test": report.nodeid, "seconds": round(self.per_test[report.nodeid], 3),
                    "outcome": self.outcome.get(report.nodeid, "passed"),
                    "wall": round(time.time() - self.start, 1)}) + "\n")
                self.stream.flush()
            except OSError as err:  # a full disk: the suite's own verdicts matter more
                self.stream = None
                self.write_error = f"stopped writing {self.out_dir}/test-times.jsonl: {err}"

    def table(self) -> tuple[list[tuple[str, float, int]], float]:
        files: dict[str, list[float]] = defaultdict(list)
        for nodeid, seconds in self.per_test.items():
            files[file_of(nodeid)].append(seconds)
        rows = sorted(((f, sum(t), len(t)) for f, t in files.items()), key=lambda r: -r[1])
        return rows, time.time() - self.start

    def pytest_terminal_summary(self, terminalreporter):
        rows, wall = self.table()
        lines = [f"| file | seconds | tests | share of {wall:.0f} s wall |", "|---|---|---|---|"]
        lines += [f"| {f} | {s:.1f} | {n} | {100 * s / max(wall, 1e-9):.1f}% |"
                  for f, s, n in rows]
        tr = terminalreporter
        try:
            (self.out_dir / "test-times.md").write_text("\n".join(lines) + "\n")
            (self.out_dir / "file-costs.json").write_text(json.dumps(
                {f: round(s, 1) for f, s, _ in rows}, indent=1) + "\n")
        except OSError as err:
            self.write_error = self.write_error or f"could not write {self.out_dir}: {err}"
        if self.write_error:
            tr.write_line(f"WARNING: {self.write_error}", yellow=True)
        tr.section(f"time per test file (top {TOP_FILES}; all in {self.out_dir}/test-times.md)")
        for line in lines[:TOP_FILES + 2]:
            tr.write_line(line)
        tr.write_line(f"pytest wall time: {wall:.0f} s ({wall / 60:.1f} min)")
        tr.write_line(f"disk free: {self.free_start / 2**30:.1f} GiB at the start, lowest "
                      f"{self.free_low / 2**30:.1f} GiB" + (f" (after {self.free_low_after})"
                                                            if self.free_low_after else ""))
        if wall > WARN_AFTER_S:
            tr.write_line(f"WARNING: the suite took {wall / 60:.1f} min, past the "
                          f"{WARN_AFTER_S // 60}-minute guard (target 30, CI's limit 90): find "
                          "the new cost in the table above before it grows further", red=True)

    def pytest_unconfigure(self, config):
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass


def pytest_configure(config):
    if hasattr(config, "workerinput") or config.option.collectonly:
        return  # an xdist worker (the controller keeps the table), or nothing will run
    out_dir = Path(os.environ.get("T1JAX_TEST_TIMES_DIR")
                   or Path(config.rootpath) / ".pytest_cache" / "t1jax")
    config.pluginmanager.register(SuiteTiming(out_dir), "t1jax_suite_timing")
