"""Per-step training metrics: one JSON line per step in ``metrics.jsonl`` plus TensorBoard events.

Why both: the JSONL file is the record scripts and tests read back (plain text, no reader
library), TensorBoard is for watching a run. Why ``resume_step``: a run killed after logging
step 12 but checkpointed at step 10 replays steps 10-12 on resume; without truncation the file
would hold those steps twice. Opening with ``resume_step=10`` keeps only rows with step < 10
(and tells TensorBoard to purge its events from step 10 on), so a killed-and-resumed run has
exactly one row per step.

Values: ints stay ints, every other scalar (Python, numpy or a one-element jax array) is written
as a Python float. JSON has no NaN or infinity, so a non-finite value is written as ``null``
in metrics.jsonl (TensorBoard still receives the NaN/inf itself).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from pathlib import Path

import numpy as np

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_RESERVED = ("step", "time")


def read_metrics(workdir) -> list[dict]:
    """The rows of ``workdir/metrics.jsonl`` in file order ([] if there is none)."""
    return read_jsonl(Path(workdir) / METRICS_FILE)


def read_jsonl(path) -> list[dict]:
    """Rows (JSON objects) of a JSON-lines file, [] if it does not exist. A torn last line (a
    process killed mid-write) is skipped; a corrupt line elsewhere is an error naming it."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):
                break  # torn final write
            raise ValueError(f"{path}:{number}: not a JSON row: {err}") from err
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _as_number(name: str, value):
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (numbers.Integral, np.integer)):
        return int(value)
    try:
        array = np.asarray(value)
    except Exception as err:  # noqa: BLE001 - anything np.asarray refuses is not a scalar
        raise TypeError(f"metric {name!r}: {type(value).__name__} is not a scalar") from err
    if array.size != 1 or not (np.issubdtype(array.dtype, np.number)
                               or array.dtype == np.bool_):
        raise TypeError(f"metric {name!r} must be a numeric scalar, got shape {array.shape} "
                        f"dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        return int(array.reshape(()))
    return float(array.reshape(()))


class MetricWriter:
    """Writes ``{"step": n, "time": unix_seconds, **scalars}`` rows and TensorBoard scalars."""

    def __init__(self, workdir, *, resume_step: int | None = None, tensorboard: bool = True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / METRICS_FILE
        if resume_step is not None:
            if not isinstance(resume_step, (int, np.integer)) or resume_step < 0:
                raise ValueError(f"resume_step must be an integer >= 0, got {resume_step!r}")
            self._truncate(int(resume_step))
        elif self.path.exists() and self.path.stat().st_size and \
                not self.path.read_bytes().endswith(b"\n"):
            self._truncate(None)  # drop a torn last line so new rows start on a line of their own
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(logdir=str(self.workdir / TENSORBOARD_DIR),
                                     purge_step=resume_step)

    def _truncate(self, resume_step: int | None):
        """Rewrites metrics.jsonl keeping rows with step < resume_step (all, if None)."""
        if not self.path.exists():
            return
        rows = read_metrics(self.workdir)
        if resume_step is not None:
            rows = [r for r in rows if r.get("step", -1) < resume_step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)  # atomic: a kill here leaves the old or the new file

    def write(self, step: int, scalars: dict):
        if self._file is None:
            raise ValueError(f"MetricWriter for {self.path} is closed")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        row = {"step": int(step), "time": time.time()}
        values = {}
        for name, value in scalars.items():
            if not isinstance(name, str) or name in _RESERVED:
                raise ValueError(f"metric name {name!r} is not allowed (must be a str other "
                                 f"than {_RESERVED})")
            values[name] = _as_number(name, value)
            number = values[name]
            row[name] = number if isinstance(number, int) or math.isfinite(number) else None
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        if self._tb is not None:
            for name, number in values.items():
                self._tb.add_scalar(name, number, global_step=int(step), walltime=row["time"])

    def flush(self):
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self):
        if self._file is None:
            return
        self.flush()
        self._file.close()
        self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc):
        self.close()


def finite_or_none(value):
    """A finite float, or None (metrics write non-finite values as null)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def format_value(value, kind: str = "num") -> str:
    """A metric for tables: "–" when missing or non-finite; kind num | pct | int."""
    value = finite_or_none(value)
    if value is None:
        return "–"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
