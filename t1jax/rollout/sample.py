"""A finished, verified rollout as the trainer consumes it, its on-disk form (.npz), and sets of
them on disk (a step's recorded rollouts, an SFT dataset).

Why: the rollout side and the trainer meet here; everything the loss needs (ids, mask, sampling
log-probs, routes for replay, reward) travels in one file with plain arrays, so a sample written
by one process (or machine) loads bit-identically in another, and both sides read and write the
sets through the same functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from t1jax.distributed import SharedArray


@dataclasses.dataclass
class Sample:
    tokens: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # int8 [T], 1 on sampled ids
    rollout_logprobs: np.ndarray  # float32 [T], 0 where the mask is 0
    routes: np.ndarray  # int32 [T, layers, k], -1 where the model never ran; in a multi-process
    #                   step, a SharedArray (read only by the processes whose rows hold it)
    reward: float  # the episode's scalar reward; see token_rewards
    metadata: dict  # task_id, attempt, turns, finish, weight_versions, verifier report
    # Where each chunk of the trial starts (a context split restarts the sequence: positions
    # restart and attention stays inside the chunk); [0] for a single sequence.
    chunk_starts: np.ndarray | None = None

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, np.int32)
        self.loss_mask = np.asarray(self.loss_mask, np.int8)
        self.rollout_logprobs = np.asarray(self.rollout_logprobs, np.float32)
        if not isinstance(self.routes, SharedArray):
            self.routes = np.asarray(self.routes, np.int32)
        self.reward = float(self.reward)
        n = len(self.tokens)
        if not (len(self.loss_mask) == len(self.rollout_logprobs) == len(self.routes) == n):
            raise ValueError(f"lengths differ: tokens {n}, loss_mask {len(self.loss_mask)}, "
                             f"logprobs {len(self.rollout_logprobs)}, routes {len(self.routes)}")
        starts = np.asarray([0] if self.chunk_starts is None else self.chunk_starts, np.int32)
        if len(starts) == 0 or starts[0] != 0 or (np.diff(starts) <= 0).any() or \
                (n and starts[-1] >= n):
            raise ValueError(f"chunk_starts {starts.tolist()} must start at 0 and increase "
                             f"strictly inside the {n} tokens")
        self.chunk_starts = starts

    @property
    def last_response_index(self) -> int:
        """Where the reward lands: the last sampled id (-1 when nothing was sampled)."""
        idx = np.flatnonzero(self.loss_mask)
        return int(idx[-1]) if len(idx) else -1

    def token_rewards(self) -> np.ndarray:
        """float32 [T]: zero except the reward on the last response token."""
        out = np.zeros(len(self.tokens), np.float32)
        if self.last_response_index >= 0:
            out[self.last_response_index] = self.reward
        return out

    def to_npz(self, path) -> None:
        np.savez(path, tokens=self.tokens, loss_mask=self.loss_mask,
                 rollout_logprobs=self.rollout_logprobs, routes=np.asarray(self.routes),
                 reward=np.float64(self.reward), chunk_starts=self.chunk_starts,
                 metadata=np.array(json.dumps(self.metadata, default=str)))

    @classmethod
    def from_npz(cls, path) -> "Sample":
        with np.load(path, allow_pickle=False) as data:
            return cls(tokens=data["tokens"], loss_mask=data["loss_mask"],
                       rollout_logprobs=data["rollout_logprobs"], routes=data["routes"],
                       reward=float(data["reward"]), metadata=json.loads(str(data["metadata"])),
                       chunk_starts=data["chunk_starts"] if "chunk_starts" in data else None)


def make_sample(trajectory, report, task_id: str, attempt: int, category: str = "") -> Sample:
    """Join a trajectory with its verifier report (None: the verifier failed, reward 0).
    category: the task's family, for per-family training metrics."""
    report_dict = report.to_dict() if report is not None else None
    if report_dict is not None:  # JSON-safe now, so the round trip is exact
        report_dict = json.loads(json.dumps(report_dict, default=str))
    meta = {"task_id": task_id, "attempt": int(attempt), "turns": trajectory.turns,
            "tool_calls": trajectory.tool_calls, "finish": trajectory.finish,
            "prompt_len": trajectory.prompt_len, "weight_versions": trajectory.weight_versions,
            "route_drift": trajectory.route_drift,
            "route_compared": int(getattr(trajectory, "route_compared", 0)),
            "verifier": report_dict,
            "compactions": int(getattr(trajectory, "compactions", 0)), "category": category}
    return Sample(tokens=trajectory.tokens, loss_mask=trajectory.loss_mask,
                  rollout_logprobs=trajectory.logprobs, routes=trajectory.routes,
                  reward=report.reward if report is not None else 0.0, metadata=meta,
                  chunk_starts=getattr(trajectory, "chunk_starts", None) or None)


def staleness(samples, version: int) -> dict:
    """How far behind the policy being trained (`version`, the loop's step) the trials' turns
    were sampled: one step under one-step-off, more for carried-over trials. Per turn (each
    generate call records its weight version); versions that are not step numbers (a recording
    made elsewhere) are left out. Kept apart from mismatch/*, which compares equal weights."""
    lags = [version - int(v) for s in samples for v in s.metadata.get("weight_versions") or []
            if str(v).lstrip("-").isdigit()]
    if not lags:
        return {}
    lags = np.array(lags)
    return {"staleness/version_lag_mean": float(lags.mean()),
            "staleness/version_lag_max": int(lags.max()),
            "staleness/stale_turn_frac": float(np.mean(lags > 0))}


# -- sets of samples on disk ---------------------------------------------------------------------
def sample_filename(sample: Sample) -> str:
    tid = sample.metadata.get("task_id")
    if not tid:
        raise ValueError("sample has no metadata['task_id']; cannot name its file")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(tid))
    return f"{safe}--attempt{int(sample.metadata.get('attempt', 0)):04d}.npz"


def save_samples(samples, directory) -> list[Path]:
    """Write each sample to `directory/<task_id>--attempt<NNNN>.npz` (atomically; an existing
    file of the same name is replaced). Returns the paths in input order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [sample_filename(s) for s in samples]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"samples share a (task_id, attempt): {dupes[:5]}")
    paths = []
    for s, name in zip(samples, names):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                s.to_npz(f)
            os.replace(tmp, directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        paths.append(directory / name)
    return paths


DATASET_COMPLETE = "COMPLETE"


def save_dataset(samples, directory, **info) -> None:
    """Replace `directory` with `samples` and, written last, a COMPLETE marker (with `info`):
    a run killed while saving leaves no marker, so its partial set is never trained on."""
    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    save_samples(samples, directory)
    mark_dataset_complete(directory, len(samples), **info)


def mark_dataset_complete(directory, samples: int, **info) -> None:
    """The COMPLETE marker of a set whose files are all written (by one or several
    processes: a multi-process step's each writes its own trials)."""
    (Path(directory) / DATASET_COMPLETE).write_text(json.dumps({"samples": samples, **info})
                                                    + "\n")


def dataset_complete(directory) -> bool:
    return (Path(directory) / DATASET_COMPLETE).is_file()


def load_samples(directory) -> list[Sample]:
    """Every *.npz sample in `directory`, sorted by file name (task id, then attempt)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no SFT sample directory at {directory}")
    out = []
    for path in sorted(directory.glob("*.npz")):
        try:
            out.append(Sample.from_npz(path))
        except Exception as err:  # noqa: BLE001 - name the bad file
            raise ValueError(f"{path}: not a readable Sample: {type(err).__name__}: {err}") \
                from err
    return out


def bucket_lengths(min_length: int, max_length: int) -> list[int]:
    """The lengths samples are padded to, one compiled program each: powers of two from
    min_length up to max_length (max_length always included). The trainer's rows and the
    engine's prefills use the same rule."""
    out, n = [], int(min_length)
    while n < max_length:
        out.append(n)
        n *= 2
    return out + [int(max_length)]
